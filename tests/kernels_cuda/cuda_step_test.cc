// The CUDA backend's step machinery: GEMMs and linear groups on bf16
// weights in both precisions (kFast: bf16 tensor cores, at a bf16 tolerance,
// and exactly on bf16-rounded activations) against the CPU, the mLSTM
// forward at xLSTM 7B's head shape, StageInts, ArgmaxRows, the step arena's
// address reuse and CaptureStep's graphs replaying what they recorded.
// Skips when no GPU is present.
#include <algorithm>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"

namespace lair::kernels {
namespace {

constexpr double kBf16Tol = 2e-2;
// Rows up to which a kFast product still takes the exact GEMV kernel.
constexpr int64_t kFastGemvRows = 1;
// The inner dimension up to which products of more rows take the exact
// narrow-k kernel (up to 1024 rows).
constexpr int64_t kNarrowK = 64;

class CudaStepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BackendOptions options;
    options.gemm = GemmMode::kFast;
    absl::StatusOr<std::unique_ptr<Backend>> gpu = MakeBackend("cuda", options);
    if (!gpu.ok()) GTEST_SKIP() << "no CUDA backend here: " << gpu.status().message();
    gpu_ = std::move(*gpu);
    cpu_ = MakeCpuBackend(1);
  }

  Tensor Rand(Shape shape) {
    Tensor t = Tensor::Zeros(DType::kF32, std::move(shape));
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = dist(rng_);
    return t;
  }
  // Through `on` (default: the fast backend): the backend that runs the op,
  // so that the copies are ordered with it on its stream.
  Tensor Up(const Tensor& host, DType dtype = DType::kF32, Backend* on = nullptr) {
    absl::StatusOr<Tensor> t = (on ? on : gpu_.get())->Upload(host, dtype);
    EXPECT_TRUE(t.ok()) << t.status();
    return *t;
  }
  Tensor Down(const Tensor& device, Backend* on = nullptr) {
    absl::StatusOr<Tensor> t = (on ? on : gpu_.get())->Download(device);
    EXPECT_TRUE(t.ok()) << t.status();
    return *t;
  }

  // A SwiGLU MLP of m rows (k inputs, f hidden, an input norm: 0 none, 1
  // with a weight, 2 without; a residual) on `gpu` against the two linear
  // groups it stands for on the same backend, within group_tol, and against
  // the CPU's fp32 weights at the bf16 tolerance (the GPU's are rounded).
  void ExpectSwiGluMatchesGroups(Backend& gpu, int64_t k, int64_t f, int64_t m, int normed,
                                 double group_tol) {
    const int64_t k2 = 192;
    const std::string what =
        absl::StrCat("k=", k, " f=", f, " m=", m, " normed ", normed, " (0: no, 2: no weight)");
    const Tensor x = Rand({m, k}), residual = Rand({m, k2});
    const Tensor wg = Rand({f, k}), wu = Rand({f, k}), wd = Rand({k2, f});
    std::optional<NormArgs> norm;
    if (normed > 0) {
      norm.emplace().eps = 1e-5f;
      if (normed == 1) norm->weight = Rand({k});
    }
    std::optional<NormArgs> gpu_norm = norm;
    if (gpu_norm && gpu_norm->weight.defined())
      gpu_norm->weight = Up(norm->weight, DType::kF32, &gpu);
    SwiGluArgs args;
    args.x = Up(x, DType::kF32, &gpu);
    args.w_gate = Up(wg, DType::kBF16, &gpu);
    args.w_up = Up(wu, DType::kBF16, &gpu);
    args.w_down = Up(wd, DType::kBF16, &gpu);
    args.residual = Up(residual, DType::kF32, &gpu);
    args.out = Up(Rand({m, k2}), DType::kF32, &gpu);  // overwritten whole
    args.input_norm = gpu_norm;
    const absl::Status st = gpu.SwiGlu(args);
    ASSERT_TRUE(st.ok()) << what << ": " << st;

    const Tensor gate = Up(Tensor::Zeros(DType::kF32, {m, f}), DType::kF32, &gpu);
    const Tensor up = Up(Tensor::Zeros(DType::kF32, {m, f}), DType::kF32, &gpu);
    const Tensor gate_up[] = {args.w_gate, args.w_up}, projections[] = {gate, up};
    LinearGroupArgs first{args.x, gate_up, {}, projections};
    first.input_norm = gpu_norm;
    ASSERT_TRUE(gpu.LinearGroup(first).ok()) << what;
    const Tensor grouped = Up(Tensor::Zeros(DType::kF32, {m, k2}), DType::kF32, &gpu);
    const Tensor residuals[] = {args.residual};
    LinearGroupArgs down{up, {&args.w_down, 1}, {}, {&grouped, 1}, {}, residuals};
    down.silu_gate = gate;
    ASSERT_TRUE(gpu.LinearGroup(down).ok()) << what;
    const Tensor out = Down(args.out, &gpu);
    EXPECT_LE(RelativeError(out, Down(grouped, &gpu)), group_tol) << what;

    SwiGluArgs want;
    want.x = x;
    want.w_gate = wg;
    want.w_up = wu;
    want.w_down = wd;
    want.residual = residual;
    want.out = Tensor::Zeros(DType::kF32, {m, k2});
    want.input_norm = norm;
    ASSERT_TRUE(cpu_->SwiGlu(want).ok()) << what;
    EXPECT_LE(RelativeError(out, want.out), kBf16Tol) << what << " vs CPU";
  }

  std::unique_ptr<Backend> gpu_, cpu_;
  std::mt19937 rng_{5};
};

