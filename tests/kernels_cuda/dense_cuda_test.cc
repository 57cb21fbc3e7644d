// CudaDenseOps against the CPU reference backend: every dense op and its
// backward on random inputs (odd sizes for the scalar paths, multiples of 4
// for the 16-byte ones, broadcasting, packed batches with an empty and a
// one-token sequence, shuffled slots). Written outputs are poisoned with NaN
// first, so an element the GPU leaves unwritten fails the comparison;
// accumulated outputs start from the same random values on both sides.
// F32 paths agree to 1e-5 relative error, BF16/F16 weights in the fast GEMM
// to 2e-2. Skips when no GPU is present.
#include <cuda_runtime_api.h>

#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cuda/dense_ops.h"

namespace lair::kernels::cuda {
namespace {

constexpr double kF32Tol = 1e-5;
constexpr double kHalfTol = 2e-2;

class CudaDenseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no CUDA device (" << cudaGetErrorString(err) << "); dense CUDA ops not run";
    }
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    absl::StatusOr<std::unique_ptr<CudaDenseOps>> ops = CudaDenseOps::Create(stream_);
    ASSERT_TRUE(ops.ok()) << ops.status();
    gpu_ = std::move(*ops);
    cpu_ = MakeCpuBackend(1);
  }

  void TearDown() override {
    gpu_.reset();
    if (stream_) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }

  // Uniform in [lo, hi).
  Tensor Rand(Shape shape, float lo = -1.0f, float hi = 1.0f) {
    Tensor t = Tensor::Zeros(DType::kF32, std::move(shape));
    std::uniform_real_distribution<float> dist(lo, hi);
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = dist(rng_);
    return t;
  }
  Tensor Ints(std::vector<int32_t> values) {
    Tensor t = Tensor::Zeros(DType::kI32, {static_cast<int64_t>(values.size())});
    for (size_t i = 0; i < values.size(); ++i) t.data<int32_t>()[i] = values[i];
    return t;
  }
  Tensor RandInts(int64_t n, int32_t hi) {
    std::uniform_int_distribution<int32_t> dist(0, hi - 1);
    std::vector<int32_t> v(n);
    for (auto& x : v) x = dist(rng_);
    return Ints(v);
  }

  // A device copy of a host tensor (any dtype).
  Tensor Dev(const Tensor& host) {
    void* ptr = nullptr;
    EXPECT_EQ(cudaMalloc(&ptr, std::max<size_t>(host.nbytes(), 16)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr, host.raw(), host.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
    return Tensor::Wrap(ptr, host.dtype(), host.shape(), Device::kCuda,
                        std::shared_ptr<void>(ptr, [](void* p) { cudaFree(p); }));
  }
  // A device tensor full of NaN (a written output).
  Tensor Poison(Shape shape) {
    Tensor host = Tensor::Zeros(DType::kF32, std::move(shape));
    for (int64_t i = 0; i < host.numel(); ++i)
      host.f32()[i] = std::numeric_limits<float>::quiet_NaN();
    return Dev(host);
  }
  // `host` rounded through a half type: what a BF16/F16 weight holds.
  static Tensor Round(const Tensor& host, DType dt) {
    Tensor out = Tensor::Zeros(dt, host.shape());
    for (int64_t i = 0; i < host.numel(); ++i) {
      out.data<uint16_t>()[i] =
          dt == DType::kBF16 ? FloatToBF16(host.f32()[i]) : FloatToF16(host.f32()[i]);
    }
    return out;
  }
  Tensor Host(const Tensor& device) {
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    Tensor host = Tensor::Zeros(device.dtype(), device.shape());
    EXPECT_EQ(cudaMemcpy(host.raw(), device.raw(), host.nbytes(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }
  void Expect(const Tensor& gpu_tensor, const Tensor& cpu_tensor, double tol,
              const std::string& what) {
    const double err = RelativeError(Host(gpu_tensor), cpu_tensor);
    EXPECT_LE(err, tol) << what;  // NaN fails here too
  }

  // Ragged packed batch: lengths as given, slots reversed in a pool of
  // lens.size() + 1.
  SequenceBatch Batch(const std::vector<int>& lens) {
    offsets_ = {0};
    for (int len : lens) offsets_.push_back(offsets_.back() + len);
    slots_.clear();
    for (size_t s = 0; s < lens.size(); ++s)
      slots_.push_back(static_cast<int32_t>(lens.size() - s));
    SequenceBatch b;
    b.num_seqs = static_cast<int>(lens.size());
    b.cu_seqlens = offsets_;
    b.state_slot = slots_;
    for (int len : lens) b.max_seqlen = std::max(b.max_seqlen, len);
    return b;
  }

  std::mt19937 rng_{1234};
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<CudaDenseOps> gpu_;
  std::unique_ptr<Backend> cpu_;
  std::vector<int32_t> offsets_, slots_;
};

TEST_F(CudaDenseTest, GemmF32AllTransposesBetaBias) {
  for (auto [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{37, 70, 53}, {64, 128, 96}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (float beta : {0.0f, 0.5f}) {
          for (bool bias : {false, true}) {
            const std::string what = absl::StrCat(m, "x", k, "x", n, " ta=", ta, " tb=", tb,
                                                  " beta=", beta, " bias=", bias);
            Tensor a = Rand(ta ? Shape{k, m} : Shape{m, k});
            Tensor b = Rand(tb ? Shape{n, k} : Shape{k, n});
            Tensor c0 = Rand({m, n});
            Tensor bv = Rand({n});
            GemmArgs cpu{a,
                         b,
                         beta == 0.0f ? Tensor::Zeros(DType::kF32, {m, n}) : c0.Clone(),
                         ta,
                         tb,
                         1.25f,
                         beta,
                         bias ? bv : Tensor()};
            ASSERT_TRUE(cpu_->Gemm(cpu).ok()) << what;
            GemmArgs dev{Dev(a),
                         Dev(b),
                         beta == 0.0f ? Poison({m, n}) : Dev(c0),
                         ta,
                         tb,
                         1.25f,
                         beta,
                         bias ? Dev(bv) : Tensor()};
            ASSERT_TRUE(gpu_->Gemm(dev).ok()) << what;
            Expect(dev.c, cpu.c, kF32Tol, what);
          }
        }
      }
    }
  }
}

TEST_F(CudaDenseTest, GemmHalfWeightsExactAndFast) {
  const int64_t m = 33, k = 96, n = 80;
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (bool tb : {true, false}) {
      for (GemmPrecision precision : {GemmPrecision::kExact, GemmPrecision::kFast}) {
        const std::string what = absl::StrCat(std::string(DTypeName(dt)), " tb=", tb,
                                              " fast=", precision == GemmPrecision::kFast);
        Tensor a = Rand({m, k});
        Tensor b_half = Round(Rand(tb ? Shape{n, k} : Shape{k, n}), dt);
        Tensor bias = Rand({n});
        GemmArgs cpu{a,   b_half.ToF32(), Tensor::Zeros(DType::kF32, {m, n}), false, tb, 1.0f, 0.0f,
                     bias};
        ASSERT_TRUE(cpu_->Gemm(cpu).ok()) << what;
        gpu_->set_gemm_precision(precision);
        GemmArgs dev{Dev(a), Dev(b_half), Poison({m, n}), false, tb, 1.0f, 0.0f, Dev(bias)};
        ASSERT_TRUE(gpu_->Gemm(dev).ok()) << what;
        Expect(dev.c, cpu.c, precision == GemmPrecision::kExact ? kF32Tol : kHalfTol, what);
      }
    }
  }
  gpu_->set_gemm_precision(GemmPrecision::kExact);
}

TEST_F(CudaDenseTest, EmbeddingAndBackward) {
  for (int64_t width : {36, 33}) {
    const int64_t vocab = 50, n = 21;
    Tensor table = Rand({vocab, width});
    Tensor ids = RandInts(n, static_cast<int32_t>(vocab));
    EmbeddingArgs cpu{table, ids, Tensor::Zeros(DType::kF32, {n, width})};
    ASSERT_TRUE(cpu_->Embedding(cpu).ok());
    EmbeddingArgs dev{Dev(table), Dev(ids), Poison({n, width})};
    ASSERT_TRUE(gpu_->Embedding(dev).ok());
    Expect(dev.out, cpu.out, 0.0, "embedding");

    Tensor d_out = Rand({n, width}), d_table = Rand({vocab, width});
    EmbeddingBackwardArgs cpu_b{ids, d_out, d_table.Clone()};
    ASSERT_TRUE(cpu_->EmbeddingBackward(cpu_b).ok());
    EmbeddingBackwardArgs dev_b{Dev(ids), Dev(d_out), Dev(d_table)};
    ASSERT_TRUE(gpu_->EmbeddingBackward(dev_b).ok());
    Expect(dev_b.d_table, cpu_b.d_table, kF32Tol, "embedding backward");
  }
  EXPECT_TRUE(gpu_->TakeIndexFault().ok());
}

TEST_F(CudaDenseTest, OutOfRangeIdsAndTargetsAreReported) {
  Tensor table = Rand({10, 8});
  EmbeddingArgs dev{Dev(table), Dev(Ints({3, 10})), Poison({2, 8})};
  ASSERT_TRUE(gpu_->Embedding(dev).ok());
  absl::Status fault = gpu_->TakeIndexFault();
  EXPECT_EQ(fault.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(fault.message().find("Embedding: ids"), std::string::npos) << fault;
  CrossEntropyArgs ce{Dev(Rand({2, 8})), Dev(Ints({1, -1})), Poison({2}), Tensor(), 1.0f};
  ASSERT_TRUE(gpu_->CrossEntropy(ce).ok());
  fault = gpu_->TakeIndexFault();
  EXPECT_NE(fault.message().find("CrossEntropy: targets"), std::string::npos) << fault;
  EXPECT_TRUE(gpu_->TakeIndexFault().ok());
}

TEST_F(CudaDenseTest, NormForwardAndBackwardEveryMode) {
  struct Case {
    int64_t rows, cols;
    int group_size;
    bool shared_weight = false;  // a weight of one group's length
  };
  // Few groups (block teams in the forward), many groups (warp teams: with
  // 16-byte loads, and scalar for group 10), long groups (block teams, 2048).
  // The forward holds groups in registers up to 8 vectors a thread: 2056
  // and 1000 leave some threads' last vectors empty; 8200 is too long.
  for (Case cs : {Case{7, 64, 0}, Case{7, 64, 16}, Case{5, 30, 10}, Case{3, 2048, 0},
                  Case{70, 48, 0}, Case{130, 64, 16}, Case{300, 30, 10}, Case{3, 2056, 0},
                  Case{2, 8200, 0}, Case{130, 1000, 0}, Case{130, 64, 16, true},
                  Case{3, 2048, 512, true}, Case{70, 1024, 256, true}}) {
    for (NormKind kind : {NormKind::kRms, NormKind::kLayer}) {
      for (NormGate gate :
           {NormGate::kNone, NormGate::kAfter, NormGate::kBefore, NormGate::kSiluInput}) {
        for (bool weight : {true, false}) {
          const std::string what =
              absl::StrCat(cs.rows, "x", cs.cols, " group ", cs.group_size,
                           cs.shared_weight ? " shared" : "", " kind ", static_cast<int>(kind),
                           " gate ", static_cast<int>(gate), " weight ", weight);
          const Shape shape{cs.rows, cs.cols};
          Tensor x = Rand(shape, -2.0f, 2.0f),
                 w = Rand({cs.shared_weight ? cs.group_size : cs.cols}, 0.5f, 1.5f),
                 g = Rand(shape, -3.0f, 3.0f);
          NormArgs cpu{kind,
                       gate,
                       1e-5f,
                       cs.group_size,
                       x,
                       weight ? w : Tensor(),
                       NormHasGate(gate) ? g : Tensor(),
                       Tensor::Zeros(DType::kF32, shape)};
          ASSERT_TRUE(cpu_->Norm(cpu).ok()) << what;
          NormArgs dev{kind,
                       gate,
                       1e-5f,
                       cs.group_size,
                       Dev(x),
                       weight ? Dev(w) : Tensor(),
                       NormHasGate(gate) ? Dev(g) : Tensor(),
                       Poison(shape)};
          ASSERT_TRUE(gpu_->Norm(dev).ok()) << what;
          Expect(dev.y, cpu.y, kF32Tol, what);

          Tensor dy = Rand(shape), dw = Rand(w.shape());
          const bool gated = NormHasGate(gate);
          NormBackwardArgs cpu_b{cpu, dy, Tensor::Zeros(DType::kF32, shape),
                                 weight ? dw.Clone() : Tensor(),
                                 gated ? Tensor::Zeros(DType::kF32, shape) : Tensor()};
          ASSERT_TRUE(cpu_->NormBackward(cpu_b).ok()) << what;
          NormBackwardArgs dev_b{dev, Dev(dy), Poison(shape), weight ? Dev(dw) : Tensor(),
                                 gated ? Poison(shape) : Tensor()};
          ASSERT_TRUE(gpu_->NormBackward(dev_b).ok()) << what;
          Expect(dev_b.dx, cpu_b.dx, kF32Tol, what + " dx");
          if (weight) Expect(dev_b.d_weight, cpu_b.d_weight, kF32Tol, what + " d_weight");
          if (gated) Expect(dev_b.d_gate, cpu_b.d_gate, kF32Tol, what + " d_gate");
        }
      }
    }
  }
}

constexpr UnaryOp kUnaryOps[] = {UnaryOp::kAffine,     UnaryOp::kSilu,     UnaryOp::kSigmoid,
                                 UnaryOp::kLogSigmoid, UnaryOp::kSoftplus, UnaryOp::kExp,
                                 UnaryOp::kLog,        UnaryOp::kTanh,     UnaryOp::kRelu,
                                 UnaryOp::kEluPlusOne};

TEST_F(CudaDenseTest, UnaryForwardBackwardBroadcastAlias) {
  for (UnaryOp op : kUnaryOps) {
    const float lo = op == UnaryOp::kLog ? 0.1f : -4.0f, hi = op == UnaryOp::kLog ? 3.0f : 4.0f;
    const float in_scale =
        op == UnaryOp::kSoftplus ? 8.0f : 0.75f;  // softplus crosses its threshold
    for (const Shape& shape : {Shape{5, 12}, Shape{3, 7}}) {
      const std::string what = absl::StrCat("op ", static_cast<int>(op), " ", ShapeString(shape));
      Tensor x = Rand(shape, lo, hi);
      UnaryArgs cpu{op, 1.5f, -0.25f, in_scale, x, Tensor::Zeros(DType::kF32, shape)};
      ASSERT_TRUE(cpu_->Unary(cpu).ok()) << what;
      UnaryArgs dev{op, 1.5f, -0.25f, in_scale, Dev(x), Poison(shape)};
      ASSERT_TRUE(gpu_->Unary(dev).ok()) << what;
      Expect(dev.y, cpu.y, kF32Tol, what);

      Tensor dy = Rand(shape);
      UnaryBackwardArgs cpu_b{cpu, dy, Tensor::Zeros(DType::kF32, shape)};
      ASSERT_TRUE(cpu_->UnaryBackward(cpu_b).ok()) << what;
      UnaryBackwardArgs dev_b{dev, Dev(dy), Poison(shape)};
      ASSERT_TRUE(gpu_->UnaryBackward(dev_b).ok()) << what;
      Expect(dev_b.dx, cpu_b.dx, kF32Tol, what + " backward");

      // In place.
      UnaryArgs alias{op, 1.5f, -0.25f, in_scale, Dev(x), Tensor()};
      alias.y = alias.x;
      ASSERT_TRUE(gpu_->Unary(alias).ok()) << what;
      Expect(alias.y, cpu.y, kF32Tol, what + " in place");
    }
    // Broadcast [4,1,3] → [4,5,3].
    Tensor x = Rand({4, 1, 3}, lo, hi);
    UnaryArgs cpu{op, 1.0f, 0.5f, 1.0f, x, Tensor::Zeros(DType::kF32, {4, 5, 3})};
    ASSERT_TRUE(cpu_->Unary(cpu).ok());
    UnaryArgs dev{op, 1.0f, 0.5f, 1.0f, Dev(x), Poison({4, 5, 3})};
    ASSERT_TRUE(gpu_->Unary(dev).ok());
    Expect(dev.y, cpu.y, kF32Tol, absl::StrCat("op ", static_cast<int>(op), " broadcast"));
  }
}

TEST_F(CudaDenseTest, BinaryWithBroadcasting) {
  struct Case {
    Shape a, b, y;
  };
  for (BinaryOp op :
       {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kDiv, BinaryOp::kSiluMul}) {
    for (const Case& cs : {Case{{6, 8}, {6, 8}, {6, 8}}, Case{{5, 7}, {5, 7}, {5, 7}},
                           Case{{4, 1, 6}, {1, 5, 6}, {4, 5, 6}}, Case{{3, 5}, {3, 1}, {3, 5}}}) {
      const std::string what =
          absl::StrCat("op ", static_cast<int>(op), " ", ShapeString(cs.a), " ", ShapeString(cs.b));
      Tensor a = Rand(cs.a), b = Rand(cs.b, 0.5f, 2.0f);
      BinaryArgs cpu{op, a, b, Tensor::Zeros(DType::kF32, cs.y)};
      ASSERT_TRUE(cpu_->Binary(cpu).ok()) << what;
      BinaryArgs dev{op, Dev(a), Dev(b), Poison(cs.y)};
      ASSERT_TRUE(gpu_->Binary(dev).ok()) << what;
      Expect(dev.y, cpu.y, kF32Tol, what);
      if (cs.a == cs.y) {
        BinaryArgs alias{op, Dev(a), Dev(b), Tensor()};
        alias.y = alias.a;
        ASSERT_TRUE(gpu_->Binary(alias).ok()) << what;
        Expect(alias.y, cpu.y, kF32Tol, what + " in place");
      }
    }
  }
}

TEST_F(CudaDenseTest, ReduceSumEveryPattern) {
  struct Case {
    Shape x, y;
  };
  for (const Case& cs :
       {Case{{4, 5, 6}, {1, 5, 1}}, Case{{4, 5, 6}, {4, 1, 6}}, Case{{4, 5, 6}, {1, 1, 1}},
        Case{{4, 5, 6}, {4, 5, 6}}, Case{{4, 5, 6}, {4, 5, 1}}, Case{{4096, 8}, {1, 8}},
        Case{{3, 1000}, {3, 1}}, Case{{2, 300, 7}, {1, 1, 7}}}) {
    const std::string what = absl::StrCat(ShapeString(cs.x), " -> ", ShapeString(cs.y));
    Tensor x = Rand(cs.x);
    ReduceSumArgs cpu{x, Tensor::Zeros(DType::kF32, cs.y)};
    ASSERT_TRUE(cpu_->ReduceSum(cpu).ok()) << what;
    ReduceSumArgs dev{Dev(x), Poison(cs.y)};
    ASSERT_TRUE(gpu_->ReduceSum(dev).ok()) << what;
    Expect(dev.y, cpu.y, kF32Tol, what);
  }
}

TEST_F(CudaDenseTest, CopyColumns) {
  for (int64_t src_col : {4, 3}) {
    for (bool accumulate : {false, true}) {
      const std::string what = absl::StrCat("src_col ", src_col, " accumulate ", accumulate);
      Tensor src = Rand({2, 3, 20}), dst = Rand({6, 12});
      CopyColumnsArgs cpu{src, src_col, dst.Clone(), 8, 4, accumulate};
      ASSERT_TRUE(cpu_->CopyColumns(cpu).ok()) << what;
      CopyColumnsArgs dev{Dev(src), src_col, Dev(dst), 8, 4, accumulate};
      ASSERT_TRUE(gpu_->CopyColumns(dev).ok()) << what;
      Expect(dev.dst, cpu.dst, kF32Tol, what);
    }
  }
}

TEST_F(CudaDenseTest, Conv1dForwardBackwardWithWindows) {
  struct Case {
    std::vector<int> lens;
    int64_t channels, width;
  };
  for (const Case& cs : {Case{{5, 1, 0, 9}, 24, 4}, Case{{200, 150}, 16, 3}, Case{{2, 3}, 5, 1}}) {
    for (bool zero_state : {false, true}) {
      for (bool silu : {false, true}) {
        for (bool bias : {true, false}) {
          const std::string what = absl::StrCat("C ", cs.channels, " W ", cs.width, " zero ",
                                                zero_state, " silu ", silu, " bias ", bias);
          SequenceBatch batch = Batch(cs.lens);
          batch.zero_initial_state = zero_state;
          const int64_t n = offsets_.back(), c = cs.channels, w = cs.width;
          const int64_t pool = static_cast<int64_t>(cs.lens.size()) + 1;
          Tensor x = Rand({n, c}), weight = Rand({c, w}), b = Rand({c}),
                 state = Rand({pool, c, w - 1});
          Conv1dArgs cpu{x,
                         weight,
                         bias ? b : Tensor(),
                         silu,
                         Tensor::Zeros(DType::kF32, {n, c}),
                         state.Clone()};
          ASSERT_TRUE(cpu_->Conv1d(batch, cpu).ok()) << what;
          Conv1dArgs dev{Dev(x), Dev(weight),    bias ? Dev(b) : Tensor(),
                         silu,   Poison({n, c}), Dev(state)};
          ASSERT_TRUE(gpu_->Conv1d(batch, dev).ok()) << what;
          Expect(dev.y, cpu.y, kF32Tol, what + " y");
          Expect(dev.state, cpu.state, 0.0, what + " state");

          // Backward from the pre-forward windows.
          cpu.state = state.Clone();
          dev.state = Dev(state);
          Tensor dy = Rand({n, c}), dw = Rand({c, w}), db = Rand({c});
          Conv1dBackwardArgs cpu_b{cpu, dy, Tensor::Zeros(DType::kF32, {n, c}), dw.Clone(),
                                   bias ? db.Clone() : Tensor()};
          ASSERT_TRUE(cpu_->Conv1dBackward(batch, cpu_b).ok()) << what;
          Conv1dBackwardArgs dev_b{dev, Dev(dy), Poison({n, c}), Dev(dw),
                                   bias ? Dev(db) : Tensor()};
          ASSERT_TRUE(gpu_->Conv1dBackward(batch, dev_b).ok()) << what;
          Expect(dev_b.dx, cpu_b.dx, kF32Tol, what + " dx");
          Expect(dev_b.d_weight, cpu_b.d_weight, kF32Tol, what + " d_weight");
          if (bias) Expect(dev_b.d_bias, cpu_b.d_bias, kF32Tol, what + " d_bias");
        }
      }
    }
  }
}

TEST_F(CudaDenseTest, RotaryEveryLayout) {
  const int64_t n = 6, heads = 3, dim = 16;
  Tensor positions = RandInts(n, 5000);
  for (int rotary_dim : {8, 16}) {
    for (bool interleaved : {false, true}) {
      for (bool inverse : {false, true}) {
        const std::string what =
            absl::StrCat("R ", rotary_dim, " interleaved ", interleaved, " inverse ", inverse);
        Tensor x = Rand({n, heads, dim});
        RotaryArgs cpu{rotary_dim,
                       10000.0f,
                       interleaved,
                       inverse,
                       x,
                       positions,
                       Tensor::Zeros(DType::kF32, {n, heads, dim})};
        ASSERT_TRUE(cpu_->Rotary(cpu).ok()) << what;
        RotaryArgs dev{rotary_dim,
                       10000.0f,
                       interleaved,
                       inverse,
                       Dev(x),
                       Dev(positions),
                       Poison({n, heads, dim})};
        ASSERT_TRUE(gpu_->Rotary(dev).ok()) << what;
        Expect(dev.y, cpu.y, kF32Tol, what);
        dev.y = dev.x;  // in place
        ASSERT_TRUE(gpu_->Rotary(dev).ok()) << what;
        Expect(dev.y, cpu.y, kF32Tol, what + " in place");
      }
    }
  }
}

TEST_F(CudaDenseTest, AttentionPrefillAndDecodeWithCache) {
  struct Case {
    std::vector<int> lens;
    std::vector<int32_t> starts;
    int head_dim;
    bool device_offsets;
  };
  for (const Case& cs :
       {Case{{5, 1, 12, 0}, {3, 7, 0, 2}, 32, false}, Case{{4, 6}, {9, 0}, 18, true},
        Case{{1, 1, 1}, {20, 0, 5}, 64, true}, Case{{40}, {0}, 128, false}}) {
    const std::string what = absl::StrCat("lens ", cs.lens.size(), " head_dim ", cs.head_dim);
    SequenceBatch batch = Batch(cs.lens);
    const int heads = 4, kv_heads = 2;
    const int64_t n = offsets_.back(), d = cs.head_dim, context = 48;
    const int64_t pool = static_cast<int64_t>(cs.lens.size()) + 1;
    Tensor q = Rand({n, heads, d}), k = Rand({n, kv_heads, d}), v = Rand({n, kv_heads, d});
    Tensor k_cache = Rand({pool, context, kv_heads, d}),
           v_cache = Rand({pool, context, kv_heads, d});
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    AttentionArgs cpu{heads,
                      kv_heads,
                      static_cast<int>(d),
                      scale,
                      q,
                      k,
                      v,
                      Tensor::Zeros(DType::kF32, {n, heads, d}),
                      k_cache.Clone(),
                      v_cache.Clone(),
                      cs.starts,
                      nullptr};
    ASSERT_TRUE(cpu_->Attention(batch, cpu).ok()) << what;
    Tensor offsets_dev = Dev(Ints(offsets_)), slots_dev = Dev(Ints(slots_)),
           starts_dev = Dev(Ints(cs.starts));
    if (cs.device_offsets) {
      batch.cu_seqlens_device = offsets_dev.data<int32_t>();
      batch.state_slot_device = slots_dev.data<int32_t>();
    }
    AttentionArgs dev{heads,
                      kv_heads,
                      static_cast<int>(d),
                      scale,
                      Dev(q),
                      Dev(k),
                      Dev(v),
                      Poison({n, heads, d}),
                      Dev(k_cache),
                      Dev(v_cache),
                      cs.starts,
                      cs.device_offsets ? starts_dev.data<int32_t>() : nullptr};
    ASSERT_TRUE(gpu_->Attention(batch, dev).ok()) << what;
    Expect(dev.o, cpu.o, kF32Tol, what + " o");
    Expect(dev.k_cache, cpu.k_cache, 0.0, what + " k_cache");
    Expect(dev.v_cache, cpu.v_cache, 0.0, what + " v_cache");
  }
}

TEST_F(CudaDenseTest, AttentionBackward) {
  for (int head_dim : {16, 18}) {
    SequenceBatch batch = Batch({6, 1, 9, 0});
    const int heads = 4, kv_heads = 2;
    const int64_t n = offsets_.back(), d = head_dim;
    const std::vector<int32_t> starts(4, 0);
    Tensor q = Rand({n, heads, d}), k = Rand({n, kv_heads, d}), v = Rand({n, kv_heads, d});
    Tensor d_o = Rand({n, heads, d});
    AttentionArgs fwd_cpu{heads, kv_heads, head_dim, 0.3f,     q,      k,
                          v,     Tensor(), Tensor(), Tensor(), starts, nullptr};
    AttentionBackwardArgs cpu{fwd_cpu, d_o, Tensor::Zeros(DType::kF32, {n, heads, d}),
                              Tensor::Zeros(DType::kF32, {n, kv_heads, d}),
                              Tensor::Zeros(DType::kF32, {n, kv_heads, d})};
    ASSERT_TRUE(cpu_->AttentionBackward(batch, cpu).ok());
    AttentionArgs fwd_dev{heads,  kv_heads, head_dim, 0.3f,     Dev(q), Dev(k),
                          Dev(v), Tensor(), Tensor(), Tensor(), starts, nullptr};
    AttentionBackwardArgs dev{fwd_dev, Dev(d_o), Poison({n, heads, d}), Poison({n, kv_heads, d}),
                              Poison({n, kv_heads, d})};
    ASSERT_TRUE(gpu_->AttentionBackward(batch, dev).ok());
    const std::string what = absl::StrCat("head_dim ", head_dim);
    Expect(dev.dq, cpu.dq, kF32Tol, what + " dq");
    Expect(dev.dk, cpu.dk, kF32Tol, what + " dk");
    Expect(dev.dv, cpu.dv, kF32Tol, what + " dv");
  }
}

TEST_F(CudaDenseTest, CrossEntropyLossAndGradient) {
  for (int64_t vocab : {1000, 37}) {
    for (bool grad : {true, false}) {
      const int64_t n = 7;
      Tensor logits = Rand({n, vocab}, -5.0f, 5.0f);
      Tensor targets = RandInts(n, static_cast<int32_t>(vocab));
      CrossEntropyArgs cpu{logits, targets, Tensor::Zeros(DType::kF32, {n}),
                           grad ? Tensor::Zeros(DType::kF32, {n, vocab}) : Tensor(), 0.5f};
      ASSERT_TRUE(cpu_->CrossEntropy(cpu).ok());
      CrossEntropyArgs dev{Dev(logits), Dev(targets), Poison({n}),
                           grad ? Poison({n, vocab}) : Tensor(), 0.5f};
      ASSERT_TRUE(gpu_->CrossEntropy(dev).ok());
      Expect(dev.losses, cpu.losses, kF32Tol, absl::StrCat("V ", vocab, " losses"));
      if (grad) Expect(dev.d_logits, cpu.d_logits, kF32Tol, absl::StrCat("V ", vocab, " d_logits"));
    }
  }
}

TEST_F(CudaDenseTest, ValidationNamesTheField) {
  Tensor a = Dev(Rand({4, 8}));
  GemmArgs host_b;
  host_b.a = a;
  host_b.b = Rand({6, 8});
  host_b.c = Poison({4, 6});
  absl::Status st = gpu_->Gemm(host_b);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("b: not a CUDA tensor"), std::string::npos) << st;

  GemmArgs mismatch = host_b;
  mismatch.b = Dev(Rand({6, 7}));
  st = gpu_->Gemm(mismatch);
  EXPECT_NE(st.message().find("Gemm: b: inner dimension"), std::string::npos) << st;

  NormArgs norm{NormKind::kRms, NormGate::kNone, 1e-6f, 3, a, Tensor(), Tensor(), Poison({4, 8})};
  st = gpu_->Norm(norm);
  EXPECT_NE(st.message().find("group_size"), std::string::npos) << st;

  SequenceBatch batch = Batch({2, 2});
  const std::vector<int32_t> starts = {0, 0};
  AttentionArgs att{4,
                    3,
                    8,
                    1.0f,
                    Dev(Rand({4, 4, 8})),
                    Dev(Rand({4, 3, 8})),
                    Dev(Rand({4, 3, 8})),
                    Poison({4, 4, 8}),
                    Dev(Rand({3, 8, 3, 8})),
                    Dev(Rand({3, 8, 3, 8})),
                    starts,
                    nullptr};
  st = gpu_->Attention(batch, att);
  EXPECT_NE(st.message().find("kv_heads"), std::string::npos) << st;
}

}  // namespace
}  // namespace lair::kernels::cuda
