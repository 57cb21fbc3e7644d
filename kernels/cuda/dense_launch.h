// Launch contracts of the dense kernels behind CudaDenseOps (dense_ops.h).
//
// CudaDenseOps validates every argument on the host and fills one of the
// plain parameter structs below; the launchers only size the grid and queue
// the kernels on `stream`, returning the launch error. Pointers are device
// memory; strides and counts are in elements. The math of each op is that of
// kernels/dense.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>

#include "core/dtype.h"
#include "core/status.h"
#include "kernels/cuda/dense_ops.h"
#include "kernels/dense.h"

namespace lair::kernels::cuda::dense {

constexpr int kMaxRank = CudaDenseOps::kMaxRank;

// Bits of the device fault word (CudaDenseOps::TakeIndexFault).
enum Fault : int {
  kFaultEmbeddingIds = 1,
  kFaultEmbeddingBackwardIds = 2,
  kFaultCrossEntropyTargets = 4,
};

// Device memory that grows on demand and is released on its stream; a new
// Get may move it, and stream order keeps earlier kernels' reads valid.
class DeviceScratch {
 public:
  explicit DeviceScratch(cudaStream_t stream) : stream_(stream) {}
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  ~DeviceScratch();

  // At least `bytes` (256-byte aligned), valid until the next Get.
  absl::StatusOr<char*> Get(size_t bytes);

 private:
  cudaStream_t stream_;
  char* ptr_ = nullptr;
  size_t size_ = 0;
};

// Carves 256-byte aligned regions out of one scratch block.
class ScratchLayout {
 public:
  // Reserves `count` elements of T; Take returns them in the same order.
  template <typename T>
  void Add(int64_t count) {
    bytes_ += Round(static_cast<size_t>(count) * sizeof(T));
  }
  size_t bytes() const { return bytes_; }
  template <typename T>
  static T* Take(char** cursor, int64_t count) {
    T* p = reinterpret_cast<T*>(*cursor);
    *cursor += Round(static_cast<size_t>(count) * sizeof(T));
    return p;
  }

 private:
  static size_t Round(size_t b) { return (b + 255) / 256 * 256; }
  size_t bytes_ = 0;
};

// ---------------------------------------------------------------------------
// GEMM (dense_gemm.cu): row-major c[m,n] = alpha·op(a)·op(b) + beta·c + bias.
struct GemmCall {
  int64_t m = 0, n = 0, k = 0;
  // [m,k], or [k,m] when trans_a; null in a RunGroup with a_norm whose x is
  // 16-bit (the products read the norm, which RunGroup forms)
  const float* a = nullptr;
  bool trans_a = false;
  const void* b = nullptr;  // [n,k] when trans_b, else [k,n]
  DType b_type = DType::kF32;
  bool trans_b = true;
  float* c = nullptr;  // [m,n]
  float alpha = 1.0f, beta = 0.0f;
  const float* bias = nullptr;      // [n] or null
  Activation act;                   // then c ← act(c) (kernels/dense.h)
  const float* residual = nullptr;  // [m,n] or null: then c ← c + residual (c may alias it)
  // [m,k] or null (RunGroup only, not trans_a): the product reads
  // silu(a_gate) ∘ a in place of a.
  const float* a_gate = nullptr;
  // [m,n] of c16_type (BF16 or F16) or null (RunGroup only, no residual):
  // the output rounded to 16 bits after the activation, instead of c.
  void* c16 = nullptr;
  DType c16_type = DType::kF32;
  // [m,k] of b_type or null (RunGroup only): the activations formed and
  // rounded to the weights' type, which the decode ring kernel reads instead
  // of a (ReadsRoundedActivations).
  const void* a_rounded = nullptr;
  // RunGroup only, up to kGemvNormMaxRows rows (dense_small_gemm.h; the
  // GEMV takes them): the product reads each row of a under an RMS norm
  // without weight, a / √(mean(a²) + a_rms_eps), as a scale of its outputs
  // that the GEMV forms itself (a block norm whose weight is folded into
  // b's columns).
  bool a_rms = false;
  float a_rms_eps = 0.0f;
};

struct NormParams;

// Owns the cuBLASLt handle, its workspace, a scratch for converted operands
// and a cache of planned shapes.
class GemmRunner {
 public:
  static absl::StatusOr<std::unique_ptr<GemmRunner>> Create(cudaStream_t stream);
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  absl::Status Run(const GemmCall& call, GemmPrecision precision);
  // Several calls, in order; those that read the same activations may share
  // one launch (decode-sized rows) or one rounding of the activations. With
  // `a_norm` (whose x is the calls' shared a, y not read) they read the
  // norm of a, which the rounding pass forms.
  absl::Status RunGroup(std::span<const GemmCall> group, GemmPrecision precision,
                        const NormParams* a_norm = nullptr);
  // A SwiGLU MLP's gate, up and down calls (16-bit weights of one type; the
  // down call's a unset), reading a normalized first with a_norm. Rows the
  // decode GEMV or ring kernel takes: gate and up in one launch that writes
  // silu(gate) ∘ up (LaunchSiluPair; rounded to the weights' type at the
  // ring's rows), which the down product reads. Prefill rows (fast
  // precision): gate and up read a rounded to the weights' type and write
  // their [m, f] outputs in that type, which the down product reads as
  // silu(gate) ∘ up formed in place.
  // REQUIRES: TakesSwiGlu(calls, precision).
  absl::Status RunSwiGlu(std::span<const GemmCall, 3> calls, GemmPrecision precision,
                         const NormParams* a_norm);
  // Whether RunSwiGlu takes the calls: the GEMV or the ring kernel takes gate
  // and up as a pair (TakesSiluPair; the ring's pair wants a down product of
  // the ring too), or fast precision and rows that no decode kernel takes
  // (SmallProductFor).
  static bool TakesSwiGlu(std::span<const GemmCall, 3> calls, GemmPrecision precision);