// Decode-sized products (the GEMV kernel: m ≤ 8 exact, m = 1 fast; the
// tensor-core ring: 2 to 8 rows fast here) and larger ones (cuBLASLt), with and
// without bias and beta, in both precisions, against the CPU on the
// bf16-rounded weights.
TEST_F(CudaStepTest, GemmOnBf16WeightsMatchesCpuInBothPrecisions) {
  BackendOptions exact_options;
  auto exact = MakeBackend("cuda", exact_options);
  ASSERT_TRUE(exact.ok());
  // Narrow and wide products, short and long rows.
  for (const auto& [k, n] : {std::pair<int64_t, int64_t>{264, 389}, {264, 1500}, {2056, 2500}})
    for (int64_t m : {1, 2, 3, 8, 9, 32, 64, 300}) {
      for (bool with_bias : {false, true}) {
        for (bool fast : {false, true}) {
          Backend& gpu = fast ? *gpu_ : **exact;
          const std::string what =
              absl::StrCat("k=", k, " n=", n, " m=", m, " bias=", with_bias, " fast=", fast);
          const Tensor a = Rand({m, k});
          const Tensor w = Rand({n, k});
          const Tensor c0 = Rand({m, n});
          const Tensor bias = with_bias ? Rand({n}) : Tensor();
          const float beta = with_bias ? 0.5f : 0.0f;
          auto w_bf16 = gpu.Upload(w, DType::kBF16);
          ASSERT_TRUE(w_bf16.ok());
          auto w_rounded = gpu.Download(*w_bf16);
          ASSERT_TRUE(w_rounded.ok());
          GemmArgs want{a, w_rounded->ToF32(), c0.Clone(), false, true, 1.5f, beta, bias};
          ASSERT_TRUE(cpu_->Gemm(want).ok()) << what;
          GemmArgs got{*gpu.Upload(a, DType::kF32),
                       *w_bf16,
                       *gpu.Upload(c0, DType::kF32),
                       false,
                       true,
                       1.5f,
                       beta,
                       with_bias ? *gpu.Upload(bias, DType::kF32) : Tensor()};
          ASSERT_TRUE(gpu.Gemm(got).ok()) << what;
          auto c = gpu.Download(got.c);
          ASSERT_TRUE(c.ok());
          EXPECT_LE(RelativeError(*c, want.c), fast && m > kFastGemvRows ? kBf16Tol : 1e-5) << what;
        }
      }
    }
}

// A LinearGroup with activations equals one CPU product and Unary per
// member: one small-product launch applying them in its epilogue for
// decode-sized m, cuBLASLt (one shared activation rounding) and an
// elementwise pass above.
// Members of different widths, some with a bias, some narrower than a GEMV
// block.
TEST_F(CudaStepTest, LinearGroupMatchesOneProductPerMember) {
  BackendOptions exact_options;
  auto exact = MakeBackend("cuda", exact_options);
  ASSERT_TRUE(exact.ok());
  const int64_t k = 264;
  const std::vector<int64_t> widths = {389, 16, 3, 1500, 64, 7};
  // Identity, a scaled log-sigmoid gate, a soft cap with an offset.
  const Activation kinds[] = {
      {}, {UnaryOp::kLogSigmoid, 0.0625f}, {UnaryOp::kTanh, 2.0f, 0.1f, 0.5f}};
  std::vector<Activation> activations;
  for (size_t i = 0; i < widths.size(); ++i) activations.push_back(kinds[i % 3]);
  for (int64_t m : {1, 2, 3, 8, 9, 64}) {
    for (bool fast : {false, true}) {
      Backend& gpu = fast ? *gpu_ : **exact;
      const std::string what = absl::StrCat("m=", m, " fast=", fast);
      const Tensor a = Rand({m, k});
      std::vector<Tensor> weights, biases, outs, want;
      for (size_t i = 0; i < widths.size(); ++i) {
        auto w_bf16 = gpu.Upload(Rand({widths[i], k}), DType::kBF16);
        ASSERT_TRUE(w_bf16.ok());
        auto w_rounded = gpu.Download(*w_bf16);
        ASSERT_TRUE(w_rounded.ok());
        const Tensor bias = i % 2 == 1 ? Rand({widths[i]}) : Tensor();
        GemmArgs product{a,
                         w_rounded->ToF32(),
                         Tensor::Zeros(DType::kF32, {m, widths[i]}),
                         false,
                         true,
                         1.0f,
                         0.0f,
                         bias};
        ASSERT_TRUE(cpu_->Gemm(product).ok()) << what;
        const Activation& act = activations[i];
        ASSERT_TRUE(
            cpu_->Unary({act.op, act.alpha, act.beta, act.in_scale, product.c, product.c}).ok());
        want.push_back(product.c);
        weights.push_back(*w_bf16);
        biases.push_back(bias.defined() ? Up(bias, DType::kF32, &gpu) : Tensor());
        outs.push_back(Up(Rand({m, widths[i]}), DType::kF32, &gpu));  // overwritten whole
      }
      ASSERT_TRUE(
          gpu.LinearGroup({Up(a, DType::kF32, &gpu), weights, biases, outs, activations}).ok())
          << what;
      for (size_t i = 0; i < widths.size(); ++i) {
        EXPECT_LE(RelativeError(Down(outs[i], &gpu), want[i]),
                  fast && m > kFastGemvRows ? kBf16Tol : 1e-5)
            << what << " member " << i;
      }
    }
  }
  // The spans must agree.
  const Tensor w = Up(Rand({4, k}), DType::kBF16);
  const Tensor one_weight[] = {w};
  absl::Status st = gpu_->LinearGroup({Up(Rand({1, k})), one_weight, {}, {}});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("LinearGroup: outs"), std::string::npos) << st;
}

