// Backend: the one interface between model code and the hardware.
//
// The model code in models/ is written once against this interface. The CPU
// backend (kernels/cpu/) is the exact fp32 reference, built on OpenBLAS; the
// CUDA backend (kernels/cuda/) runs the same operations on a GPU. Tensors
// passed to a backend live on its device(); Allocate/Upload/Download move data.
//
// Every operation validates its arguments and returns InvalidArgument naming
// the bad field rather than reading out of bounds. Operations on one backend
// are issued in order (one CUDA stream); Synchronize waits for them.
//
// Thread safety: a Backend is used by one thread at a time.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "kernels/dense.h"
#include "kernels/mixer.h"
#include "kernels/persistent_decode.h"
#include "kernels/sampling.h"

namespace lair::kernels {

// How a mixer forward runs. kAuto picks the recurrent form for one-token
// steps and the chunked form otherwise.
enum class MixerForm { kAuto, kChunked, kRecurrent };

// How the CUDA backend multiplies by weight matrices (kernels/cuda/dense_ops.h,
// GemmPrecision, has the numbers). kExact: fp32 products, BF16/F16 weights
// widened first; what `lair verify` compares. kFast: bf16/f16 tensor cores
// (TF32 for F32 weights) with fp32 accumulation; the serving default. The
// CPU backend is always exact.
enum class GemmMode { kExact, kFast };

// How the CUDA backend schedules a chunked scan on the tensor cores
// (kernels/cuda/scan_mma.h). kOnePass: one CTA per (sequence, head, tile)
// walks its chunks in order. kTwoPass: a state pass walks them running only
// the state update, then every chunk's outputs are computed in parallel.
// kSegmented: the sequences split into segments of whole chunks; a state pass
// runs them all at once from zero states, a carry chains their final states,
// and the one-pass scan runs every segment from the state entering it.
// kAuto takes the segments when the one-pass CTAs would leave
// multiprocessors idle. The outputs agree to rounding; only the speed differs.
enum class ScanSchedule { kAuto, kOnePass, kTwoPass, kSegmented };

struct BackendOptions {
  GemmMode gemm = GemmMode::kExact;
  ScanSchedule scan = ScanSchedule::kAuto;
};

// "exact" or "fast"; InvalidArgument naming `flag` otherwise.
absl::StatusOr<GemmMode> ParseGemmMode(std::string_view name, std::string_view flag);
// "auto", "one-pass", "two-pass" or "segmented"; InvalidArgument naming `flag`
// otherwise.
absl::StatusOr<ScanSchedule> ParseScanSchedule(std::string_view name, std::string_view flag);

// A recorded step (a CUDA graph): Launch queues the same device work again,
// at the same addresses, reading whatever those addresses hold by then.
class StepGraph {
 public:
  virtual ~StepGraph() = default;
  virtual absl::Status Launch() = 0;
};

// Where SampleRows writes its draws' logprobs (kernels/sampling.h), row r
// for logits row r: values F32 [R, 1 + kMaxRowLogprobs], the drawn token's
// then the listed tokens', best first; top_ids I32 [R, kMaxRowLogprobs],
// the listed tokens, then -1 (their values -inf).
struct DrawLogprobs {
  Tensor values;
  Tensor top_ids;
};

// SampleRows' logprobs operands: every rule's count within kMaxRowLogprobs,
// and when one asks for logprobs, `out`'s tensors of R rows on `device`.
absl::Status CheckDrawLogprobs(std::span<const RowSampling> rows, const DrawLogprobs& out,
                               Device device);

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Device device() const = 0;
  virtual std::string Name() const = 0;

  // --- Memory -------------------------------------------------------------
  // A zero-filled tensor on this backend's device.
  virtual absl::StatusOr<Tensor> Allocate(DType dtype, Shape shape) = 0;
  // Copies a host tensor to this device (converting to `dtype`).
  virtual absl::StatusOr<Tensor> Upload(const Tensor& host, DType dtype) = 0;
  // Copies a device tensor to a new host tensor of the same dtype.
  virtual absl::StatusOr<Tensor> Download(const Tensor& device_tensor) = 0;
  // Copies src into dst (same dtype and element count, both on this device).
  virtual absl::Status Copy(const Tensor& src, const Tensor& dst) = 0;
  virtual absl::Status Synchronize() = 0;

