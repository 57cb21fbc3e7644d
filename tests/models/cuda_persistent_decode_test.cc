// The persistent decode kernel (LoadOptions::persistent_decode) against the
// CPU reference and the step graphs, on GLA models of the shapes it takes:
// one-sequence decode steps after a prefill, with the norms folded into the
// products or not (their weights made non-trivial here, so both forms
// count), then a two-sequence step on the step graphs that continues the
// states the kernel left. A model outside its shapes (the tiny preset) falls
// back to the step graphs. Skips without a GPU of compute capability 9.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/safetensors.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "models/init.h"
#include "models/model.h"
#include "models/state_pool.h"
#include "tests/support/model_runner.h"

#ifdef LAIR_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace lair::models {
namespace {

constexpr double kBf16Tol = 3e-2;

bool HasHopper() {
#ifdef LAIR_HAVE_CUDA
  int major = 0;
  return kernels::MakeBackend("cuda").ok() &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess &&
         major >= 9;
#else
  return false;
#endif
}

using Runner = testing::ModelRunner;

Runner Make(const std::string& dir, const std::string& device, bool fast, bool fold,
            bool persistent) {
  kernels::BackendOptions backend_options;
  backend_options.gemm = fast ? kernels::GemmMode::kFast : kernels::GemmMode::kExact;
  LoadOptions options;
  options.weight_dtype = fast ? DType::kBF16 : DType::kF32;
  options.fold_norm_weights = fold;
  options.persistent_decode = persistent;
  return testing::LoadRunner(dir, device, backend_options, options);
}

// Gives every norm weight of the checkpoint in `dir` values around 1 (init
// writes ones, which folding would leave unchanged).
void PerturbNorms(const std::string& dir) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  {
    auto checkpoint = Checkpoint::Open(dir);
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    for (const std::string& name : checkpoint->Names()) {
      auto t = checkpoint->Get(name);
      ASSERT_TRUE(t.ok()) << t.status();
      Tensor copy = Tensor::Zeros(t->dtype(), t->shape());
      std::memcpy(copy.raw(), t->raw(), t->nbytes());
      if (name.find("norm") != std::string::npos && copy.dtype() == DType::kF32) {
        for (int64_t i = 0; i < copy.numel(); ++i)
          copy.f32()[i] = 1.0f + 0.4f * std::sin(0.7f * static_cast<float>(i) + name.size());
      }
      tensors.emplace_back(name, std::move(copy));
    }
  }
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
}

struct Shape {
  std::string name;
  std::vector<std::pair<std::string, std::string>> overrides;
};

class PersistentDecodeTest : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    if (!HasHopper()) GTEST_SKIP() << "no CUDA device of compute capability 9";
    dir_ = (std::filesystem::path(::testing::TempDir()) / ("lair_persistent_" + GetParam().name))
               .string();
    InitOptions options;
    options.family = "gla";
    options.preset = "tiny";
    options.overrides = GetParam().overrides;
    options.seed = 5;
    ASSERT_TRUE(InitModel(options, dir_).ok());
    PerturbNorms(dir_);
  }
  std::string dir_;
};