// Residuals join a LinearGroup's outputs last, as the CPU's separate ops
// compute them: one member adds its residual in place (a residual stream),
// one after its activation, one has none; in the small products' epilogue
// (m up to 8), as cuBLASLt's C, or in an elementwise pass.
TEST_F(CudaStepTest, LinearGroupAddsResiduals) {
  BackendOptions exact_options;
  auto exact = MakeBackend("cuda", exact_options);
  ASSERT_TRUE(exact.ok());
  const int64_t k = 264;
  const std::vector<int64_t> widths = {389, 16, 7};
  const Activation activations[] = {{}, {UnaryOp::kSigmoid}, {}};
  for (int64_t m : {1, 2, 3, 9, 64, 65}) {
    for (bool fast : {false, true}) {
      Backend& gpu = fast ? *gpu_ : **exact;
      const std::string what = absl::StrCat("m=", m, " fast=", fast);
      const Tensor x = Rand({m, k});
      std::vector<Tensor> weights, rounded, cpu_outs, gpu_outs, cpu_res, gpu_res;
      for (size_t i = 0; i < widths.size(); ++i) {
        auto w_bf16 = gpu.Upload(Rand({widths[i], k}), DType::kBF16);
        ASSERT_TRUE(w_bf16.ok());
        auto w_rounded = gpu.Download(*w_bf16);
        ASSERT_TRUE(w_rounded.ok());
        weights.push_back(*w_bf16);
        rounded.push_back(w_rounded->ToF32());
        const Tensor r = Rand({m, widths[i]});
        cpu_outs.push_back(i == 0 ? r.Clone() : Tensor::Zeros(DType::kF32, {m, widths[i]}));
        gpu_outs.push_back(Up(i == 0 ? r : Rand({m, widths[i]}), DType::kF32, &gpu));
        cpu_res.push_back(i == 0 ? cpu_outs[0] : i == 1 ? r : Tensor());
        gpu_res.push_back(i == 0 ? gpu_outs[0] : i == 1 ? Up(r, DType::kF32, &gpu) : Tensor());
      }
      ASSERT_TRUE(cpu_->LinearGroup({x, rounded, {}, cpu_outs, activations, cpu_res}).ok()) << what;
      const absl::Status st =
          gpu.LinearGroup({Up(x, DType::kF32, &gpu), weights, {}, gpu_outs, activations, gpu_res});
      ASSERT_TRUE(st.ok()) << what << ": " << st;
      for (size_t i = 0; i < widths.size(); ++i) {
        EXPECT_LE(RelativeError(Down(gpu_outs[i], &gpu), cpu_outs[i]),
                  fast && m > kFastGemvRows ? kBf16Tol : 1e-5)
            << what << " member " << i;
      }
    }
  }
}

