// The CUDA model path against the CPU reference, for every family's tiny
// preset: a ragged prefill into shuffled slots, then greedy decode steps of
// two batch sizes. Decode steps replayed from recorded CUDA graphs must match
// the same steps run op by op (to rounding), kExact must match the CPU at
// fp32 tolerance and kFast on bf16 weights (bf16 tensor cores), loaded as
// `lair serve` loads them (norm weights folded into the products), at the
// bf16 one; GLA's fused low-rank gate at a batch whose step does not form
// the gate. Skips without a GPU.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "models/init.h"
#include "models/model.h"
#include "models/state_pool.h"
#include "tests/support/model_runner.h"

namespace lair::models {
namespace {

constexpr double kRoundingTol = 1e-6;
constexpr double kF32Tol = 1e-4;
constexpr double kBf16Tol = 3e-2;

using Runner = testing::ModelRunner;

// The model in `dir` on `device`, multiplying as `gemm`, loaded with
// `options` (64 tokens of context) and a pool of `slots`.
Runner LoadOn(const std::string& dir, const std::string& device, kernels::GemmMode gemm,
              LoadOptions options, int slots = 4) {
  kernels::BackendOptions backend_options;
  backend_options.gemm = gemm;
  options.max_context = 64;
  return testing::LoadRunner(dir, device, backend_options, options, slots);
}

class CudaStepTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!kernels::MakeBackend("cuda").ok()) GTEST_SKIP() << "no CUDA device";
    dir_ =
        (std::filesystem::path(::testing::TempDir()) / ("lair_cuda_step_" + GetParam())).string();
    InitOptions options;
    options.family = GetParam();
    options.preset = "tiny";
    options.seed = 11;
    ASSERT_TRUE(InitModel(options, dir_).ok());
  }

  Runner Make(const std::string& device, kernels::GemmMode gemm, bool graphs,
              DType weights = DType::kF32, bool fold_norms = false) {
    LoadOptions options;
    options.step_graphs = graphs;
    options.weight_dtype = weights;
    options.fold_norm_weights = fold_norms;
    return LoadOn(dir_, device, gemm, options);
  }

  std::string dir_;
};

TEST_P(CudaStepTest, GraphReplayMatchesEagerAndCpu) {
  Runner cpu = Make("cpu", kernels::GemmMode::kExact, false);
  Runner eager = Make("cuda", kernels::GemmMode::kExact, false);
  Runner graphs = Make("cuda", kernels::GemmMode::kExact, true);
  Runner fast = Make("cuda", kernels::GemmMode::kFast, true, DType::kBF16, /*fold_norms=*/true);
  Runner* all[] = {&cpu, &eager, &graphs, &fast};

  // Ragged prompts into slots 2, 0, 1.
  ForwardBatch prefill;
  prefill.tokens = {3, 17, 250, 9, 400, 1, 2, 3, 77, 88, 99, 11, 12, 13, 14};
  prefill.cu_seqlens = {0, 5, 8, 15};
  prefill.slots = {2, 0, 1};
  prefill.start_positions = {0, 0, 0};
  std::vector<Tensor> first;
  for (Runner* r : all) first.push_back(r->Forward(prefill));
  ASSERT_TRUE(first[0].defined());
  EXPECT_LE(RelativeError(first[1], first[0]), kF32Tol);
  EXPECT_LE(RelativeError(first[3], first[0]), kBf16Tol);

  // Decode: 5 steps of all three sequences, then 3 of slot 0 alone. The
  // tokens fed back are the CPU's greedy ones, so every runner sees the same.
  ForwardBatch step;
  step.cu_seqlens = {0, 1, 2, 3};
  step.slots = {2, 0, 1};
  step.start_positions = {5, 3, 7};
  step.tokens = RowArgmax(first[0]);
  for (int i = 0; i < 8; ++i) {
    if (i == 5) {
      step.cu_seqlens = {0, 1};
      step.slots = {0};
      step.start_positions = {step.start_positions[1]};
      step.tokens = {step.tokens[1]};
    }
    const std::string what = "step " + std::to_string(i);
    const Tensor want = cpu.Forward(step);
    const Tensor op_by_op = eager.Forward(step);
    // The recording runner samples on the device; its logits are compared
    // through a second model run op by op on the same inputs.
    auto ids = graphs.model->ForwardGreedy(step, *graphs.pool);
    ASSERT_TRUE(ids.ok()) << ids.status() << " " << what;
    const Tensor fast_logits = fast.Forward(step);
    EXPECT_LE(RelativeError(op_by_op, want), kF32Tol) << what;
    EXPECT_LE(RelativeError(fast_logits, want), kBf16Tol) << what;
    EXPECT_EQ(*ids, RowArgmax(op_by_op)) << what;
    step.tokens = RowArgmax(want);
    for (int32_t& p : step.start_positions) ++p;
  }
  // Both batch sizes recur after their first (op by op) step, so both replay.
  EXPECT_EQ(graphs.model->recorded_step_graphs(), 2);
  EXPECT_EQ(fast.model->recorded_step_graphs(), 2);
  EXPECT_EQ(eager.model->recorded_step_graphs(), 0);

  // The states the replays left equal those of the op-by-op steps.
  for (int i = 0; i < static_cast<int>(eager.pool->layout().tensors.size()); ++i) {
    auto a = eager.backend->Download(eager.pool->tensor(i));
    auto b = graphs.backend->Download(graphs.pool->tensor(i));
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_LE(RelativeError(b->ToF32(), a->ToF32()), kRoundingTol)
        << eager.pool->layout().tensors[i].name;
  }
}

