// CudaDenseOps: the dense operations of kernels/dense.h on one CUDA stream.
//
// One method per Backend dense method, taking the same argument structs and
// keeping their contracts (shapes, dtypes, what is written or accumulated,
// InvalidArgument naming the bad field before anything is launched). Every
// tensor must be a CUDA tensor of the stream's device. Methods return once
// their kernels are queued; launch errors surface at the latest in the
// caller's next stream synchronization.
//
// Arithmetic is fp32 throughout (reductions that the CPU reference keeps in
// double are fp32 trees here, or double where a column runs over many rows),
// so F32 runs match kernels/cpu/dense.cc to rounding (relative error ~1e-6).
// Gemm follows GemmPrecision below.
//
// Differences from the CPU reference, all from data that lives on the device:
//   * token ids (Embedding, EmbeddingBackward) and targets (CrossEntropy) are
//     not read on the host. A value out of range is skipped by the kernel
//     (Embedding and CrossEntropy write NaN in its row instead) and recorded;
//     TakeIndexFault reports it as InvalidArgument naming the op and field.
//   * Attention needs a head_dim of at most kMaxHeadDim, Rotary a rotary_dim
//     of at most kMaxRotaryDim, broadcasting ops a rank of at most kMaxRank.
//   * EmbeddingBackward adds with atomics (order-dependent rounding); every
//     other op is deterministic (column sums run in fixed split order).
//
// Thread safety: used by one thread at a time, like the Backend that owns it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>

#include "core/status.h"
#include "kernels/dense.h"
#include "kernels/mixer.h"

namespace lair::kernels::cuda {

namespace dense {
class DeviceScratch;
class GemmRunner;
}  // namespace dense

// How Gemm multiplies.
enum class GemmPrecision {
  // fp32 products and sums everywhere (no TF32). F32 weights: cuBLASLt SGEMM.
  // BF16/F16 weights are widened exactly to fp32 in column blocks of a
  // workspace (at most 64 MiB) and multiplied as F32. Matches the CPU
  // reference to rounding; what `verify --device cuda` needs.
  kExact,
  // Tensor cores. F32 weights: TF32 inputs (10-bit mantissa), fp32 sums.
  // BF16/F16 weights: the activations are rounded to the weight dtype (8 / 11
  // significant bits; F16 overflows to inf above 65504) and multiplied on bf16/f16
  // tensor cores with fp32 accumulation and fp32 output. Relative error of a
  // layer output ~3e-3 for BF16. The serving path.
  kFast,
};
// Products of few rows (decode steps: up to 8 in kExact, 2 in kFast, where
// cuBLASLt measured faster beyond) with BF16/F16 weights in the nn.Linear
// layout run a GEMV kernel that streams the weights once in fp32
// arithmetic: exact products, fp32 sums, no rounding of the activations.

class CudaDenseOps {
 public:
  static constexpr int kMaxHeadDim = 256;
  static constexpr int kMaxRotaryDim = 512;
  static constexpr int kMaxRank = 8;

  // Creates the cuBLASLt handle and its workspace on `stream`'s device (the
  // current device). `stream` must outlive the object: device memory is
  // released on it by the destructor.
  static absl::StatusOr<std::unique_ptr<CudaDenseOps>> Create(
      cudaStream_t stream, GemmPrecision precision = GemmPrecision::kExact);

  CudaDenseOps(const CudaDenseOps&) = delete;
  CudaDenseOps& operator=(const CudaDenseOps&) = delete;
  ~CudaDenseOps();

  GemmPrecision gemm_precision() const { return precision_; }
  void set_gemm_precision(GemmPrecision precision) { precision_ = precision; }