// On the fast path every product above 1 row with k > 64 rounds its
// activations to bf16 and sums in fp32, so against the CPU on bf16-rounded
// activations and weights it is exact up to summation order (1e-5), wherever
// it runs: the GEMV (m = 1) and the narrow-k kernel (k ≤ 64, here 40), both
// exact on the activations as given, the tensor-core ring (2 to 32 rows in
// one to four activation tiles; k split over up to eight CTAs of a cluster)
// or cuBLASLt (33 rows and up). Groups whose widths leave partial
// 16-row tiles, k with a partial 32-wide step, a bias, activations, a
// residual in place, and a single product with beta ≠ 0. The same group
// with a SiLU gate reads silu(gate) ∘ x, and with an input norm (RMS or
// layer, gated, grouped) the norm of x: formed by the rounding pass before
// cuBLASLt (33 rows and up), by an elementwise or norm pass before the
// small-product kernels.
TEST_F(CudaStepTest, FastProductsAreExactOnRoundedActivations) {
  const std::vector<int64_t> widths = {389, 16, 3, 1500};
  const Activation activations[] = {{}, {UnaryOp::kSigmoid}, {}, {UnaryOp::kSilu}};
  const auto rounded = [&](const Tensor& t) {
    auto down = gpu_->Download(Up(t, DType::kBF16));
    EXPECT_TRUE(down.ok()) << down.status();
    return down->ToF32();
  };
  for (int64_t k : {40, 264, 2048, 8192}) {
    for (int64_t m : {1, 2, 3, 5, 8, 9, 12, 16, 17, 24, 32, 33, 48, 64, 65}) {
      const std::string what = absl::StrCat("k=", k, " m=", m);
      const Tensor x = Rand({m, k});
      const bool exact = m <= kFastGemvRows || k <= kNarrowK;
      const Tensor cpu_x = exact ? x : rounded(x);
      std::vector<Tensor> weights, cpu_weights, biases, cpu_biases, cpu_outs, gpu_outs, cpu_res,
          gpu_res;
      for (size_t i = 0; i < widths.size(); ++i) {
        const Tensor w = Rand({widths[i], k});
        weights.push_back(Up(w, DType::kBF16));
        cpu_weights.push_back(rounded(w));
        const Tensor bias = i == 1 ? Rand({widths[i]}) : Tensor();
        cpu_biases.push_back(bias);
        biases.push_back(bias.defined() ? Up(bias) : Tensor());
        const Tensor r = Rand({m, widths[i]});
        cpu_outs.push_back(i == 0 ? r.Clone() : Tensor::Zeros(DType::kF32, {m, widths[i]}));
        gpu_outs.push_back(Up(i == 0 ? r : Rand({m, widths[i]})));
        cpu_res.push_back(i == 0 ? cpu_outs[0] : Tensor());
        gpu_res.push_back(i == 0 ? gpu_outs[0] : Tensor());
      }
      ASSERT_TRUE(
          cpu_->LinearGroup({cpu_x, cpu_weights, cpu_biases, cpu_outs, activations, cpu_res}).ok())
          << what;
      const absl::Status st =
          gpu_->LinearGroup({Up(x), weights, biases, gpu_outs, activations, gpu_res});
      ASSERT_TRUE(st.ok()) << what << ": " << st;
      for (size_t i = 0; i < widths.size(); ++i)
        EXPECT_LE(RelativeError(Down(gpu_outs[i]), cpu_outs[i]), 1e-5) << what << " member " << i;

      // The group reading an input formed on the GPU (`gpu_formed`, by the
      // GPU's own op: the CPU's exp may differ in the last bit, which can
      // move a bf16 rounding) against the CPU's group on that input.
      const auto expect_formed_input = [&](const Tensor& gpu_formed, LinearGroupArgs args,
                                           const std::string& input) {
        const Tensor formed = Down(gpu_formed);
        const Tensor cpu_formed = exact ? formed : rounded(formed);
        std::vector<Tensor> want, got;
        for (size_t i = 0; i < widths.size(); ++i) {
          want.push_back(Tensor::Zeros(DType::kF32, {m, widths[i]}));
          got.push_back(Up(Rand({m, widths[i]})));  // overwritten whole
        }
        ASSERT_TRUE(
            cpu_->LinearGroup({cpu_formed, cpu_weights, cpu_biases, want, activations}).ok())
            << what;
        args.outs = got;
        const absl::Status st = gpu_->LinearGroup(args);
        ASSERT_TRUE(st.ok()) << what << " " << input << ": " << st;
        for (size_t i = 0; i < widths.size(); ++i) {
          EXPECT_LE(RelativeError(Down(got[i]), want[i]), 1e-5)
              << what << " " << input << " member " << i;
        }
      };
      const Tensor gpu_x = Up(x), gate = Up(Rand({m, k}));
      const Tensor gated = Up(Tensor::Zeros(DType::kF32, {m, k}));
      ASSERT_TRUE(gpu_->Binary({BinaryOp::kSiluMul, gate, gpu_x, gated}).ok());
      LinearGroupArgs gated_args{gpu_x, weights, biases, {}, activations};
      gated_args.silu_gate = gate;
      expect_formed_input(gated, gated_args, "silu(gate)·x");
      // Norms of every kind, gate and grouping, against the norm kernel's
      // (an RMS norm of whole rows without weight, a block norm folded into
      // its products, the GEMV forms itself at one row).
      struct NormCase {
        NormKind kind;
        NormGate gate;
        int group_size;
        bool weight;
      };
      for (const NormCase& nc : {NormCase{NormKind::kRms, NormGate::kNone, 0, true},
                                 NormCase{NormKind::kRms, NormGate::kNone, 0, false},
                                 NormCase{NormKind::kLayer, NormGate::kNone, 8, false},
                                 NormCase{NormKind::kRms, NormGate::kAfter, 8, true},
                                 NormCase{NormKind::kLayer, NormGate::kBefore, 0, true},
                                 NormCase{NormKind::kRms, NormGate::kSiluInput, 0, true}}) {
        NormArgs norm;
        norm.kind = nc.kind;
        norm.gate_mode = nc.gate;
        norm.eps = 1e-5f;
        norm.group_size = nc.group_size;
        if (nc.weight) norm.weight = Up(Rand({k}));
        if (NormHasGate(nc.gate)) norm.gate = gate;
        NormArgs direct = norm;
        direct.x = gpu_x;
        direct.y = Up(Tensor::Zeros(DType::kF32, {m, k}));
        ASSERT_TRUE(gpu_->Norm(direct).ok());
        LinearGroupArgs normed_args{gpu_x, weights, biases, {}, activations};
        normed_args.input_norm = norm;
        expect_formed_input(direct.y, normed_args,
                            absl::StrCat("norm(x) kind ", static_cast<int>(nc.kind), " gate ",
                                         static_cast<int>(nc.gate), " group ", nc.group_size));
      }

      const Tensor c0 = Rand({m, widths[0]});
      GemmArgs want{cpu_x, cpu_weights[0], c0.Clone(), false, true, 1.5f, 0.5f, Tensor()};
      ASSERT_TRUE(cpu_->Gemm(want).ok()) << what;
      GemmArgs got{Up(x), weights[0], Up(c0), false, true, 1.5f, 0.5f, Tensor()};
      ASSERT_TRUE(gpu_->Gemm(got).ok()) << what;
      EXPECT_LE(RelativeError(Down(got.c), want.c), 1e-5) << what << " beta";
    }
  }
}

// A norm (and a linear group's input norm) reads x in 16 bits, and its gate
// after it in bf16, on the CUDA backend's forward (a scan's rounded output,
// a gate product's), exactly as it reads the same values in fp32: per-head
// norms with a gate after them (GLA's and RetNet's output stage) and a row
// norm of silu(x) (GSA's), through the GEMV (1 row), the tensor-core ring
// (2 and 24) and cuBLASLt (65).
TEST_F(CudaStepTest, NormsReadSixteenBitInputs) {
  const int64_t k = 512, n = 200;
  struct NormCase {
    NormGate gate;
    int group_size;
  };
  for (DType type : {DType::kBF16, DType::kF16}) {
    for (int64_t m : {1, 2, 24, 65}) {
      for (const NormCase& nc :
           {NormCase{NormGate::kAfter, 128}, NormCase{NormGate::kSiluInput, 0}}) {
        const std::string what = absl::StrCat(std::string(DTypeName(type)), " m=", m, " gate ",
                                              static_cast<int>(nc.gate), " group ", nc.group_size);
        const Tensor x16 = Up(Rand({m, k}), type);
        const Tensor x32 = Up(Down(x16).ToF32());
        const Tensor gate16 = Up(Rand({m, k}), DType::kBF16);  // a product's output
        const Tensor gate32 = Up(Down(gate16).ToF32());
        NormArgs norm;
        norm.gate_mode = nc.gate;
        norm.eps = 1e-5f;
        norm.group_size = nc.group_size;
        norm.weight = Up(Rand({nc.group_size == 0 ? k : nc.group_size}));
        const Tensor w = Up(Rand({n, k}), DType::kBF16);
        // The inputs in 16 bits, then the same values in fp32.
        const std::pair<Tensor, Tensor> inputs[] = {{x16, gate16}, {x32, gate32}};
        std::vector<Tensor> outs, products;
        for (const auto& [x, gate] : inputs) {
          NormArgs direct = norm;
          direct.x = x;
          if (NormHasGate(nc.gate)) direct.gate = gate;
          direct.y = Up(Tensor::Zeros(DType::kF32, {m, k}));
          ASSERT_TRUE(gpu_->Norm(direct).ok()) << what;
          outs.push_back(Down(direct.y));
          const Tensor out = Up(Tensor::Zeros(DType::kF32, {m, n}));
          LinearGroupArgs args{x, {&w, 1}, {}, {&out, 1}};
          args.input_norm = direct;
          const absl::Status st = gpu_->LinearGroup(args);
          ASSERT_TRUE(st.ok()) << what << ": " << st;
          products.push_back(Down(out));
        }
        EXPECT_EQ(RelativeError(outs[0], outs[1]), 0.0) << what << " norm";
        EXPECT_EQ(RelativeError(products[0], products[1]), 0.0) << what << " product";
      }
    }
  }
}