// A decode step that draws some rows on the device hands the host the
// others' logits, gathered where they are: equal to those rows of the same
// step's whole logits.
TEST_P(CudaStepTest, SampledStepHandsTheHostItsRowsLogits) {
  Runner whole = Make("cuda", kernels::GemmMode::kExact, false);
  Runner sampled = Make("cuda", kernels::GemmMode::kExact, false);
  ForwardBatch prefill;
  prefill.tokens = {3, 17, 250, 9, 400, 1, 2, 3};
  prefill.cu_seqlens = {0, 3, 5, 8};
  prefill.slots = {0, 1, 2};
  prefill.start_positions = {0, 0, 0};
  const Tensor first = whole.Forward(prefill);
  ASSERT_TRUE(sampled.Forward(prefill).defined());
  ForwardBatch step;
  step.cu_seqlens = {0, 1, 2, 3};
  step.slots = {0, 1, 2};
  step.start_positions = {3, 2, 3};
  step.tokens = RowArgmax(first);
  const Tensor want = whole.Forward(step);
  const kernels::RowSampling greedy;
  const kernels::RowSampling rows[] = {greedy, greedy, greedy};
  const int32_t host_rows[] = {0, 2};
  auto got = sampled.model->ForwardSample(step, *sampled.pool, rows, host_rows);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(want.defined());
  EXPECT_EQ(got->tokens[1], RowArgmax(want)[1]);
  ASSERT_EQ(got->host_logits.shape(), (Shape{2, want.dim(1)}));
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(
        RelativeError(got->host_logits.Rows(i, i + 1), want.Rows(host_rows[i], host_rows[i] + 1)),
        0.0)
        << "host row " << host_rows[i];
  }
}

// A prefill of more rows than the decode kernels take runs kFast's cuBLASLt
// path: input norms and SwiGLU formed in bf16, q, k, v kept in bf16 for the
// mixers that take them. It and the step after it match the CPU.
TEST_P(CudaStepTest, LongPrefillOnTheFastPathMatchesCpu) {
  Runner cpu = Make("cpu", kernels::GemmMode::kExact, false);
  Runner fast = Make("cuda", kernels::GemmMode::kFast, false, DType::kBF16, /*fold_norms=*/true);
  ForwardBatch prefill;
  for (int32_t i = 0; i < 54; ++i) prefill.tokens.push_back((i * 37 + 5) % 400);
  prefill.cu_seqlens = {0, 30, 54};
  prefill.slots = {1, 3};
  prefill.start_positions = {0, 0};
  const Tensor want = cpu.Forward(prefill);
  ASSERT_TRUE(want.defined());
  EXPECT_LE(RelativeError(fast.Forward(prefill), want), kBf16Tol) << "prefill";
  ForwardBatch step;
  step.cu_seqlens = {0, 1, 2};
  step.slots = {1, 3};
  step.start_positions = {30, 24};
  step.tokens = RowArgmax(want);
  EXPECT_LE(RelativeError(fast.Forward(step), cpu.Forward(step)), kBf16Tol) << "step";
}