  // kernels/dense.h, one to one with Backend. GemmArgs::b may be F32, BF16
  // or F16; every other float tensor is F32.
  absl::Status Gemm(const GemmArgs& args);
  absl::Status LinearGroup(const LinearGroupArgs& args);
  // Backend::ProductOutputDType: BF16 for the rows that cuBLASLt takes on
  // the fast path, after rounding its activations to bf16.
  DType ProductOutputDType(int64_t rows) const;
  // A SwiGLU MLP where TakesSwiGlu (16-bit weights of one type): decode rows
  // through one GEMV for gate and up that writes silu(gate) ∘ up; prefill
  // rows (fast precision) with their [M, F] intermediates in 16 bits. The
  // backend runs the others as two LinearGroups.
  bool TakesSwiGlu(const SwiGluArgs& args) const;
  absl::Status SwiGlu(const SwiGluArgs& args);
  absl::Status Embedding(const EmbeddingArgs& args);
  absl::Status EmbeddingBackward(const EmbeddingBackwardArgs& args);
  absl::Status Norm(const NormArgs& args);
  absl::Status NormBackward(const NormBackwardArgs& args);
  absl::Status Unary(const UnaryArgs& args);
  absl::Status UnaryBackward(const UnaryBackwardArgs& args);
  absl::Status Binary(const BinaryArgs& args);
  absl::Status ReduceSum(const ReduceSumArgs& args);
  absl::Status CopyColumns(const CopyColumnsArgs& args);
  // The batch's device offsets and slots are used when set; else the host
  // spans are copied to the device here and the stream is synchronized
  // before returning (the spans may change afterwards).
  absl::Status Conv1d(const SequenceBatch& batch, const Conv1dArgs& args);
  absl::Status Conv1dBackward(const SequenceBatch& batch, const Conv1dBackwardArgs& args);
  absl::Status Rotary(const RotaryArgs& args);
  // start_positions is checked on the host; start_positions_device is used
  // when set, else the host span is copied like the batch's.
  absl::Status Attention(const SequenceBatch& batch, const AttentionArgs& args);
  absl::Status AttentionBackward(const SequenceBatch& batch, const AttentionBackwardArgs& args);
  absl::Status CrossEntropy(const CrossEntropyArgs& args);

  // InvalidArgument naming each op whose device-side ids or targets were
  // out of range since the last call (and clears the record), or OK. Only
  // when such an op was queued since the last call (directly or by
  // NoteReplay) is there a record to read: then it waits for the stream and
  // copies it back; otherwise it returns OK at once.
  absl::Status TakeIndexFault();
  // Records that a replayed CUDA graph queued ops, which may have faulted.
  void NoteReplay() { fault_unread_ = true; }

  // Changes whenever scratch memory of any CudaDenseOps (its own or its
  // GEMM's) moves; a CUDA graph that captured dense ops is stale after that.
  // Scratch only grows, so after one run of a step shape it stays put.
  static uint64_t ScratchEpoch();

 private:
  CudaDenseOps(cudaStream_t stream, GemmPrecision precision);

  // Device copies of a batch's offsets and slots (and attention's start
  // positions): the caller's when given, else uploads into `scratch`.
  struct DeviceInts {
    const int32_t* cu_seqlens = nullptr;
    const int32_t* slots = nullptr;
    const int32_t* starts = nullptr;
  };
  absl::StatusOr<DeviceInts> UploadBatch(const SequenceBatch& batch, bool with_slots,
                                         std::span<const int32_t> starts,
                                         const int32_t* starts_device, char** scratch);

  // Scratch of at least `bytes` on the stream (stream-ordered reuse).
  absl::StatusOr<char*> Scratch(size_t bytes);

  cudaStream_t stream_;  // not owned
  GemmPrecision precision_;
  int sm_count_ = 0;           // of the current device at Create
  int* fault_ = nullptr;       // device word: bits of dense::Fault
  bool fault_unread_ = false;  // an op that may fault queued since TakeIndexFault
  std::unique_ptr<dense::DeviceScratch> scratch_;
  std::unique_ptr<dense::GemmRunner> gemm_;
};

}  // namespace lair::kernels::cuda