// The decode GEMV splits the rows of a product of few rows across up to
// four warps each (whole chunks of 1024 k; the last warps of a row may have
// none): exact against the CPU on the bf16 weights at one, two and four
// warps per row (by rows and k), with row counts that leave CTAs partly
// empty, k that ends inside a chunk, and beta ≠ 0.
TEST_F(CudaStepTest, GemvSplitsFewRowsAcrossWarps) {
  // The exact precision: the fast path takes two rows to the ring.
  auto exact = MakeBackend("cuda", BackendOptions{});
  ASSERT_TRUE(exact.ok()) << exact.status();
  Backend& gpu = **exact;
  // A group of three members, whose rows must not mix.
  for (int64_t m : {1, 2}) {
    const int64_t k = 2056;
    const std::vector<int64_t> widths = {37, 8, 1500};
    const Tensor x = Rand({m, k});
    std::vector<Tensor> weights, cpu_weights, cpu_outs, gpu_outs;
    for (int64_t n : widths) {
      const Tensor w = Up(Rand({n, k}), DType::kBF16, &gpu);
      absl::StatusOr<Tensor> host = gpu.Download(w);
      ASSERT_TRUE(host.ok()) << host.status();
      weights.push_back(w);
      cpu_weights.push_back(host->ToF32());
      cpu_outs.push_back(Tensor::Zeros(DType::kF32, {m, n}));
      gpu_outs.push_back(Up(Rand({m, n}), DType::kF32, &gpu));
    }
    ASSERT_TRUE(cpu_->LinearGroup({x, cpu_weights, {}, cpu_outs}).ok());
    ASSERT_TRUE(gpu.LinearGroup({Up(x, DType::kF32, &gpu), weights, {}, gpu_outs}).ok());
    for (size_t i = 0; i < widths.size(); ++i) {
      EXPECT_LE(RelativeError(Down(gpu_outs[i], &gpu), cpu_outs[i]), 1e-5)
          << "m=" << m << " member " << i;
    }
  }
  for (int64_t k : {16, 1000, 2056, 5632, 8192}) {
    for (int64_t rows : {1, 37, 2048, 3001}) {
      for (int64_t m : {1, 2}) {
        const std::string what = absl::StrCat("k=", k, " rows=", rows, " m=", m);
        const Tensor x = Rand({m, k}), c0 = Rand({m, rows});
        const Tensor w = Up(Rand({rows, k}), DType::kBF16, &gpu);
        absl::StatusOr<Tensor> w_host = gpu.Download(w);
        ASSERT_TRUE(w_host.ok()) << w_host.status();
        GemmArgs want{x, w_host->ToF32(), c0.Clone(), false, true, 1.5f, 0.5f, Tensor()};
        ASSERT_TRUE(cpu_->Gemm(want).ok()) << what;
        GemmArgs got{Up(x, DType::kF32, &gpu),
                     w,
                     Up(c0, DType::kF32, &gpu),
                     false,
                     true,
                     1.5f,
                     0.5f,
                     Tensor()};
        const absl::Status st = gpu.Gemm(got);
        ASSERT_TRUE(st.ok()) << what << ": " << st;
        EXPECT_LE(RelativeError(Down(got.c, &gpu), want.c), 1e-5) << what;
      }
    }
  }
}