TEST_P(PersistentDecodeTest, MatchesCpuAndStepGraphs) {
  Runner cpu = Make(dir_, "cpu", false, false, false);
  Runner graphs = Make(dir_, "cuda", true, true, false);
  Runner folded = Make(dir_, "cuda", true, true, true);
  Runner unfolded = Make(dir_, "cuda", true, false, true);
  Runner twin = Make(dir_, "cuda", true, true, true);  // folded's logits where it samples
  Runner* all[] = {&cpu, &graphs, &folded, &unfolded, &twin};

  ForwardBatch prefill;
  prefill.tokens = {3, 17, 250, 9, 400, 1, 2, 3, 77, 88, 99, 11, 12};
  prefill.cu_seqlens = {0, 9, 13};
  prefill.slots = {2, 0};
  prefill.start_positions = {0, 0};
  Tensor want;
  for (Runner* r : all) {
    const Tensor got = r->Forward(prefill);
    if (r == &cpu) want = got;
  }
  ASSERT_TRUE(want.defined());

  // Six steps of slot 2 alone (the kernel), fed the CPU's greedy tokens.
  ForwardBatch step;
  step.cu_seqlens = {0, 1};
  step.slots = {2};
  step.start_positions = {9};
  step.tokens = {RowArgmax(want)[0]};
  for (int i = 0; i < 6; ++i) {
    const std::string what = "step " + std::to_string(i);
    want = cpu.Forward(step);
    const Tensor by_graphs = graphs.Forward(step);
    const Tensor by_folded = folded.Forward(step);
    const Tensor by_unfolded = unfolded.Forward(step);
    twin.Forward(step);
    EXPECT_LE(RelativeError(by_folded, want), kBf16Tol) << what;
    EXPECT_LE(RelativeError(by_unfolded, want), kBf16Tol) << what;
    EXPECT_LE(RelativeError(by_folded, by_graphs), kBf16Tol) << what;
    step.tokens = RowArgmax(want);
    ++step.start_positions[0];
  }
  EXPECT_EQ(folded.model->persistent_decode_steps(), 6) << folded.model->persistent_decode_status();
  EXPECT_EQ(unfolded.model->persistent_decode_steps(), 6)
      << unfolded.model->persistent_decode_status();
  EXPECT_EQ(graphs.model->persistent_decode_steps(), 0);

  // Greedy ids are the kernel's own argmax of its logits (the twin's, but
  // for the order of fp32 sums): equal unless the top two nearly tie.
  auto ids = folded.model->ForwardGreedy(step, *folded.pool);
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(ids->size(), 1u);
  const Tensor kernel_logits = twin.Forward(step);
  std::vector<float> sorted(kernel_logits.f32(), kernel_logits.f32() + kernel_logits.numel());
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  if (sorted[0] - sorted[1] > 1e-3f * std::abs(sorted[0])) {
    EXPECT_EQ((*ids)[0], RowArgmax(kernel_logits)[0]);
  }
  want = cpu.Forward(step);
  graphs.Forward(step);
  unfolded.Forward(step);
  ++step.start_positions[0];

  // Two sequences: the step graphs continue the kernel's states.
  ForwardBatch both;
  both.cu_seqlens = {0, 1, 2};
  both.slots = {2, 0};
  both.start_positions = {step.start_positions[0], 4};
  both.tokens = {RowArgmax(want)[0], 5};
  want = cpu.Forward(both);
  EXPECT_LE(RelativeError(folded.Forward(both), want), kBf16Tol) << "two sequences";
  EXPECT_LE(RelativeError(unfolded.Forward(both), want), kBf16Tol) << "two sequences";
  EXPECT_EQ(folded.model->persistent_decode_steps(), 7);
}

INSTANTIATE_TEST_SUITE_P(GlaShapes, PersistentDecodeTest,
                         ::testing::Values(Shape{"one_head",
                                                 {{"hidden_size", "256"},
                                                  {"num_heads", "1"},
                                                  {"expand_k", "1"},
                                                  {"expand_v", "1"},
                                                  {"intermediate_size", "512"},
                                                  {"vocab_size", "512"},
                                                  {"num_hidden_layers", "2"}}},
                                           // GLA 1.3B's layer (4 heads of 256 keys and 512 values,
                                           // 5,632 MLP columns, 32,000 tokens), two of them.
                                           Shape{"gla_1_3b_layers",
                                                 {{"hidden_size", "2048"},
                                                  {"num_heads", "4"},
                                                  {"expand_k", "0.5"},
                                                  {"expand_v", "1"},
                                                  {"vocab_size", "32000"},
                                                  {"num_hidden_layers", "2"}}}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return info.param.name;
                         });

// The tiny preset's 16-key heads are outside the kernel's shapes: the
// one-sequence steps stay on the step graphs and still match the CPU.
TEST(PersistentDecodeFallback, TinyGlaRunsOnStepGraphs) {
  if (!kernels::MakeBackend("cuda").ok()) GTEST_SKIP() << "no CUDA device";
  const std::string dir =
      (std::filesystem::path(::testing::TempDir()) / "lair_persistent_tiny").string();
  InitOptions options;
  options.family = "gla";
  options.preset = "tiny";
  ASSERT_TRUE(InitModel(options, dir).ok());
  Runner cpu = Make(dir, "cpu", false, false, false);
  Runner fast = Make(dir, "cuda", true, true, true);
  ForwardBatch step;
  step.tokens = {7};
  step.cu_seqlens = {0, 1};
  step.slots = {1};
  step.start_positions = {0};
  for (int i = 0; i < 3; ++i) {
    EXPECT_LE(RelativeError(fast.Forward(step), cpu.Forward(step)), kBf16Tol) << i;
    ++step.start_positions[0];
  }
  EXPECT_EQ(fast.model->persistent_decode_steps(), 0);
  EXPECT_TRUE(absl::IsUnimplemented(fast.model->persistent_decode_status()))
      << fast.model->persistent_decode_status();
}

}  // namespace
}  // namespace lair::models