  // --- Steps: what a model forward wraps around its operations ------------
  // The defaults suit a host backend. Between BeginStep and EndStep,
  // AllocateScratch may hand out memory that the next BeginStep reuses (the
  // CUDA backend bumps a pointer through a preallocated arena), so a step's
  // temporaries cost nothing and repeat at the same addresses.
  virtual void BeginStep() {}
  virtual void EndStep() {}
  // An output an operation overwrites whole: contents undefined (the
  // default zero-fills). Allocated inside a step, it is valid until the next
  // BeginStep.
  virtual absl::StatusOr<Tensor> AllocateScratch(DType dtype, Shape shape) {
    return Allocate(dtype, std::move(shape));
  }
  // Small host int arrays (token ids, offsets, slots) as I32 device tensors,
  // one per part, in one transfer that is queued, not waited for. They stay
  // valid until the next StageInts; the host spans may change on return.
  virtual absl::StatusOr<std::vector<Tensor>> StageInts(
      std::span<const std::span<const int32_t>> parts);
  // ids[r] = the first index of the largest value of row r of logits [R, V]
  // F32 (greedy sampling without moving the logits); ids is I32 [R].
  virtual absl::Status ArgmaxRows(const Tensor& logits, const Tensor& ids);
  // ids[r] = the token kernels/sampling.h's rules draw from row r of logits
  // [R, V] F32 under rows[r] (R of them); ids is I32 [R]. For the rows whose
  // rule asks (RowSampling::logprobs >= 0), also the draw's logprobs, into
  // `logprobs` (which must then be given; its rows of the other rows are
  // left as they were).
  virtual absl::Status SampleRows(const Tensor& logits, std::span<const RowSampling> rows,
                                  const Tensor& ids, const DrawLogprobs& logprobs);
  // Runs nothing: records the device work `step` queues into a graph, or
  // Unimplemented where the backend has none. `step` must not synchronize,
  // read device memory on the host or grow memory. Launch the graph to run it.
  virtual absl::StatusOr<std::unique_ptr<StepGraph>> CaptureStep(
      const std::function<absl::Status()>& step);
  // Changes whenever memory a recorded step may use (arena, scratch, staging
  // buffer) moves: graphs recorded under another epoch must be taken again.
  virtual uint64_t memory_epoch() const { return 0; }
  // A one-sequence decode step of `model` as one persistent kernel
  // (kernels/persistent_decode.h), its weights laid out here once (a copy:
  // the model's own stay for its other steps). Unimplemented where the
  // backend has none or the model's shapes do not fit it.
  virtual absl::StatusOr<std::unique_ptr<PersistentDecode>> MakePersistentDecode(
      const PersistentDecodeModel& model);

  // --- Mixers (see kernels/mixer.h for the math and layouts) ---------------
  virtual absl::Status DecayForward(const SequenceBatch& batch, const DecayForwardArgs& args,
                                    MixerForm form) = 0;
  // Whether DecayForward takes `args` with its gate as gk_low_rank (gk
  // unset) for this batch and form; the caller forms gk where not. Reads
  // only args' kind and shapes and gk_low_rank.weight, so a caller may ask
  // before z exists.
  virtual bool FormsLowRankGate(const SequenceBatch& /*batch*/, const DecayForwardArgs& /*args*/,
                                MixerForm /*form*/) const {
    return false;
  }
  virtual absl::Status DecayBackward(const SequenceBatch& batch, const DecayBackwardArgs& args) = 0;
  virtual absl::Status GsaForward(const SequenceBatch& batch, const GsaForwardArgs& args,
                                  MixerForm form) = 0;
  virtual absl::Status GsaBackward(const SequenceBatch& batch, const GsaBackwardArgs& args) = 0;
  virtual absl::Status MlstmForward(const SequenceBatch& batch, const MlstmForwardArgs& args,
                                    MixerForm form) = 0;
  virtual absl::Status MlstmBackward(const SequenceBatch& batch, const MlstmBackwardArgs& args) = 0;

  // --- Dense operations used by the model skeleton ------------------------
  // Argument structs, shapes and math in kernels/dense.h. CPU: kernels/cpu/dense.cc.
  virtual absl::Status Gemm(const GemmArgs& args) = 0;
  // The default runs one Gemm per weight, each followed by its activation
  // and residual.
  virtual absl::Status LinearGroup(const LinearGroupArgs& args);
  // The dtype in which a LinearGroup of `rows` rows may write an output
  // that only ops taking 16-bit operands read (a prefill's q, k, v): kF32,
  // or the type this backend's products of that many rows round their
  // inputs to anyway, so that the reader need not round it again.
  virtual DType ProductOutputDType(int64_t /*rows*/) const { return DType::kF32; }
  // The default runs the gate and up products as one LinearGroup into
  // scratch, then the down product reading silu(gate) ∘ up.
  virtual absl::Status SwiGlu(const SwiGluArgs& args);
  virtual absl::Status Embedding(const EmbeddingArgs& args) = 0;
  virtual absl::Status EmbeddingBackward(const EmbeddingBackwardArgs& args) = 0;
  virtual absl::Status Norm(const NormArgs& args) = 0;
  virtual absl::Status NormBackward(const NormBackwardArgs& args) = 0;
  virtual absl::Status Unary(const UnaryArgs& args) = 0;
  virtual absl::Status UnaryBackward(const UnaryBackwardArgs& args) = 0;
  virtual absl::Status Binary(const BinaryArgs& args) = 0;
  virtual absl::Status ReduceSum(const ReduceSumArgs& args) = 0;
  virtual absl::Status CopyColumns(const CopyColumnsArgs& args) = 0;
  virtual absl::Status Conv1d(const SequenceBatch& batch, const Conv1dArgs& args) = 0;
  virtual absl::Status Conv1dBackward(const SequenceBatch& batch,
                                      const Conv1dBackwardArgs& args) = 0;
  virtual absl::Status Rotary(const RotaryArgs& args) = 0;
  virtual absl::Status Attention(const SequenceBatch& batch, const AttentionArgs& args) = 0;
  virtual absl::Status AttentionBackward(const SequenceBatch& batch,
                                         const AttentionBackwardArgs& args) = 0;
  virtual absl::Status CrossEntropy(const CrossEntropyArgs& args) = 0;
};

// The fp32 reference backend. `threads` <= 0 uses every core.
std::unique_ptr<Backend> MakeCpuBackend(int threads = 0);

// "cpu" or "cuda" (or "cuda:N"). Unimplemented when LAIR was built without
// CUDA; Unavailable when no GPU is present.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(std::string_view device,
                                                     const BackendOptions& options = {});

}  // namespace lair::kernels