// Members of a linear group that write bf16 outputs (ProductOutputDType)
// hold the fp32 outputs of the same group rounded: written by cuBLASLt
// itself without an activation or bias, else rounded after them by one pass
// (and after the decode kernels below 33 rows).
TEST_F(CudaStepTest, LinearGroupWritesSixteenBitOutputs) {
  const int64_t k = 264;
  const std::vector<int64_t> widths = {96, 40, 3};
  const Activation activations[] = {{}, {UnaryOp::kSilu}, {}};
  EXPECT_EQ(gpu_->ProductOutputDType(32), DType::kF32);
  EXPECT_EQ(gpu_->ProductOutputDType(33), DType::kBF16);
  for (int64_t m : {1, 20, 33, 100}) {
    const std::string what = absl::StrCat("m=", m);
    const Tensor x = Up(Rand({m, k}));
    std::vector<Tensor> weights, biases, wide, narrow;
    for (size_t i = 0; i < widths.size(); ++i) {
      weights.push_back(Up(Rand({widths[i], k}), DType::kBF16));
      biases.push_back(i == 2 ? Up(Rand({widths[i]})) : Tensor());
      wide.push_back(Up(Tensor::Zeros(DType::kF32, {m, widths[i]})));
      narrow.push_back(Up(Tensor::Zeros(DType::kF32, {m, widths[i]}), DType::kBF16));
    }
    ASSERT_TRUE(gpu_->LinearGroup({x, weights, biases, wide, activations}).ok()) << what;
    const absl::Status st = gpu_->LinearGroup({x, weights, biases, narrow, activations});
    ASSERT_TRUE(st.ok()) << what << ": " << st;
    for (size_t i = 0; i < widths.size(); ++i) {
      const Tensor want = Down(Up(Down(wide[i]), DType::kBF16)).ToF32();
      EXPECT_LE(RelativeError(Down(narrow[i]).ToF32(), want), kBf16Tol) << what << " member " << i;
    }
  }
  // A 16-bit output takes no residual.
  const Tensor x = Up(Rand({40, k})), w = Up(Rand({8, k}), DType::kBF16);
  const Tensor out = Up(Tensor::Zeros(DType::kF32, {40, 8}), DType::kBF16);
  const Tensor residual = Up(Rand({40, 8}));
  EXPECT_EQ(gpu_->LinearGroup({x, {&w, 1}, {}, {&out, 1}, {}, {&residual, 1}}).code(),
            absl::StatusCode::kInvalidArgument);
}

// A SwiGLU MLP (with an input norm and a residual) against the two linear
// groups it stands for, run by the same backend: at 1 row the GEMV, and
// from 2 to 32 the ring kernel, form silu(gate) ∘ up in their epilogue,
// with the same bits as the groups' products and passes; from 33 rows on
// cuBLASLt with the gate and up outputs rounded to bf16 (within the bf16
// tolerance). Also against the CPU in fp32.
// The second shape splits the GEMV's row over warps at 1 row and takes the
// ring at 2 and 3 (the GEMV's pairs of rows: the exact backend's test
// below). The input norm comes with a weight, and without (a block norm
// folded into gate and up, which the GEMV forms at one row).
TEST_F(CudaStepTest, SwiGluMatchesItsLinearGroups) {
  struct Case {
    int64_t k, f;
    std::vector<int64_t> rows;
  };
  for (const Case& shape :
       {Case{256, 344, {1, 2, 9, 16, 17, 20, 32, 33, 100}}, Case{2048, 339, {1, 2, 3}}}) {
    for (int64_t m : shape.rows) {
      for (int normed : {0, 1, 2}) {
        ExpectSwiGluMatchesGroups(*gpu_, shape.k, shape.f, m, normed, m > 32 ? kBf16Tol : 0.0);
      }
    }
  }
}

// The same on the exact backend, where the GEMV takes up to 8 rows: the
// pairs of rows it reads together (2 and 3), its widest shape (8), and one
// row more (9: no kernel forms silu(gate) ∘ up, so the op runs as the two
// groups do), each against the groups within fp32 summation order.
TEST_F(CudaStepTest, SwiGluOnTheExactBackendMatchesItsLinearGroups) {
  auto made = MakeBackend("cuda", BackendOptions{});
  ASSERT_TRUE(made.ok()) << made.status();
  for (int64_t m : {1, 2, 3, 8, 9}) {
    for (int normed : {0, 1, 2}) ExpectSwiGluMatchesGroups(**made, 2056, 339, m, normed, 1e-5);
  }
}

// xLSTM 7B's head shape (key_dim 256, value_dim 512) through the mLSTM
// forward, chunked and as one-token steps, against the CPU. This backend is
// kFast: chunked scans round q, k, v to bf16 (bf16 tolerance), steps are fp32.
TEST_F(CudaStepTest, MlstmForwardAtXlstm7bHeads) {
  const int H = 2, K = 256, V = 512;
  for (bool step : {false, true}) {
    const std::vector<int32_t> offsets =
        step ? std::vector<int32_t>{0, 1, 2} : std::vector<int32_t>{0, 40, 41};
    const std::vector<int32_t> slots = {2, 0};
    SequenceBatch batch;
    batch.num_seqs = 2;
    batch.cu_seqlens = offsets;
    batch.state_slot = slots;
    batch.max_seqlen = step ? 1 : 40;
    const int64_t n = offsets.back();
    const std::string what = step ? "step" : "chunked";
    std::uniform_real_distribution<float> gate(-3.0f, 3.0f);
    const Tensor q = Rand({n, H, K}), k = Rand({n, H, K}), v = Rand({n, H, V});
    Tensor ig = Rand({n, H}), fg = Rand({n, H});
    for (int64_t i = 0; i < ig.numel(); ++i)
      ig.f32()[i] = gate(rng_), fg.f32()[i] = 2.0f + gate(rng_);
    const Tensor c0 = Rand({3, H, K, V}), n0 = Rand({3, H, K}), m0 = Rand({3, H});
    MlstmForwardArgs c, d;
    for (MlstmForwardArgs* x : {&c, &d})
      x->kind = MlstmKind::kExp, x->heads = H, x->key_dim = K, x->value_dim = V;
    c.q = q, c.k = k, c.v = v, c.i = ig, c.f = fg;
    c.h = Tensor::Zeros(DType::kF32, {n, H, V});
    c.state_c = c0.Clone(), c.state_n = n0.Clone(), c.state_m = m0.Clone();
    d.q = Up(q), d.k = Up(k), d.v = Up(v), d.i = Up(ig), d.f = Up(fg);
    d.h = Up(Tensor::Zeros(DType::kF32, {n, H, V}));
    d.state_c = Up(c0), d.state_n = Up(n0), d.state_m = Up(m0);
    ASSERT_TRUE(cpu_->MlstmForward(batch, c, MixerForm::kChunked).ok());
    const absl::Status st =
        gpu_->MlstmForward(batch, d, step ? MixerForm::kRecurrent : MixerForm::kChunked);
    ASSERT_TRUE(st.ok()) << what << ": " << st;
    const double tol = step ? 1e-4 : kBf16Tol;
    EXPECT_LE(RelativeError(Down(d.h), c.h), tol) << what;
    EXPECT_LE(RelativeError(Down(d.state_c), c.state_c), tol) << what;
    EXPECT_LE(RelativeError(Down(d.state_n), c.state_n), tol) << what;
    EXPECT_LE(RelativeError(Down(d.state_m), c.state_m), tol) << what;
  }
}