TEST_P(CudaStepTest, ReplayedLogitsMatchOpByOp) {
  Runner eager = Make("cuda", kernels::GemmMode::kExact, false);
  Runner graphs = Make("cuda", kernels::GemmMode::kExact, true);
  ForwardBatch prefill;
  prefill.tokens = {5, 6, 7, 8, 9, 10};
  prefill.cu_seqlens = {0, 2, 6};
  prefill.slots = {3, 1};
  prefill.start_positions = {0, 0};
  eager.Forward(prefill);
  graphs.Forward(prefill);
  ForwardBatch step;
  step.cu_seqlens = {0, 1, 2};
  step.slots = {3, 1};
  step.start_positions = {2, 4};
  for (int i = 0; i < 4; ++i) {
    step.tokens = {static_cast<int32_t>(20 + i), static_cast<int32_t>(300 - i)};
    const Tensor a = eager.Forward(step);
    const Tensor b = graphs.Forward(step);
    EXPECT_LE(RelativeError(b, a), kRoundingTol) << "step " << i;
    for (int32_t& p : step.start_positions) ++p;
  }
  EXPECT_EQ(graphs.model->recorded_step_graphs(), 1);
}

// GLA at GLA 1.3B's head shape (dk 256, dv 512; two layers): decode steps of
// 20 sequences stage their state rows on GPUs of up to 160 SMs, so the step
// does not form the low-rank gate, and the input products (the ring
// kernel's rows) form it through the fused weight (LoadOptions::
// fuse_low_rank_gates); steps of 4 sequences hold their rows and form it
// themselves. Loaded as `lair serve` loads it, against the CPU, and against
// the same load without the fused weight.
TEST(CudaFusedGateTest, DecodeStepsMatchCpu) {
  if (!kernels::MakeBackend("cuda").ok()) GTEST_SKIP() << "no CUDA device";
  const std::string dir =
      (std::filesystem::path(::testing::TempDir()) / "lair_cuda_fused_gate").string();
  InitOptions init;
  init.family = "gla";
  init.preset = "tiny";
  init.seed = 5;
  init.overrides = {{"hidden_size", "1024"}};
  ASSERT_TRUE(InitModel(init, dir).ok());
  constexpr int kSeqs = 20;
  const auto make = [&](const std::string& device, kernels::GemmMode gemm, DType weights,
                        bool serving, bool fuse) {
    LoadOptions options;
    options.weight_dtype = weights;
    options.fold_norm_weights = serving;
    options.fuse_low_rank_gates = fuse;
    return LoadOn(dir, device, gemm, options, kSeqs);
  };
  Runner cpu = make("cpu", kernels::GemmMode::kExact, DType::kF32, false, false);
  Runner fused = make("cuda", kernels::GemmMode::kFast, DType::kBF16, true, true);
  Runner kept = make("cuda", kernels::GemmMode::kFast, DType::kBF16, true, false);
  Runner* all[] = {&cpu, &fused, &kept};

  // Prompts of 3 tokens into every slot, then steps of all 20 sequences and
  // of the first 4.
  ForwardBatch prefill;
  for (int s = 0; s < kSeqs; ++s) {
    for (int t = 0; t < 3; ++t) prefill.tokens.push_back((s * 31 + t * 7 + 1) % 512);
    prefill.cu_seqlens.push_back(3 * s);
    prefill.slots.push_back(s);
    prefill.start_positions.push_back(0);
  }
  prefill.cu_seqlens.push_back(3 * kSeqs);
  std::vector<Tensor> first;
  for (Runner* r : all) first.push_back(r->Forward(prefill));
  ASSERT_TRUE(first[0].defined());
  EXPECT_LE(RelativeError(first[1], first[0]), kBf16Tol) << "prefill";
  ForwardBatch step;
  step.tokens = RowArgmax(first[0]);
  for (int s = 0; s <= kSeqs; ++s) step.cu_seqlens.push_back(s);
  for (int s = 0; s < kSeqs; ++s) {
    step.slots.push_back(s);
    step.start_positions.push_back(3);
  }
  for (int i = 0; i < 6; ++i) {
    if (i == 3) {
      step.cu_seqlens.resize(5);
      step.slots.resize(4);
      step.start_positions.resize(4);
      step.tokens.resize(4);
    }
    const std::string what =
        "step " + std::to_string(i) + " of " + std::to_string(step.slots.size()) + " sequences";
    const Tensor want = cpu.Forward(step);
    EXPECT_LE(RelativeError(fused.Forward(step), want), kBf16Tol) << what;
    EXPECT_LE(RelativeError(kept.Forward(step), want), kBf16Tol) << what;
    step.tokens = RowArgmax(want);
    for (int32_t& p : step.start_positions) ++p;
  }
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, CudaStepTest,
                         ::testing::Values("gla", "gsa", "linear_attn", "retnet", "hgrn2", "mamba2",
                                           "xlstm", "llama"));

}  // namespace
}  // namespace lair::models