 private:
  absl::Status RunOne(const GemmCall& call, GemmPrecision precision);

  struct Impl;
  explicit GemmRunner(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------
// Elementwise (dense_elementwise.cu).

// An output index space of `rank` dims and, per operand, its strides over it
// (0 along broadcast dimensions).
struct BroadcastIndex {
  int rank = 0;
  int64_t shape[kMaxRank] = {};
  int64_t stride_a[kMaxRank] = {};
  int64_t stride_b[kMaxRank] = {};
};

struct UnaryParams {
  UnaryOp op = UnaryOp::kAffine;
  float alpha = 1.0f, beta = 0.0f, in_scale = 1.0f;
  const float* x = nullptr;
  float* y = nullptr;
  int64_t count = 0;       // elements of y
  bool broadcast = false;  // x read through index.stride_a, else x has y's shape
  BroadcastIndex index;
};
cudaError_t LaunchUnary(const UnaryParams& p, cudaStream_t stream);

struct UnaryBackwardParams {
  UnaryOp op = UnaryOp::kAffine;
  float alpha = 1.0f, in_scale = 1.0f;
  const float* x = nullptr;
  const float* d_y = nullptr;
  float* dx = nullptr;
  int64_t count = 0;
};
cudaError_t LaunchUnaryBackward(const UnaryBackwardParams& p, cudaStream_t stream);

struct BinaryParams {
  BinaryOp op = BinaryOp::kAdd;
  const float* a = nullptr;
  const float* b = nullptr;
  float* y = nullptr;
  int64_t count = 0;
  bool broadcast = false;  // a, b read through index.stride_a / stride_b
  BroadcastIndex index;
};
cudaError_t LaunchBinary(const BinaryParams& p, cudaStream_t stream);

// y[o] = Σ_r x[kept(o) + reduced(r)]: o runs over y (x's strides of the kept
// dims over y's shape), r over the reduced dims, the innermost of which is
// held apart (inner_count, inner_stride; extent 1 when nothing is reduced).
struct ReduceSumParams {
  const float* x = nullptr;
  float* y = nullptr;
  int64_t outputs = 0, reduce_count = 0;
  int kept_rank = 0, outer_rank = 0;
  int64_t kept_shape[kMaxRank] = {}, kept_stride[kMaxRank] = {};
  int64_t outer_shape[kMaxRank] = {}, outer_stride[kMaxRank] = {};
  int64_t inner_count = 1, inner_stride = 0;
  int splits = 1;             // chunks of the reduced range
  double* partial = nullptr;  // [splits, outputs] when splits > 1
};
cudaError_t LaunchReduceSum(const ReduceSumParams& p, cudaStream_t stream);

struct CopyColumnsParams {
  const float* src = nullptr;
  float* dst = nullptr;
  int64_t rows = 0, src_cols = 0, dst_cols = 0;
  int64_t src_col = 0, dst_col = 0, width = 0;
  bool accumulate = false;
};
cudaError_t LaunchCopyColumns(const CopyColumnsParams& p, cudaStream_t stream);

struct EmbeddingParams {
  const float* table = nullptr;  // [rows, width]
  const int32_t* ids = nullptr;  // [count]
  float* out = nullptr;          // [count, width]
  int64_t rows = 0, width = 0, count = 0;
  int* fault = nullptr;
};
cudaError_t LaunchEmbedding(const EmbeddingParams& p, cudaStream_t stream);

struct EmbeddingBackwardParams {
  const int32_t* ids = nullptr;  // [count]
  const float* d_out = nullptr;  // [count, width]
  float* d_table = nullptr;      // [rows, width]
  int64_t rows = 0, width = 0, count = 0;
  int* fault = nullptr;
};
cudaError_t LaunchEmbeddingBackward(const EmbeddingBackwardParams& p, cudaStream_t stream);

// inv_freq[i] = 1 / theta^(2i/rotary_dim), computed on the host exactly as
// the CPU reference does, so angles agree bit for bit.
struct RotaryParams {
  const float* x = nullptr;
  const int32_t* positions = nullptr;
  float* y = nullptr;  // may equal x
  int64_t tokens = 0;
  int heads = 0, dim = 0, rotary_dim = 0;
  bool interleaved = false, inverse = false;
  float inv_freq[CudaDenseOps::kMaxRotaryDim / 2] = {};
};
cudaError_t LaunchRotary(const RotaryParams& p, cudaStream_t stream);

// ---------------------------------------------------------------------------
// Normalization (dense_norm.cu). Groups of `group` columns of [rows, cols].
struct NormParams {
  NormKind kind = NormKind::kRms;
  NormGate gate_mode = NormGate::kNone;
  float eps = 0.0f;
  int64_t rows = 0, cols = 0, group = 0;
  const void* x = nullptr;        // [rows, cols] of x_type
  DType x_type = DType::kF32;     // kF32, or forward kBF16 / kF16 (a product's 16-bit output)
  const float* weight = nullptr;  // [cols], [group] when shared_weight, or null
  bool shared_weight = false;     // one weight for every group of a row (a per-head norm)
  const void* gate = nullptr;     // [rows, cols] of gate_type when gated
  DType gate_type = DType::kF32;  // kF32, or kAfter's forward kBF16 (a product's output)
  void* y = nullptr;              // [rows, cols] of y_type
  DType y_type = DType::kF32;     // kF32, or kBF16 / kF16 (a product's rounded operand)
};
cudaError_t LaunchNorm(const NormParams& p, cudaStream_t stream);

struct NormBackwardParams {
  NormParams fwd;  // fwd.y unused
  const float* d_y = nullptr;
  float* dx = nullptr;
  float* d_gate = nullptr;    // or null
  float* d_weight = nullptr;  // accumulated, or null
  float2* stats = nullptr;    // [rows·cols/group] (mean, rstd) when d_weight
  int splits = 1;             // row chunks of the d_weight column sums
  double* partial = nullptr;  // [splits, cols] when splits > 1
};
cudaError_t LaunchNormBackward(const NormBackwardParams& p, cudaStream_t stream);

// ---------------------------------------------------------------------------
// Causal depthwise conv1d over packed sequences (dense_conv.cu).
struct ConvParams {
  int num_seqs = 0;
  int64_t tokens = 0, channels = 0, width = 0;
  const int32_t* cu_seqlens = nullptr;  // [num_seqs + 1]
  const int32_t* slots = nullptr;       // [num_seqs]
  bool zero_initial_state = false;
  const float* x = nullptr;       // [tokens, channels]
  const float* weight = nullptr;  // [channels, width]
  const float* bias = nullptr;    // [channels] or null
  bool silu = false;
  float* y = nullptr;
  float* state = nullptr;  // [slots, channels, width − 1]
};
cudaError_t LaunchConv1d(const ConvParams& p, cudaStream_t stream);

struct ConvBackwardParams {
  ConvParams fwd;  // fwd.y unused, fwd.state read only
  const float* d_y = nullptr;
  float* dx = nullptr;
  float* d_weight = nullptr;  // accumulated [channels, width]
  float* d_bias = nullptr;    // accumulated [channels] or null
  float* d_pre = nullptr;     // scratch [tokens, channels]
  int splits = 1;             // token chunks of the weight sums
  double* partial = nullptr;  // [splits, channels·(width + 1)] when splits > 1
};
cudaError_t LaunchConv1dBackward(const ConvBackwardParams& p, cudaStream_t stream);

// ---------------------------------------------------------------------------
// Causal softmax attention with GQA (dense_attention.cu).
struct AttentionParams {
  int num_seqs = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t tokens = 0;
  float scale = 1.0f;
  const int32_t* cu_seqlens = nullptr;
  const int32_t* slots = nullptr;
  const int32_t* starts = nullptr;  // tokens already cached per sequence
  const float* q = nullptr;         // [tokens, heads, head_dim]
  const float* k = nullptr;         // [tokens, kv_heads, head_dim]
  const float* v = nullptr;
  float* o = nullptr;
  float* k_cache = nullptr;  // [slots, max_context, kv_heads, head_dim]
  float* v_cache = nullptr;
  int64_t max_context = 0;
};
cudaError_t LaunchAttention(const AttentionParams& p, cudaStream_t stream);

struct AttentionBackwardParams {
  int num_seqs = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t tokens = 0;
  float scale = 1.0f;
  const int32_t* cu_seqlens = nullptr;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* d_o = nullptr;
  float* dq = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;
  float* lse = nullptr;    // scratch [tokens, heads]: log Σ exp(scores)
  float* delta = nullptr;  // scratch [tokens, heads]: Σ_j p_j dp_j
};
cudaError_t LaunchAttentionBackward(const AttentionBackwardParams& p, cudaStream_t stream);

// ---------------------------------------------------------------------------
// Softmax cross-entropy (dense_loss.cu).
struct CrossEntropyParams {
  const float* logits = nullptr;  // [rows, vocab]
  const int32_t* targets = nullptr;
  float* losses = nullptr;
  float* d_logits = nullptr;  // or null
  int64_t rows = 0, vocab = 0;
  float grad_scale = 1.0f;
  int* fault = nullptr;
};
cudaError_t LaunchCrossEntropy(const CrossEntropyParams& p, cudaStream_t stream);

}  // namespace lair::kernels::cuda::dense