TEST_F(CudaStepTest, StageIntsCopiesEveryPart) {
  const std::vector<int32_t> a = {1, 2, 3}, b = {}, c = {-7, 40000, 5, 6, 7};
  const std::span<const int32_t> parts[] = {a, b, c};
  auto staged = gpu_->StageInts(parts);
  ASSERT_TRUE(staged.ok()) << staged.status();
  ASSERT_EQ(staged->size(), 3u);
  const std::vector<int32_t>* want[] = {&a, &b, &c};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ((*staged)[i].device(), Device::kCuda);
    ASSERT_EQ((*staged)[i].numel(), static_cast<int64_t>(want[i]->size()));
    if (want[i]->empty()) continue;
    const Tensor host = Down((*staged)[i]);
    EXPECT_EQ(std::vector<int32_t>(host.data<int32_t>(), host.data<int32_t>() + host.numel()),
              *want[i]);
  }
  // The next call reuses the same device block.
  const std::vector<int32_t> d = {9, 9, 9};
  const std::span<const int32_t> again[] = {d};
  auto restaged = gpu_->StageInts(again);
  ASSERT_TRUE(restaged.ok());
  EXPECT_EQ((*restaged)[0].raw(), (*staged)[0].raw());
  EXPECT_EQ(Down((*restaged)[0]).data<int32_t>()[2], 9);
}

TEST_F(CudaStepTest, ArgmaxRowsMatchesHostIncludingTies) {
  const int64_t rows = 7, vocab = 50257;
  Tensor logits = Rand({rows, vocab});
  logits.f32()[2 * vocab + 100] = 5.0f;  // a tie: the first index wins
  logits.f32()[2 * vocab + 40000] = 5.0f;
  logits.f32()[5 * vocab + vocab - 1] = 9.0f;  // the last column
  Tensor ids = Up(Tensor::Zeros(DType::kI32, {rows}), DType::kI32);
  ASSERT_TRUE(gpu_->ArgmaxRows(Up(logits), ids).ok());
  const Tensor got = Down(ids);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits.f32() + r * vocab;
    EXPECT_EQ(got.data<int32_t>()[r], std::max_element(row, row + vocab) - row) << "row " << r;
  }
  EXPECT_FALSE(
      gpu_->ArgmaxRows(Up(logits), Up(Tensor::Zeros(DType::kI32, {rows + 1}), DType::kI32)).ok());
}

// The device draw against the CPU reference's (Backend::SampleRows on the
// CPU, kernels::SampleRow row by row): vocabularies staged in shared memory
// and not, ties at the filters' cuts, every filter, and the draws'
// logprobs (none, the drawn token's alone, 5 and kMaxRowLogprobs listed)
// within float rounding; a listed token may trade places only with one of
// the same logprob up to that rounding.
TEST_F(CudaStepTest, SampleRowsDrawWhatTheCpuReferenceDraws) {
  std::vector<RowSampling> rules;
  for (float temperature : {0.0f, 0.7f, 1.3f}) {
    for (const auto& [top_k, top_p, min_p] :
         {std::tuple{0, 1.0f, 0.0f}, std::tuple{1, 1.0f, 0.0f}, std::tuple{40, 1.0f, 0.0f},
          std::tuple{0, 0.5f, 0.0f}, std::tuple{0, 0.95f, 0.0f}, std::tuple{0, 1.0f, 0.2f},
          std::tuple{50, 0.9f, 0.05f}}) {
      int listed = 0;
      for (double u : {0.0, 0.31, 0.77, 0.999}) {
        const int logprobs[] = {-1, 0, 5, kMaxRowLogprobs};
        rules.push_back({.temperature = temperature,
                         .top_k = top_k,
                         .top_p = top_p,
                         .min_p = min_p,
                         .u = u,
                         .logprobs = logprobs[listed++ % 4]});
      }
    }
  }
  const auto rows = static_cast<int64_t>(rules.size());
  constexpr int kValues = 1 + kMaxRowLogprobs;
  for (int64_t vocab : {512, 32000, 50257}) {
    Tensor logits = Rand({rows, vocab});
    for (int64_t r = 0; r < rows; ++r) {
      float* row = logits.f32() + r * vocab;
      for (int64_t i = 0; i < vocab; ++i) row[i] *= 6.0f;
      const int64_t top = std::max_element(row, row + vocab) - row;
      row[(top + 7) % vocab] = row[top];  // ties at the top and further down
      row[(top + 11) % vocab] = row[(top + 13) % vocab];
    }
    Tensor ids = Up(Tensor::Zeros(DType::kI32, {rows}), DType::kI32);
    const DrawLogprobs drawn{Up(Tensor::Zeros(DType::kF32, {rows, kValues})),
                             Up(Tensor::Zeros(DType::kI32, {rows, kMaxRowLogprobs}), DType::kI32)};
    ASSERT_TRUE(gpu_->SampleRows(Up(logits), rules, ids, drawn).ok());
    const Tensor got = Down(ids), values = Down(drawn.values), top_ids = Down(drawn.top_ids);
    Tensor want_ids = Tensor::Zeros(DType::kI32, {rows});
    const DrawLogprobs want{Tensor::Zeros(DType::kF32, {rows, kValues}),
                            Tensor::Zeros(DType::kI32, {rows, kMaxRowLogprobs})};
    ASSERT_TRUE(cpu_->SampleRows(logits, rules, want_ids, want).ok());
    for (int64_t r = 0; r < rows; ++r) {
      const std::string what = absl::StrCat("vocab ", vocab, ", rule ", r);
      const std::span<const float> row(logits.f32() + r * vocab, vocab);
      EXPECT_EQ(got.data<int32_t>()[r], SampleRow(row, rules[r])) << what;
      EXPECT_EQ(got.data<int32_t>()[r], want_ids.data<int32_t>()[r]) << what;
      if (rules[r].logprobs < 0) continue;
      const float* v = values.f32() + r * kValues;
      const float* w = want.values.f32() + r * kValues;
      const int32_t* t = top_ids.data<int32_t>() + r * kMaxRowLogprobs;
      const int32_t* u = want.top_ids.data<int32_t>() + r * kMaxRowLogprobs;
      EXPECT_NEAR(v[0], w[0], 1e-5) << what << ": the drawn token's logprob";
      for (int i = 0; i < kMaxRowLogprobs; ++i) {
        if (u[i] < 0) {
          EXPECT_EQ(t[i], -1) << what << ", listed " << i;
          continue;
        }
        EXPECT_NEAR(v[1 + i], w[1 + i], 1e-5) << what << ", listed " << i;
        if (t[i] != u[i]) {
          EXPECT_NEAR(row[t[i]], row[u[i]], 1e-5) << what << ", listed " << i;
        }
      }
    }
  }
  const Tensor three = Up(Tensor::Zeros(DType::kF32, {3, 8}));
  EXPECT_FALSE(gpu_->SampleRows(three, std::span(rules).first(2),
                                Up(Tensor::Zeros(DType::kI32, {3}), DType::kI32), {})
                   .ok());
  // A rule that asks for logprobs needs somewhere to put them.
  const std::vector<RowSampling> asks(3, RowSampling{.temperature = 0.5f, .logprobs = 2});
  const absl::Status missing =
      gpu_->SampleRows(three, asks, Up(Tensor::Zeros(DType::kI32, {3}), DType::kI32), {});
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument) << missing;
}

TEST_F(CudaStepTest, ArenaRepeatsAddressesOnceSized) {
  std::vector<void*> seen[3];
  for (int step = 0; step < 3; ++step) {
    gpu_->BeginStep();
    for (int64_t size : {1000, 33, 1 << 20}) {
      auto t = gpu_->AllocateScratch(DType::kF32, {size});
      ASSERT_TRUE(t.ok()) << t.status();
      seen[step].push_back(t->raw());
    }
    gpu_->EndStep();
  }
  // The first step sized the arena (it grew at the second BeginStep).
  EXPECT_EQ(seen[1], seen[2]);
  const uint64_t epoch = gpu_->memory_epoch();
  gpu_->BeginStep();
  gpu_->EndStep();
  EXPECT_EQ(gpu_->memory_epoch(), epoch);
}

TEST_F(CudaStepTest, CapturedStepReplaysOnNewInputs) {
  const Tensor x = Up(Rand({4096}));
  const Tensor y = Up(Tensor::Zeros(DType::kF32, {4096}));
  auto graph = gpu_->CaptureStep([&] {
    return gpu_->Unary({UnaryOp::kAffine, 2.0f, 1.0f, 1.0f, x, y});
  });
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(Down(y).f32()[17], 0.0f) << "recording must not run the step";
  for (int round = 0; round < 2; ++round) {
    const Tensor fresh = Rand({4096});
    ASSERT_TRUE(gpu_->Copy(Up(fresh), x).ok());
    ASSERT_TRUE((*graph)->Launch().ok());
    const Tensor got = Down(y);
    for (int64_t i = 0; i < 4096; i += 511)
      EXPECT_EQ(got.f32()[i], 2.0f * fresh.f32()[i] + 1.0f) << i;
  }
  // A step that synchronizes cannot be recorded, and the stream stays usable.
  auto bad = gpu_->CaptureStep([&] { return gpu_->Synchronize(); });
  EXPECT_FALSE(bad.ok());
  EXPECT_TRUE(gpu_->Synchronize().ok());
  EXPECT_FALSE(cpu_->CaptureStep([] { return absl::OkStatus(); }).ok());
}

// Synchronize reads the device's index-fault record only after work that
// may fault; a replayed graph's embedding counts on every replay.
TEST_F(CudaStepTest, ReplayedStepsReportOutOfRangeIds) {
  const Tensor table = Up(Rand({10, 8}));
  Tensor host_ids = Tensor::Zeros(DType::kI32, {2});
  host_ids.data<int32_t>()[0] = 3;
  const Tensor ids = Up(host_ids, DType::kI32);
  const Tensor out = Up(Tensor::Zeros(DType::kF32, {2, 8}));
  auto graph = gpu_->CaptureStep([&] { return gpu_->Embedding({table, ids, out}); });
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_TRUE(gpu_->Synchronize().ok());
  for (int32_t second : {4, 10, 5}) {
    host_ids.data<int32_t>()[1] = second;
    ASSERT_TRUE(gpu_->Copy(Up(host_ids, DType::kI32), ids).ok());
    ASSERT_TRUE((*graph)->Launch().ok());
    const absl::Status synced = gpu_->Synchronize();
    if (second < 10) {
      EXPECT_TRUE(synced.ok()) << synced;
    } else {
      EXPECT_EQ(synced.code(), absl::StatusCode::kInvalidArgument) << synced;
      EXPECT_NE(synced.message().find("Embedding: ids"), std::string::npos) << synced;
    }
  }
  EXPECT_TRUE(gpu_->Synchronize().ok());
}

}  // namespace
}  // namespace lair::kernels
