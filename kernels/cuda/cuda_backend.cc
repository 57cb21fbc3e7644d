// CudaBackend: validation, memory and the mapping of each mixer onto the
// generic scans of kernels/cuda/scan.h.
#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/parallel.h"
#include "kernels/cuda/argmax.h"
#include "kernels/cuda/dense_ops.h"
#include "kernels/cuda/mixer_backward.h"
#include "kernels/cuda/persistent_decode_program.h"
#include "kernels/cuda/sample_rows.h"
#include "kernels/cuda/scan.h"
#include "kernels/cuda/scan_mma.h"
#include "kernels/cuda/scan_segments.h"
#include "kernels/gsa_passes.h"

namespace lair::kernels {
namespace {

using cuda::ElemType;
using cuda::LogGate;
using cuda::Operand;
using cuda::ScanParams;
using cuda::StateRef;

absl::Status CudaStatus(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("CUDA ", std::string(what), ": ", cudaGetErrorString(err)));
}

// The stream outlives every tensor allocated on it (deleters hold it).
struct StreamHolder {
  int device = 0;
  cudaStream_t stream = nullptr;
  ~StreamHolder() {
    if (stream) {
      cudaSetDevice(device);
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    }
  }
};

ElemType Elem(DType d) {
  switch (d) {
    case DType::kBF16:
      return ElemType::kBF16;
    case DType::kF16:
      return ElemType::kF16;
    default:
      return ElemType::kF32;
  }
}

Operand Op(const Tensor& t) { return Operand{t.raw(), Elem(t.dtype())}; }

constexpr size_t RoundUp256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// dst = src converted to dst's float dtype, on every core for large tensors
// (loading a 7B checkpoint converts billions of weights).
void ConvertOnHost(const float* src, const Tensor& dst) {
  constexpr int64_t kChunk = int64_t{1} << 22;
  const int64_t n = dst.numel(), chunks = (n + kChunk - 1) / kChunk;
  ParallelFor(chunks, 0, [&](int64_t c) {
    for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) {
      if (dst.dtype() == DType::kF32) {
        dst.f32()[i] = src[i];
      } else if (dst.dtype() == DType::kBF16) {
        dst.data<uint16_t>()[i] = FloatToBF16(src[i]);
      } else {
        dst.data<uint16_t>()[i] = FloatToF16(src[i]);
      }
    }
  });
}

// A step's temporaries: a bump pointer through one device block, reset by
// BeginStep. What does not fit comes from cudaMallocAsync and is counted, so
// that the next BeginStep grows the block to the largest step seen (at most
// kMaxBytes; a long prefill's activations overflow to the allocator).
class StepArena {
 public:
  static constexpr size_t kMaxBytes = size_t{1} << 30;

  explicit StepArena(cudaStream_t stream) : stream_(stream) {}
  StepArena(const StepArena&) = delete;
  StepArena& operator=(const StepArena&) = delete;
  ~StepArena() {
    if (base_) cudaFreeAsync(base_, stream_);
  }

  uint64_t epoch() const { return epoch_; }
  bool active() const { return active_; }

  // Resets the pointer; grows the block first when the last steps wanted more.
  absl::Status Begin() {
    if (wanted_high_ > capacity_ && capacity_ < kMaxBytes) {
      if (base_) LAIR_RETURN_IF_ERROR(CudaStatus(cudaFreeAsync(base_, stream_), "arena free"));
      base_ = nullptr;
      capacity_ = 0;
      const size_t bytes = std::min(kMaxBytes, RoundUp256(wanted_high_ + wanted_high_ / 4));
      void* p = nullptr;
      LAIR_RETURN_IF_ERROR(CudaStatus(cudaMallocAsync(&p, bytes, stream_), "arena"));
      base_ = static_cast<char*>(p);
      capacity_ = bytes;
      ++epoch_;
    }
    used_ = 0;
    wanted_ = 0;
    active_ = true;
    return absl::OkStatus();
  }
  void End() { active_ = false; }

  // `bytes` from the block, or null when it is full (the caller allocates).
  void* Take(size_t bytes) {
    bytes = RoundUp256(std::max<size_t>(bytes, 1));
    wanted_ += bytes;
    wanted_high_ = std::max(wanted_high_, wanted_);
    if (used_ + bytes > capacity_) return nullptr;
    void* p = base_ + used_;
    used_ += bytes;
    return p;
  }

 private:
  static absl::Status CudaStatus(cudaError_t err, std::string_view what) {
    if (err == cudaSuccess) return absl::OkStatus();
    return absl::InternalError(
        absl::StrCat("CUDA ", std::string(what), ": ", cudaGetErrorString(err)));
  }

  cudaStream_t stream_;
  char* base_ = nullptr;
  size_t capacity_ = 0, used_ = 0;
  size_t wanted_ = 0, wanted_high_ = 0;  // bytes asked for this step / in any step
  uint64_t epoch_ = 0;                   // bumped whenever the block moves
  bool active_ = false;
};

// Small host arrays a step sends to the device (StageInts' metadata,
// SampleRows' rules): a pinned buffer they are packed into and the device
// block it is copied to, both reused by every upload (so a step's metadata
// sits at the same device addresses each time) and grown to twice the
// largest upload.
template <typename T>
class PinnedUpload {
 public:
  explicit PinnedUpload(const char* what) : what_(what) {}
  PinnedUpload(const PinnedUpload&) = delete;
  PinnedUpload& operator=(const PinnedUpload&) = delete;
  ~PinnedUpload() {
    if (copied_) {
      cudaEventSynchronize(copied_);
      cudaEventDestroy(copied_);
    }
    if (host_) cudaFreeHost(host_);
    if (dev_) cudaFreeAsync(dev_, stream_);
  }

  // Room for n elements in host(), once the last upload has left it (it
  // has, in practice: the step that queued it has read its results).
  absl::Status Reserve(size_t n, cudaStream_t stream) {
    if (!copied_)
      LAIR_RETURN_IF_ERROR(
          CudaStatus(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming), what_));
    LAIR_RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(copied_), what_));
    if (n <= capacity_) return absl::OkStatus();
    if (host_) LAIR_RETURN_IF_ERROR(CudaStatus(cudaFreeHost(host_), what_));
    if (dev_) LAIR_RETURN_IF_ERROR(CudaStatus(cudaFreeAsync(dev_, stream_), what_));
    host_ = nullptr;
    dev_ = nullptr;
    capacity_ = 0;
    const size_t grown = std::max<size_t>(n * 2, kMinElements);
    void* host = nullptr;
    void* dev = nullptr;
    LAIR_RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&host, grown * sizeof(T)), what_));
    host_ = static_cast<T*>(host);
    LAIR_RETURN_IF_ERROR(CudaStatus(cudaMallocAsync(&dev, grown * sizeof(T), stream), what_));
    dev_ = static_cast<T*>(dev);
    stream_ = stream;
    capacity_ = grown;
    ++epoch_;
    return absl::OkStatus();
  }
  // Queues the copy of host()[0, n) to dev() on `stream`.
  absl::Status Upload(size_t n, cudaStream_t stream) {
    LAIR_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(dev_, host_, n * sizeof(T), cudaMemcpyHostToDevice, stream), what_));
    return CudaStatus(cudaEventRecord(copied_, stream), what_);
  }

  T* host() const { return host_; }
  T* dev() const { return dev_; }
  uint64_t epoch() const { return epoch_; }  // bumped whenever dev() moves

 private:
  static constexpr size_t kMinElements = 4096;
  const char* what_;               // names the upload in errors
  cudaStream_t stream_ = nullptr;  // dev_'s allocation
  T* host_ = nullptr;
  T* dev_ = nullptr;
  size_t capacity_ = 0;           // elements of each
  cudaEvent_t copied_ = nullptr;  // the last copy out of host_
  uint64_t epoch_ = 0;
};

// Download's bounce buffer for small tensors (a step's sampled ids): a copy
// into pinned memory skips the driver's staging of a pageable one.
struct PinnedDownload {
  static constexpr size_t kBytes = 64 << 10;
  void* host = nullptr;  // kBytes pinned, once the first small download asks
  ~PinnedDownload() {
    if (host) cudaFreeHost(host);
  }
};

// A captured step and its executable graph.
class CudaStepGraph : public StepGraph {
 public:
  // `dense` (whose ops the graph may hold) must outlive the graph.
  CudaStepGraph(cudaStream_t stream, cudaGraphExec_t exec, cuda::CudaDenseOps* dense)
      : stream_(stream), exec_(exec), dense_(dense) {}
  CudaStepGraph(const CudaStepGraph&) = delete;
  CudaStepGraph& operator=(const CudaStepGraph&) = delete;
  ~CudaStepGraph() override { cudaGraphExecDestroy(exec_); }
  absl::Status Launch() override {
    dense_->NoteReplay();
    return CudaStatus(cudaGraphLaunch(exec_, stream_), "graph launch");
  }

 private:
  cudaStream_t stream_;
  cudaGraphExec_t exec_;
  cuda::CudaDenseOps* dense_;
};

// A defined CUDA tensor of exactly `shape`, float dtype (F32 only when f32_only).
absl::Status CheckTensor(const Tensor& t, const Shape& shape, std::string_view what,
                         bool f32_only) {
  if (!t.defined())
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), " is undefined"));
  if (t.device() != Device::kCuda)
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(what), " is not on the CUDA device"));
  LAIR_RETURN_IF_ERROR(ExpectShape(t, shape, what));
  if (f32_only ? t.dtype() != DType::kF32 : !IsFloat(t.dtype()))
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(what), " has dtype ", std::string(DTypeName(t.dtype()))));
  return absl::OkStatus();
}

// Offsets and slots in device memory, plus what the host learned from them.
struct DeviceBatch {
  const int32_t* cu_seqlens = nullptr;
  const int32_t* slots = nullptr;
  int64_t tokens = 0;
  int max_len = 0;
  Tensor keep_offsets, keep_slots;  // uploads made here
};

LogGate Gate(const Tensor& t, int token_stride, int head_stride) {
  LogGate g;
  g.ptr = t.defined() ? t.f32() : nullptr;
  g.token_stride = token_stride;
  g.head_stride = head_stride;
  return g;
}

// bf16 or f16: an operand the tensor-core scans take as it is.
bool SixteenBit(const Tensor& t) { return IsSixteenBitFloat(t.dtype()); }

// Whether t's data starts on a 16-byte boundary (vector and cp.async copies).
bool Aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.raw()) % 16 == 0; }

LogGate Shifted(LogGate g) {
  g.shift = true;
  return g;
}

class CudaBackend : public Backend {
 public:
  CudaBackend(std::shared_ptr<StreamHolder> stream, std::string name,
              std::unique_ptr<cuda::CudaDenseOps> dense, const BackendOptions& options,
              int sm_count)
      : stream_(std::move(stream)),
        name_(std::move(name)),
        dense_(std::move(dense)),
        tensor_core_scans_(options.gemm == GemmMode::kFast),
        scan_schedule_(options.scan),
        sm_count_(sm_count),
        arena_(stream_->stream) {}

  Device device() const override { return Device::kCuda; }
  std::string Name() const override { return name_; }

  absl::StatusOr<Tensor> Allocate(DType dtype, Shape shape) override {
    LAIR_ASSIGN_OR_RETURN(Tensor t, Uninitialized(dtype, std::move(shape)));
    LAIR_RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(t.raw(), 0, t.nbytes(), s()), "memset"));
    return t;
  }

  absl::StatusOr<Tensor> Upload(const Tensor& host, DType dtype) override {
    if (host.device() != Device::kCpu)
      return absl::InvalidArgumentError("Upload needs a host tensor");
    Tensor src = host;
    if (host.dtype() != dtype) {
      if (!IsFloat(host.dtype()) || !IsFloat(dtype))
        return absl::InvalidArgumentError("Upload converts between float dtypes only");
      const Tensor f = host.dtype() == DType::kF32 ? host : host.ToF32();
      src = Tensor::Zeros(dtype, host.shape());
      ConvertOnHost(f.f32(), src);
    }
    LAIR_ASSIGN_OR_RETURN(Tensor t, Uninitialized(dtype, host.shape()));
    LAIR_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(t.raw(), src.raw(), t.nbytes(), cudaMemcpyHostToDevice, s()), "upload"));
    // The host copy must stay alive until the copy ran.
    LAIR_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(s()), "upload"));
    return t;
  }

  absl::StatusOr<Tensor> Download(const Tensor& device_tensor) override {
    if (device_tensor.device() != Device::kCuda)
      return absl::InvalidArgumentError("Download needs a CUDA tensor");
    Tensor host = Tensor::Zeros(device_tensor.dtype(), device_tensor.shape());
    const size_t bytes = host.nbytes();
    const bool small = bytes <= PinnedDownload::kBytes;
    if (small && !pinned_.host)
      LAIR_RETURN_IF_ERROR(
          CudaStatus(cudaMallocHost(&pinned_.host, PinnedDownload::kBytes), "download buffer"));
    LAIR_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(small ? pinned_.host : host.raw(), device_tensor.raw(), bytes,
                                   cudaMemcpyDeviceToHost, s()),
                   "download"));
    LAIR_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(s()), "download"));
    if (small) std::memcpy(host.raw(), pinned_.host, bytes);
    return host;
  }

  absl::Status Copy(const Tensor& src, const Tensor& dst) override {
    if (src.device() != Device::kCuda || dst.device() != Device::kCuda ||
        src.dtype() != dst.dtype() || src.numel() != dst.numel())
      return absl::InvalidArgumentError(
          absl::StrCat("Copy ", src.DebugString(), " to ", dst.DebugString()));
    return CudaStatus(
        cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice, s()), "copy");
  }

  // Also reports device-side index faults of the dense ops since the last call.
  absl::Status Synchronize() override {
    LAIR_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(s()), "synchronize"));
    return dense_->TakeIndexFault();
  }

  // --- Steps ----------------------------------------------------------------
  // An arena that cannot grow leaves the step on the allocator.
  void BeginStep() override { step_status_ = arena_.Begin(); }
  void EndStep() override { arena_.End(); }

  absl::StatusOr<Tensor> AllocateScratch(DType dtype, Shape shape) override {
    return Temporary(dtype, std::move(shape));
  }

  absl::StatusOr<std::vector<Tensor>> StageInts(
      std::span<const std::span<const int32_t>> parts) override {
    // Each part starts on a 256-byte boundary.
    std::vector<size_t> offsets;
    size_t total = 0;
    for (std::span<const int32_t> part : parts) {
      offsets.push_back(total);
      total += RoundUp256(std::max<size_t>(part.size_bytes(), 1)) / sizeof(int32_t);
    }
    LAIR_RETURN_IF_ERROR(staging_.Reserve(total, s()));
    std::vector<Tensor> out;
    for (size_t i = 0; i < parts.size(); ++i) {
      std::copy(parts[i].begin(), parts[i].end(), staging_.host() + offsets[i]);
      out.push_back(Tensor::Wrap(staging_.dev() + offsets[i], DType::kI32,
                                 {static_cast<int64_t>(parts[i].size())}, Device::kCuda, nullptr));
    }
    LAIR_RETURN_IF_ERROR(staging_.Upload(total, s()));
    return out;
  }

  // ArgmaxRows' and SampleRows' operands: logits F32 [R, V] and ids I32
  // [R], both on this device.
  static absl::Status CheckRowsAndIds(const Tensor& logits, const Tensor& ids) {
    if (logits.rank() != 2)
      return absl::InvalidArgumentError(
          absl::StrCat("logits must be [R, V], got ", logits.DebugString()));
    LAIR_RETURN_IF_ERROR(CheckTensor(logits, logits.shape(), "logits", true));
    if (!ids.defined() || ids.device() != Device::kCuda || ids.dtype() != DType::kI32)
      return absl::InvalidArgumentError("ids must be an I32 CUDA tensor");
    LAIR_RETURN_IF_ERROR(ExpectShape(ids, {logits.dim(0)}, "ids"));
    return absl::OkStatus();
  }

  absl::Status ArgmaxRows(const Tensor& logits, const Tensor& ids) override {
    LAIR_RETURN_IF_ERROR(CheckRowsAndIds(logits, ids));
    return CudaStatus(cuda::LaunchArgmaxRows(logits.f32(), logits.dim(0), logits.dim(1),
                                             ids.data<int32_t>(), s()),
                      "argmax");
  }

  absl::Status SampleRows(const Tensor& logits, std::span<const RowSampling> rows,
                          const Tensor& ids, const DrawLogprobs& logprobs) override {
    LAIR_RETURN_IF_ERROR(CheckRowsAndIds(logits, ids));
    if (static_cast<int64_t>(rows.size()) != logits.dim(0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SampleRows: ", rows.size(), " sampling rows for ", logits.dim(0), " logits rows"));
    }
    LAIR_RETURN_IF_ERROR(CheckDrawLogprobs(rows, logprobs, Device::kCuda));
    const bool asked =
        std::any_of(rows.begin(), rows.end(), [](const RowSampling& r) { return r.logprobs >= 0; });
    LAIR_RETURN_IF_ERROR(sampling_.Reserve(rows.size(), s()));
    std::copy(rows.begin(), rows.end(), sampling_.host());
    LAIR_RETURN_IF_ERROR(sampling_.Upload(rows.size(), s()));
    return CudaStatus(
        cuda::LaunchSampleRows(logits.f32(), logits.dim(0), logits.dim(1), sampling_.dev(),
                               ids.data<int32_t>(), asked ? logprobs.values.f32() : nullptr,
                               asked ? logprobs.top_ids.data<int32_t>() : nullptr, s()),
        "sample rows");
  }

  // The kernel rounds every product's input to bf16, as the fast mode's
  // products do; the exact mode keeps the op-by-op step.
  absl::StatusOr<std::unique_ptr<PersistentDecode>> MakePersistentDecode(
      const PersistentDecodeModel& model) override {
    if (!tensor_core_scans_)
      return absl::UnimplementedError("persistent decode: the exact GEMM mode runs steps op by op");
    return cuda::MakeCudaPersistentDecode(this, s(), model);
  }

  absl::StatusOr<std::unique_ptr<StepGraph>> CaptureStep(
      const std::function<absl::Status()>& step) override {
    LAIR_RETURN_IF_ERROR(
        CudaStatus(cudaStreamBeginCapture(s(), cudaStreamCaptureModeThreadLocal), "begin capture"));
    capturing_ = true;
    const absl::Status stepped = step();
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(s(), &graph);
    if (!stepped.ok() || ended != cudaSuccess) {
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();  // a broken capture is reported here, not at the next launch
      LAIR_RETURN_IF_ERROR(stepped);
      return CudaStatus(ended, "capture");
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    LAIR_RETURN_IF_ERROR(CudaStatus(made, "graph instantiate"));
    return std::unique_ptr<StepGraph>(new CudaStepGraph(s(), exec, dense_.get()));
  }

  // The arena, the staging block and the dense ops' scratch (process-wide).
  uint64_t memory_epoch() const override {
    return arena_.epoch() + staging_.epoch() + cuda::CudaDenseOps::ScratchEpoch();
  }

  // The decode step forms a low-rank gate in its prologue (step.cu): one
  // token per sequence, as Run takes the step, and keys it takes whole. Only
  // launches that hold their rows (at most a wave): each CTA forms its
  // head's whole gate, so the larger launches repeat that work many times
  // over (GLA 1.3B, H100: B = 1 and 2 gained 1.7% and 2.0% a step, B = 32
  // lost 1.9%).
  bool FormsLowRankGate(const SequenceBatch& batch, const DecayForwardArgs& a,
                        MixerForm form) const override {
    const LowRankGate& g = a.gk_low_rank;
    return g.weight.defined() && a.kind == DecayKind::kVector && batch.num_seqs > 0 &&
           TakesStep(batch, a.value_dim, form) && a.key_dim <= cuda::kMaxStepKeyDim &&
           cuda::StepHoldsRows(a.value_dim, a.heads, batch.num_seqs, sm_count_) &&
           IsSixteenBitFloat(g.weight.dtype()) && g.weight.rank() == 2 &&
           g.weight.dim(1) % 8 == 0 && g.weight.dim(1) <= cuda::kMaxLowRank;
  }

  absl::Status DecayForward(const SequenceBatch& batch, const DecayForwardArgs& a,
                            MixerForm form) override {
    if (a.gk_low_rank.defined() && !FormsLowRankGate(batch, a, form))
      return absl::InvalidArgumentError(
          "a low-rank decay gate needs a vector decay's decode step (one token per sequence, "
          "16-bit weights of rank a multiple of 8 up to 64)");
    LAIR_ASSIGN_OR_RETURN(DeviceBatch db, CheckDecay(batch, a));
    LAIR_RETURN_IF_ERROR(CheckTensor(a.o, {db.tokens, a.heads, a.value_dim}, "o", false));
    ScanParams p = DecayScan(db, batch, a);
    const StateRef pool = Pool(a.state, db.slots, a.key_dim, a.value_dim);
    p.s_init = batch.zero_initial_state ? StateRef{} : pool;
    p.s_final = pool;
    p.o = a.o.raw();
    p.o_type = Elem(a.o.dtype());
    return Run(p, db, batch, form, "decay forward");
  }

  absl::Status DecayBackward(const SequenceBatch& batch, const DecayBackwardArgs& b) override {
    const DecayForwardArgs& a = b.fwd;
    if (a.gk_low_rank.defined())
      return absl::InvalidArgumentError("the decay backward takes gk, not a low-rank gate");
    LAIR_ASSIGN_OR_RETURN(DeviceBatch db, CheckDecay(batch, a));
    const int64_t n = db.tokens;
    const int H = a.heads, K = a.key_dim, V = a.value_dim, S = batch.num_seqs;
    // The dq pass scans with value_dim in the key role (the ULA permutation).
    if (K > kMaxScanKeyDim || V > kMaxScanKeyDim)
      return absl::InvalidArgumentError(
          "the CUDA decay backward needs key_dim and value_dim ≤ 256");
    LAIR_RETURN_IF_ERROR(CheckTensor(b.d_o, {n, H, V}, "d_o", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.dq, {n, H, K}, "dq", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.dk, {n, H, K}, "dk", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.dv, {n, H, V}, "dv", false));
    if (b.d_ht.defined()) LAIR_RETURN_IF_ERROR(CheckTensor(b.d_ht, {S, H, K, V}, "d_ht", true));
    if (b.dh0.defined()) LAIR_RETURN_IF_ERROR(CheckTensor(b.dh0, {S, H, K, V}, "dh0", true));
    // Decay gradients are optional: an undefined output is not computed.
    const Tensor& d_left = a.kind == DecayKind::kConstant ? b.d_log_gamma
                           : a.kind == DecayKind::kScalar ? b.dg
                                                          : b.dgk;
    const bool right = a.kind == DecayKind::kLeftRight;
    const bool want_left = a.kind != DecayKind::kNone && d_left.defined();
    const bool want_right = right && b.dgv.defined();
    if (want_left) {
      const Shape shape = a.kind == DecayKind::kConstant ? Shape{H}
                          : a.kind == DecayKind::kScalar ? Shape{n, H}
                                                         : Shape{n, H, K};
      LAIR_RETURN_IF_ERROR(CheckTensor(d_left, shape, "decay gradient", true));
    }
    if (want_right) LAIR_RETURN_IF_ERROR(CheckTensor(b.dgv, {n, H, V}, "dgv", true));
    const bool decay_grads = want_left || want_right;
    const StateRef pool = Pool(a.state, db.slots, K, V);

    // Forward again for s_n (the final-state term) and o (the right-decay term).
    Tensor s_n, o_f;
    if (decay_grads && (b.d_ht.defined() || want_right)) {
      LAIR_ASSIGN_OR_RETURN(s_n, Uninitialized(DType::kF32, {S, H, K, V}));
      LAIR_ASSIGN_OR_RETURN(o_f, Uninitialized(DType::kF32, {n, H, V}));
      ScanParams p = DecayScan(db, batch, a);
      p.s_init = batch.zero_initial_state ? StateRef{} : pool;
      p.s_final = Dense(s_n.f32(), H, K, V);
      p.o = o_f.raw();
      LAIR_RETURN_IF_ERROR(CudaStatus(cuda::LaunchScan(p, s()), "decay backward (forward pass)"));
    }

    // The gates of each permutation; scalar decays commute, so they stay on the left.
    const bool left_vec = a.kind == DecayKind::kVector || a.kind == DecayKind::kLeftRight;
    const LogGate L = LeftGate(a);
    const LogGate R = right ? Gate(a.gv, H * V, V) : LogGate{};
    // The scans write dq, dk (dv) in fp32 where the decay gradient's term
    // pass reads them (it then stores them in their dtypes), else straight
    // into the outputs.
    Tensor dq_f = b.dq, dk_f = b.dk, dv_f = b.dv;
    if (want_left) {
      LAIR_ASSIGN_OR_RETURN(dq_f, Uninitialized(DType::kF32, {n, H, K}));
      LAIR_ASSIGN_OR_RETURN(dk_f, Uninitialized(DType::kF32, {n, H, K}));
    }
    if (want_right) {
      LAIR_ASSIGN_OR_RETURN(dv_f, Uninitialized(DType::kF32, {n, H, V}));
    }

    // dQ = f(dO, V, K, R, L), starting from s0ᵀ.
    {
      ScanParams p = Base(db, batch, H, V, K);
      p.q = Op(b.d_o);
      p.q_scale = a.scale;
      p.k = Op(a.v);
      p.v = Op(a.k);
      if (left_vec) {
        p.left = R;
        p.left_vector = right;
        p.right = L;
      } else {
        p.left = L;
      }
      if (!batch.zero_initial_state) p.s_init = Transposed(pool, V);
      p.o = dq_f.raw();
      p.o_type = Elem(dq_f.dtype());
      LAIR_RETURN_IF_ERROR(CudaStatus(cuda::LaunchScan(p, s()), "decay backward dq"));
    }
    // dV = f(K, Q, dO, L+, R+, reverse) from dS_n; its last state is G_1.
    Tensor g1;
    {
      ScanParams p = Base(db, batch, H, K, V);
      p.reverse = true;
      p.q = Op(a.k);
      p.k = Op(a.q);
      p.k_scale = a.scale;
      p.v = Op(b.d_o);
      p.left = Shifted(L);
      p.left_vector = left_vec;
      if (right) p.right = Shifted(R);
      if (b.d_ht.defined()) p.s_init = Dense(b.d_ht.f32(), H, K, V);
      if (b.dh0.defined()) {
        LAIR_ASSIGN_OR_RETURN(g1, Uninitialized(DType::kF32, {S, H, K, V}));
        p.s_final = Dense(g1.f32(), H, K, V);
      }
      p.o = dv_f.raw();
      p.o_type = Elem(dv_f.dtype());
      LAIR_RETURN_IF_ERROR(CudaStatus(cuda::LaunchScan(p, s()), "decay backward dv"));
    }
    // dK = f(V, dO, Q, R+, L+, reverse) from dS_nᵀ.
    {
      ScanParams p = Base(db, batch, H, V, K);
      p.reverse = true;
      p.q = Op(a.v);
      p.k = Op(b.d_o);
      p.k_scale = a.scale;
      p.v = Op(a.q);
      if (left_vec) {
        if (right) p.left = Shifted(R);
        p.left_vector = right;
        p.right = Shifted(L);
      } else {
        p.left = Shifted(L);
      }
      if (b.d_ht.defined()) p.s_init = Transposed(Dense(b.d_ht.f32(), H, K, V), V);
      p.o = dk_f.raw();
      p.o_type = Elem(dk_f.dtype());
      LAIR_RETURN_IF_ERROR(CudaStatus(cuda::LaunchScan(p, s()), "decay backward dk"));
    }
    if (b.dh0.defined()) {
      LAIR_RETURN_IF_ERROR(
          CudaStatus(cuda::LaunchScaleByFirstDecay(g1.f32(), S, H, K, V, db.cu_seqlens, L, left_vec,
                                                   R, b.dh0.f32(), s()),
                     "decay backward dh0"));
    }
    // Decay gradients: reverse cumsums of q⊙dq − k⊙dk (and o⊙do − v⊙dv).
    if (want_left || want_right) {
      cuda::DecayGradParams g;
      g.num_seqs = S;
      g.heads = H;
      g.tokens = n;
      g.cu_seqlens = db.cu_seqlens;
      g.dim = K;
      g.other = V;
      g.x = Op(a.q);
      g.dx = Op(dq_f);
      g.y = Op(a.k);
      g.dy = Op(dk_f);
      if (b.d_ht.defined()) {
        g.d_state = b.d_ht.f32();
        g.state = s_n.f32();
      }
      g.reduce_features = !left_vec;
      if (want_left) {
        g.dx_out = b.dq.raw(), g.dx_out_type = Elem(b.dq.dtype());
        g.dy_out = b.dk.raw(), g.dy_out_type = Elem(b.dk.dtype());
        Tensor dg_all;
        if (a.kind == DecayKind::kConstant) {
          LAIR_ASSIGN_OR_RETURN(dg_all, Uninitialized(DType::kF32, {n, H}));
          g.out = dg_all.f32();
        } else {
          g.out = d_left.f32();
        }
        LAIR_RETURN_IF_ERROR(CudaStatus(cuda::LaunchDecayGrad(g, s()), "decay backward dg"));
        if (a.kind == DecayKind::kConstant) {
          LAIR_RETURN_IF_ERROR(CudaStatus(
              cuda::LaunchSumTokens(dg_all.f32(), n, H, b.d_log_gamma.f32(), s()), "d_log_gamma"));
        }
      }
      if (want_right) {
        g.dim = V;
        g.other = K;
        g.transposed = true;
        g.x = Operand{o_f.raw(), ElemType::kF32};
        g.dx = Op(b.d_o);
        g.y = Op(a.v);
        g.dy = Op(dv_f);
        g.dx_out = nullptr;
        g.dy_out = b.dv.raw(), g.dy_out_type = Elem(b.dv.dtype());
        g.out = b.dgv.f32();
        LAIR_RETURN_IF_ERROR(CudaStatus(cuda::LaunchDecayGrad(g, s()), "decay backward dgv"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status GsaForward(const SequenceBatch& batch, const GsaForwardArgs& a,
                          MixerForm form) override {
    LAIR_ASSIGN_OR_RETURN(DeviceBatch db, CheckGsa(batch, a));
    const int64_t n = db.tokens;
    const int H = a.heads, K = a.key_dim, V = a.value_dim, M = a.num_slots_m;
    LAIR_RETURN_IF_ERROR(CheckTensor(a.o, {n, H, V}, "o", false));
    LAIR_ASSIGN_OR_RETURN(Tensor z, Temporary(DType::kF32, {n, H, M}));
    // Pass 1: Hk_t = Hk_{t-1} diag(e^{g_t}) + k_t s_tᵀ, z_t = scale·Hk_tᵀq_t.
    {
      ScanParams p = Base(db, batch, H, K, M);
      p.q = Op(a.q);
      p.q_scale = a.scale;
      p.k = Op(a.k);
      p.v = Op(a.s);
      p.right = Gate(a.g, H * M, M);
      const StateRef pool = Pool(a.state_k, db.slots, K, M);
      p.s_init = batch.zero_initial_state ? StateRef{} : pool;
      p.s_final = pool;
      p.o = z.raw();
      LAIR_RETURN_IF_ERROR(Run(p, db, batch, form, "gsa pass 1"));
    }
    // Pass 2 queries with the probabilities in the precision of its keys and
    // values: bf16 where those are 16-bit, so the scan takes the tensor cores.
    Tensor probs = z;
    if (SixteenBit(a.s) && SixteenBit(a.v)) {
      LAIR_ASSIGN_OR_RETURN(probs, Temporary(DType::kBF16, {n, H, M}));
    }
    LAIR_RETURN_IF_ERROR(CudaStatus(
        cuda::LaunchSoftmaxRows(z.f32(), n * H, M, probs.raw(), Elem(probs.dtype()), s()),
        "gsa softmax"));
    // Pass 2: Hv_t = diag(e^{g_t}) Hv_{t-1} + s_t v_tᵀ, o_t = Hv_tᵀ p_t.
    ScanParams p = Base(db, batch, H, M, V);
    p.q = Op(probs);
    p.k = Op(a.s);
    p.v = Op(a.v);
    p.left = Gate(a.g, H * M, M);
    p.left_vector = true;
    const StateRef pool = Pool(a.state_v, db.slots, M, V);
    p.s_init = batch.zero_initial_state ? StateRef{} : pool;
    p.s_final = pool;
    p.o = a.o.raw();
    p.o_type = Elem(a.o.dtype());
    return Run(p, db, batch, form, "gsa pass 2");
  }

  // Composed as kernels/cpu/gsa.cc: pass 1 again for P, pass 2 backward, the
  // softmax Jacobian, pass 1 backward, and the s and g gradients of both passes.
  absl::Status GsaBackward(const SequenceBatch& batch, const GsaBackwardArgs& b) override {
    const GsaForwardArgs& a = b.fwd;
    LAIR_ASSIGN_OR_RETURN(DeviceBatch db, CheckGsa(batch, a));
    const int64_t n = db.tokens;
    const int H = a.heads, K = a.key_dim, V = a.value_dim, M = a.num_slots_m, S = batch.num_seqs;
    if (V > 128 || V % 4 != 0 || K > 128 || M > 128)
      return absl::InvalidArgumentError(
          "GSA backward on CUDA needs key_dim, value_dim and num_slots_m ≤ 128, value_dim a "
          "multiple of 4");
    LAIR_RETURN_IF_ERROR(CheckTensor(b.d_o, {n, H, V}, "d_o", false));
    if (b.d_hkt.defined()) LAIR_RETURN_IF_ERROR(CheckTensor(b.d_hkt, {S, H, K, M}, "d_hkt", true));
    if (b.d_hvt.defined()) LAIR_RETURN_IF_ERROR(CheckTensor(b.d_hvt, {S, H, M, V}, "d_hvt", true));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.dq, {n, H, K}, "dq", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.dk, {n, H, K}, "dk", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.dv, {n, H, V}, "dv", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.ds, {n, H, M}, "ds", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.dg, {n, H, M}, "dg", true));
    if (b.d_hk0.defined()) LAIR_RETURN_IF_ERROR(CheckTensor(b.d_hk0, {S, H, K, M}, "d_hk0", true));
    if (b.d_hv0.defined()) LAIR_RETURN_IF_ERROR(CheckTensor(b.d_hv0, {S, H, M, V}, "d_hv0", true));

    // 1. P from pass 1, run on private copies of the initial Hk (slot = sequence).
    const int64_t per_slot = int64_t{H} * K * M;
    LAIR_ASSIGN_OR_RETURN(Tensor hk, Uninitialized(DType::kF32, {S, H, K, M}));
    if (!batch.zero_initial_state) {
      for (int seq = 0; seq < S; ++seq) {
        LAIR_RETURN_IF_ERROR(
            CudaStatus(cudaMemcpyAsync(hk.f32() + seq * per_slot,
                                       a.state_k.f32() + batch.state_slot[seq] * per_slot,
                                       per_slot * sizeof(float), cudaMemcpyDeviceToDevice, s()),
                       "gsa backward state copy"));
      }
    }
    std::vector<int32_t> own_slots(static_cast<size_t>(S));
    std::iota(own_slots.begin(), own_slots.end(), 0);
    SequenceBatch own = batch;
    own.state_slot = own_slots;
    own.state_slot_device = nullptr;
    LAIR_ASSIGN_OR_RETURN(Tensor p, Uninitialized(DType::kF32, {n, H, M}));
    DecayForwardArgs pass1 = GsaKeyPass(a, hk);
    pass1.o = p;
    LAIR_RETURN_IF_ERROR(DecayForward(own, pass1, MixerForm::kChunked));
    LAIR_RETURN_IF_ERROR(
        CudaStatus(cuda::LaunchSoftmaxRows(p.f32(), n * H, M, p.raw(), ElemType::kF32, s()),
                   "gsa backward softmax"));

    // The scans read P and dZ in bf16 where their other operands are 16-bit,
    // so that they take the tensor cores (as in the forward).
    auto as_scan_operand = [&](const Tensor& x, bool half) -> absl::StatusOr<Tensor> {
      if (!half) return x;
      LAIR_ASSIGN_OR_RETURN(Tensor y, Uninitialized(DType::kBF16, x.shape()));
      LAIR_RETURN_IF_ERROR(ConvertInto(x, y));
      return y;
    };

    // 2. Pass 2 backward: dP, ds (key side), dv, dg, dHv_0.
    LAIR_ASSIGN_OR_RETURN(Tensor dp, Uninitialized(DType::kF32, {n, H, M}));
    LAIR_ASSIGN_OR_RETURN(Tensor ds_key, Uninitialized(DType::kF32, {n, H, M}));
    LAIR_ASSIGN_OR_RETURN(const Tensor p_scan,
                          as_scan_operand(p, SixteenBit(a.s) && SixteenBit(a.v)));
    DecayBackwardArgs back2;
    back2.fwd = GsaValuePass(a, p_scan, a.state_v);
    back2.d_o = b.d_o;
    back2.d_ht = b.d_hvt;
    back2.dq = dp;
    back2.dk = ds_key;
    back2.dv = b.dv;
    back2.dgk = b.dg;
    back2.dh0 = b.d_hv0;
    LAIR_RETURN_IF_ERROR(DecayBackward(batch, back2));

    // 3. dZ = P ⊙ (dP − <P, dP>), in place of dP.
    LAIR_RETURN_IF_ERROR(CudaStatus(cuda::LaunchSoftmaxBackward(p.f32(), dp.f32(), n * H, M, s()),
                                    "gsa backward softmax jacobian"));

    // 4. Pass 1 backward: dq, dk, ds (value side), dg, dHk_0.
    LAIR_ASSIGN_OR_RETURN(Tensor ds_value, Uninitialized(DType::kF32, {n, H, M}));
    LAIR_ASSIGN_OR_RETURN(Tensor dg_value, Uninitialized(DType::kF32, {n, H, M}));
    LAIR_ASSIGN_OR_RETURN(
        const Tensor dz_scan,
        as_scan_operand(dp, SixteenBit(a.q) && SixteenBit(a.k) && SixteenBit(a.s)));
    DecayBackwardArgs back1;
    back1.fwd = GsaKeyPass(a, a.state_k);
    back1.d_o = dz_scan;
    back1.d_ht = b.d_hkt;
    back1.dq = b.dq;
    back1.dk = b.dk;
    back1.dv = ds_value;
    back1.dgv = dg_value;
    back1.dh0 = b.d_hk0;
    LAIR_RETURN_IF_ERROR(DecayBackward(batch, back1));

    // 5. Both passes read s and g.
    LAIR_RETURN_IF_ERROR(CudaStatus(cuda::LaunchAdd(ds_key.f32(), ds_value.f32(), b.ds.raw(),
                                                    Elem(b.ds.dtype()), n * H * M, s()),
                                    "gsa backward ds"));
    return CudaStatus(
        cuda::LaunchAdd(b.dg.f32(), dg_value.f32(), b.dg.raw(), ElemType::kF32, n * H * M, s()),
        "gsa backward dg");
  }

  absl::Status MlstmForward(const SequenceBatch& batch, const MlstmForwardArgs& a,
                            MixerForm form) override {
    LAIR_ASSIGN_OR_RETURN(DeviceBatch db, CheckMlstm(batch, a));
    const int64_t n = db.tokens;
    const int H = a.heads, K = a.key_dim, V = a.value_dim;
    LAIR_RETURN_IF_ERROR(CheckTensor(a.h, {n, H, V}, "h", false));
    const bool exp_gate = a.kind == MlstmKind::kExp;
    // The scans' [key_dim, 64] state tile: xLSTM 7B's heads have key_dim 256.
    if (K > 256 || K % 4 != 0)
      return absl::InvalidArgumentError("mLSTM on CUDA needs key_dim ≤ 256, multiple of 4");

    ScanParams p = Base(db, batch, H, K, V);
    p.q = Op(a.q);
    p.q_scale = 1.0f / std::sqrt(static_cast<float>(K));
    p.k = Op(a.k);
    p.v = Op(a.v);
    p.left = Gate(a.f, H, 1);
    p.left.fn = cuda::GateFn::kLogSigmoid;
    p.key_weight = Gate(a.i, H, 1);
    p.key_weight.fn = exp_gate ? cuda::GateFn::kIdentity : cuda::GateFn::kLogSigmoid;
    p.stabilize = exp_gate;
    p.norm = a.kind == MlstmKind::kExp       ? cuda::NormKind::kMlstmExp
             : a.kind == MlstmKind::kSigNorm ? cuda::NormKind::kSigNorm
                                             : cuda::NormKind::kNone;
    p.eps = a.eps;
    const StateRef pool = Pool(a.state_c, db.slots, K, V);
    p.s_init = batch.zero_initial_state ? StateRef{} : pool;
    p.s_final = pool;
    // n and m are read by every dv tile and written by tile 0: read copies.
    Tensor n0, m0;
    if (!batch.zero_initial_state) {
      LAIR_ASSIGN_OR_RETURN(n0, Temporary(DType::kF32, a.state_n.shape()));
      LAIR_RETURN_IF_ERROR(Copy(a.state_n, n0));
      p.n_init = n0.f32();
      if (exp_gate) {
        LAIR_ASSIGN_OR_RETURN(m0, Temporary(DType::kF32, a.state_m.shape()));
        LAIR_RETURN_IF_ERROR(Copy(a.state_m, m0));
        p.m_init = m0.f32();
      }
    }
    p.n_final = a.state_n.f32();
    if (exp_gate) p.m_final = a.state_m.f32();
    p.o = a.h.raw();
    p.o_type = Elem(a.h.dtype());
    if (a.norm_dot.defined()) {
      p.norm_dot = a.norm_dot.f32();
      form = MixerForm::kChunked;  // the chunked scans write it; the one-token step does not
    }
    return Run(p, db, batch, form, "mlstm forward");
  }

  // Exact reverse mode through the recurrent step (kernels/cuda/mixer_backward.h).
  absl::Status MlstmBackward(const SequenceBatch& batch, const MlstmBackwardArgs& b) override {
    const MlstmForwardArgs& a = b.fwd;
    LAIR_ASSIGN_OR_RETURN(DeviceBatch db, CheckMlstm(batch, a));
    const int64_t n = db.tokens;
    const int H = a.heads, K = a.key_dim, V = a.value_dim, S = batch.num_seqs;
    if (K < 1 || V < 1 || K > cuda::kMlstmBackwardMaxDim || V > cuda::kMlstmBackwardMaxDim)
      return absl::InvalidArgumentError(
          absl::StrCat("mLSTM backward on CUDA needs key_dim and value_dim in [1, ",
                       cuda::kMlstmBackwardMaxDim, "], got key_dim ", K, ", value_dim ", V));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.d_h, {n, H, V}, "d_h", false));
    if (b.d_ct.defined()) LAIR_RETURN_IF_ERROR(CheckTensor(b.d_ct, {S, H, K, V}, "d_ct", true));
    if (b.d_nt.defined()) LAIR_RETURN_IF_ERROR(CheckTensor(b.d_nt, {S, H, K}, "d_nt", true));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.dq, {n, H, K}, "dq", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.dk, {n, H, K}, "dk", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.dv, {n, H, V}, "dv", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.di, {n, H}, "di", true));
    LAIR_RETURN_IF_ERROR(CheckTensor(b.df, {n, H}, "df", true));
    if (b.d_c0.defined()) LAIR_RETURN_IF_ERROR(CheckTensor(b.d_c0, {S, H, K, V}, "d_c0", true));
    if (b.d_n0.defined()) LAIR_RETURN_IF_ERROR(CheckTensor(b.d_n0, {S, H, K}, "d_n0", true));
    if (SigBackwardByScans(b)) return MlstmSigBackward(db, batch, b);

    cuda::MlstmBackwardParams p;
    p.num_seqs = S;
    p.heads = H;
    p.dk = K;
    p.dv = V;
    p.max_len = db.max_len;
    // Checkpoints every ⌈√T⌉ tokens: O(√T) states of scratch per (sequence, head).
    p.block = 1;
    while (p.block * p.block < db.max_len) ++p.block;
    p.cu_seqlens = db.cu_seqlens;
    p.gate = a.kind == MlstmKind::kExp   ? cuda::MlstmGate::kExp
             : a.kind == MlstmKind::kSig ? cuda::MlstmGate::kSig
                                         : cuda::MlstmGate::kSigNorm;
    p.eps = a.eps;
    p.q = Op(a.q);
    p.k = Op(a.k);
    p.v = Op(a.v);
    p.dh = Op(b.d_h);
    p.i = a.i.f32();
    p.f = a.f.f32();
    if (!batch.zero_initial_state) {
      p.slot = db.slots;
      p.c_init = a.state_c.f32();
      p.n_init = a.state_n.f32();
      if (a.kind == MlstmKind::kExp) p.m_init = a.state_m.f32();
    }
    p.d_ct = b.d_ct.defined() ? b.d_ct.f32() : nullptr;
    p.d_nt = b.d_nt.defined() ? b.d_nt.f32() : nullptr;
    p.dq = b.dq.raw();
    p.dq_type = Elem(b.dq.dtype());
    p.dk_out = b.dk.raw();
    p.dk_type = Elem(b.dk.dtype());
    p.dv_out = b.dv.raw();
    p.dv_type = Elem(b.dv.dtype());
    p.di = b.di.f32();
    p.df = b.df.f32();
    p.d_c0 = b.d_c0.defined() ? b.d_c0.f32() : nullptr;
    p.d_n0 = b.d_n0.defined() ? b.d_n0.f32() : nullptr;
    if (NormBackwardByScans(batch, b)) return MlstmNormBackward(db, batch, b, p);
    LAIR_ASSIGN_OR_RETURN(Tensor scratch,
                          Uninitialized(DType::kF32, {cuda::MlstmBackwardScratchFloats(p)}));
    p.scratch = scratch.f32();
    return CudaStatus(cuda::LaunchMlstmBackward(p, s()), "mlstm backward");
  }

  // The forward's h and q'·n, which the normalized kinds' cotangents read
  // (the branch of den's max must be the forward's): as a training forward
  // kept them (MlstmForwardArgs::norm_dot), else from `forward` run again
  // (its outputs set here, in fp32).
  struct ForwardOutputs {
    Tensor h, norm_dot;
  };
  absl::StatusOr<ForwardOutputs> KeptForward(const MlstmForwardArgs& a, int64_t n,
                                             ScanParams forward) {
    if (a.norm_dot.defined()) return ForwardOutputs{a.h, a.norm_dot};
    ForwardOutputs out;
    LAIR_ASSIGN_OR_RETURN(out.h, Uninitialized(DType::kF32, {n, a.heads, a.value_dim}));
    LAIR_ASSIGN_OR_RETURN(out.norm_dot, Uninitialized(DType::kF32, {n, a.heads}));
    forward.o = out.h.raw();
    forward.norm_dot = out.norm_dot.f32();
    LAIR_RETURN_IF_ERROR(CudaStatus(cuda::LaunchScan(forward, s()), "mlstm backward forward"));
    return out;
  }

  // The normalized kinds' backward (exp, and sig with its normalizer) on the
  // tensor-core scans, from zero states without state cotangents or
  // gradients (training from scratch), 16-bit operands of one type, 16-byte
  // aligned tensors and dims multiples of 16. With F the in-sequence cumsum of
  // log σ(f), li the log input weight (i, or log σ(i)), m_t the stabilizer
  // (exp; 0 for sig) and dO = dh/den, the values' products are scalar-decay
  // scans, stabilized for exp:
  //   dq_t = Σ_{s≤t} e^{F_t − F_s + li_s − m_t} (dO_t·v_s) k_s        (forward; its own m is m_t)
  //   dv_s = e^{li_s + M_s} Σ_{t≥s} e^{F_t − F_s − m_t − M_s} (q'_t·k_s) dO_t  (reverse, shifted)
  //   dk_s = e^{li_s + M_s} Σ_{t≥s} e^{F_t − F_s − m_t − M_s} (v_s·dO_t) q'_t
  // where for exp the reverse scans take −m_t as key weights and M_s is their
  // own stabilizer (so li_s + M_s ≤ 0); e^{li_s + M_s} is their row weight.
  // q'·n's cotangent x_t adds a rank-one share to dq and dk, which the dq and
  // dk scans take as one more key feature (ScanParams::extra_key): x_t on
  // dq's queries against 1 on its keys (dq_t += q_scale·x_t·n_t), 1 on dk's
  // queries against x_t on its keys. The mLSTM kernel's per-token steps give
  // m, the cotangents and the gate gradients (mixer_backward.h).
  static bool NormBackwardByScans(const SequenceBatch& batch, const MlstmBackwardArgs& b) {
    const MlstmForwardArgs& a = b.fwd;
    if (a.kind == MlstmKind::kSig || !batch.zero_initial_state || b.d_ct.defined() ||
        b.d_nt.defined() || b.d_c0.defined() || b.d_n0.defined())
      return false;
    for (const Tensor* t : {&a.q, &a.k, &a.v, &b.d_h, &b.dq, &b.dk, &b.dv})
      if (!Aligned16(*t)) return false;
    return SixteenBit(a.q) && a.k.dtype() == a.q.dtype() && a.v.dtype() == a.q.dtype() &&
           a.key_dim % 16 == 0 && a.value_dim % 16 == 0;
  }

  absl::Status MlstmNormBackward(const DeviceBatch& db, const SequenceBatch& batch,
                                 const MlstmBackwardArgs& b, cuda::MlstmBackwardParams p) {
    const MlstmForwardArgs& a = b.fwd;
    const int64_t n = db.tokens;
    const int H = a.heads, K = a.key_dim, V = a.value_dim, S = batch.num_seqs;
    const bool exp_gate = a.kind == MlstmKind::kExp;
    const float q_scale = 1.0f / std::sqrt(static_cast<float>(K));
    LAIR_ASSIGN_OR_RETURN(Tensor scratch,
                          Uninitialized(DType::kF32, {cuda::MlstmTokenScratchFloats(p)}));
    p.scratch = scratch.f32();
    LAIR_RETURN_IF_ERROR(CudaStatus(cuda::LaunchMlstmStabilizers(p, s()), "mlstm backward m"));
    LogGate forget = Gate(a.f, H, 1);
    forget.fn = cuda::GateFn::kLogSigmoid;
    LogGate input = Gate(a.i, H, 1);
    input.fn = exp_gate ? cuda::GateFn::kIdentity : cuda::GateFn::kLogSigmoid;
    auto scan = [&](int dk, int dv) {
      ScanParams sp = Base(db, batch, H, dk, dv);
      sp.stabilize = exp_gate;
      return sp;
    };
    ScanParams forward = scan(K, V);
    forward.q = Op(a.q), forward.q_scale = q_scale, forward.k = Op(a.k), forward.v = Op(a.v);
    forward.left = forget, forward.key_weight = input;
    forward.norm = exp_gate ? cuda::NormKind::kMlstmExp : cuda::NormKind::kSigNorm;
    forward.eps = a.eps;
    LAIR_ASSIGN_OR_RETURN(const ForwardOutputs kept, KeptForward(a, n, forward));
    LAIR_ASSIGN_OR_RETURN(Tensor d_num, Uninitialized(DType::kBF16, {n, H, V}));
    LAIR_ASSIGN_OR_RETURN(Tensor x, Uninitialized(DType::kF32, {n, H}));
    Tensor neg_m;
    if (exp_gate) {
      LAIR_ASSIGN_OR_RETURN(neg_m, Uninitialized(DType::kF32, {n, H}));
    }
    LAIR_RETURN_IF_ERROR(
        CudaStatus(cuda::LaunchMlstmNormCotangent(p, Op(kept.h), kept.norm_dot.f32(), d_num.raw(),
                                                  ElemType::kBF16, x.f32(),
                                                  exp_gate ? neg_m.f32() : nullptr, s()),
                   "mlstm backward cotangent"));
    // The exp kind's reverse scans start from a zero state whose stabilizer is −∞.
    Tensor m_none;
    if (exp_gate) {
      Tensor m_none_host = Tensor::Zeros(DType::kF32, {S, H});
      std::fill_n(m_none_host.f32(), m_none_host.numel(), -std::numeric_limits<float>::infinity());
      LAIR_ASSIGN_OR_RETURN(m_none, Upload(m_none_host, DType::kF32));
    }
    auto reverse = [&](int dk, int dv) {
      ScanParams sp = scan(dk, dv);
      sp.reverse = true;
      sp.left = Shifted(forget);
      sp.row_weight = input;
      if (exp_gate) {
        sp.key_weight = Gate(neg_m, H, 1);
        sp.m_init = m_none.f32();
      }
      return sp;
    };
    // dq and dk in their types, and their dots with q and k (the gate
    // gradients') summed from the scans' fp32 outputs.
    const cuda::MlstmRowDots dots = cuda::MlstmTokenRowDots(p);
    for (float* sums : {dots.qdq, dots.kdk})
      LAIR_RETURN_IF_ERROR(
          CudaStatus(cudaMemsetAsync(sums, 0, sizeof(float) * S * dots.seq_stride, s()),
                     "mlstm backward dots"));
    auto dots_into = [&](ScanParams& sp, const Tensor& with, float* row_dots) {
      sp.dot_with = Op(with);
      sp.row_dots = row_dots;
      sp.row_dots_seq_stride = dots.seq_stride;
    };
    {
      ScanParams sp = scan(V, K);
      sp.q = Op(d_num), sp.q_scale = q_scale, sp.k = Op(a.v), sp.v = Op(a.k);
      sp.left = forget, sp.key_weight = input;
      sp.extra_key = true, sp.extra_q = x.f32();
      dots_into(sp, a.q, dots.qdq);
      sp.o = b.dq.raw(), sp.o_type = Elem(b.dq.dtype());
      LAIR_RETURN_IF_ERROR(CudaStatus(cuda::LaunchScan(sp, s()), "mlstm backward dq"));
    }
    {
      ScanParams sp = reverse(V, K);
      sp.q = Op(a.v), sp.k = Op(d_num), sp.v = Op(a.q), sp.k_scale = q_scale;
      sp.extra_key = true, sp.extra_k = x.f32();
      dots_into(sp, a.k, dots.kdk);
      sp.o = b.dk.raw(), sp.o_type = Elem(b.dk.dtype());
      LAIR_RETURN_IF_ERROR(CudaStatus(cuda::LaunchScan(sp, s()), "mlstm backward dk"));
    }
    {
      ScanParams sp = reverse(K, V);
      sp.q = Op(a.k), sp.k = Op(a.q), sp.k_scale = q_scale, sp.v = Op(d_num);
      sp.o = b.dv.raw(), sp.o_type = Elem(b.dv.dtype());
      LAIR_RETURN_IF_ERROR(CudaStatus(cuda::LaunchScan(sp, s()), "mlstm backward dv"));
    }
    return CudaStatus(cuda::LaunchMlstmNormGateGrads(p, s()), "mlstm backward gates");
  }

  // The sigmoid kind's backward as the decay family's, on the tensor-core
  // scans: a scalar decay lf = log σ(f) over keys k' = σ(i)·k. Taken where
  // the normalizer state n carries no cotangent (n never reaches h); the
  // mLSTM kernel serves the rest.
  static bool SigBackwardByScans(const MlstmBackwardArgs& b) {
    return b.fwd.kind == MlstmKind::kSig && !b.d_nt.defined();
  }

  absl::Status MlstmSigBackward(const DeviceBatch& db, const SequenceBatch& batch,
                                const MlstmBackwardArgs& b) {
    const MlstmForwardArgs& a = b.fwd;
    const int64_t n = db.tokens;
    const int H = a.heads, K = a.key_dim, V = a.value_dim;
    LAIR_ASSIGN_OR_RETURN(Tensor k_scaled, Uninitialized(a.k.dtype(), {n, H, K}));
    LAIR_ASSIGN_OR_RETURN(Tensor lf, Uninitialized(DType::kF32, {n, H}));
    LAIR_RETURN_IF_ERROR(
        CudaStatus(cuda::LaunchMlstmSigKeys(Op(a.k), a.i.f32(), a.f.f32(), n * H, K, k_scaled.raw(),
                                            Elem(k_scaled.dtype()), lf.f32(), s()),
                   "mlstm backward keys"));
    LAIR_ASSIGN_OR_RETURN(Tensor dk_scaled, Uninitialized(DType::kF32, {n, H, K}));
    LAIR_ASSIGN_OR_RETURN(Tensor dg, Uninitialized(DType::kF32, {n, H}));
    DecayBackwardArgs d;
    d.fwd.kind = DecayKind::kScalar;
    d.fwd.heads = H;
    d.fwd.key_dim = K;
    d.fwd.value_dim = V;
    d.fwd.scale = 1.0f / std::sqrt(static_cast<float>(K));
    d.fwd.q = a.q;
    d.fwd.k = k_scaled;
    d.fwd.v = a.v;
    d.fwd.g = lf;
    d.fwd.state = a.state_c;
    d.d_o = b.d_h;
    d.d_ht = b.d_ct;
    d.dq = b.dq;
    d.dk = dk_scaled;
    d.dv = b.dv;
    d.dg = dg;
    d.dh0 = b.d_c0;
    LAIR_RETURN_IF_ERROR(DecayBackward(batch, d));
    // n never reaches h, and no cotangent reaches n.
    if (b.d_n0.defined())
      LAIR_RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(b.d_n0.raw(), 0, b.d_n0.nbytes(), s()),
                                      "mlstm backward d_n0"));
    return CudaStatus(cuda::LaunchMlstmSigGateGrads(
                          Op(k_scaled), dk_scaled.f32(), a.i.f32(), a.f.f32(), dg.f32(), n * H, K,
                          b.dk.raw(), Elem(b.dk.dtype()), b.di.f32(), b.df.f32(), s()),
                      "mlstm backward gates");
  }

  // --- Dense operations: kernels/cuda/dense_ops.h on the same stream -------
  absl::Status Gemm(const GemmArgs& a) override { return dense_->Gemm(a); }
  absl::Status LinearGroup(const LinearGroupArgs& a) override { return dense_->LinearGroup(a); }
  DType ProductOutputDType(int64_t rows) const override { return dense_->ProductOutputDType(rows); }
  absl::Status SwiGlu(const SwiGluArgs& a) override {
    return dense_->TakesSwiGlu(a) ? dense_->SwiGlu(a) : Backend::SwiGlu(a);
  }
  absl::Status Embedding(const EmbeddingArgs& a) override { return dense_->Embedding(a); }
  absl::Status EmbeddingBackward(const EmbeddingBackwardArgs& a) override {
    return dense_->EmbeddingBackward(a);
  }
  absl::Status Norm(const NormArgs& a) override { return dense_->Norm(a); }
  absl::Status NormBackward(const NormBackwardArgs& a) override { return dense_->NormBackward(a); }
  absl::Status Unary(const UnaryArgs& a) override { return dense_->Unary(a); }
  absl::Status UnaryBackward(const UnaryBackwardArgs& a) override {
    return dense_->UnaryBackward(a);
  }
  absl::Status Binary(const BinaryArgs& a) override { return dense_->Binary(a); }
  absl::Status ReduceSum(const ReduceSumArgs& a) override { return dense_->ReduceSum(a); }
  absl::Status CopyColumns(const CopyColumnsArgs& a) override { return dense_->CopyColumns(a); }
  absl::Status Conv1d(const SequenceBatch& batch, const Conv1dArgs& a) override {
    return dense_->Conv1d(batch, a);
  }
  absl::Status Conv1dBackward(const SequenceBatch& batch, const Conv1dBackwardArgs& a) override {
    return dense_->Conv1dBackward(batch, a);
  }
  absl::Status Rotary(const RotaryArgs& a) override { return dense_->Rotary(a); }
  absl::Status Attention(const SequenceBatch& batch, const AttentionArgs& a) override {
    return dense_->Attention(batch, a);
  }
  absl::Status AttentionBackward(const SequenceBatch& batch,
                                 const AttentionBackwardArgs& a) override {
    return dense_->AttentionBackward(batch, a);
  }
  absl::Status CrossEntropy(const CrossEntropyArgs& a) override { return dense_->CrossEntropy(a); }

 private:
  cudaStream_t s() const { return stream_->stream; }

  // A step's temporary: from the arena inside a step, else Uninitialized.
  // While capturing, memory must not grow: a full arena fails the capture.
  absl::StatusOr<Tensor> Temporary(DType dtype, Shape shape) {
    if (arena_.active() && step_status_.ok()) {
      const size_t bytes = static_cast<size_t>(ShapeNumel(shape)) * DTypeSize(dtype);
      if (void* p = arena_.Take(bytes))
        return Tensor::Wrap(p, dtype, std::move(shape), Device::kCuda, nullptr);
      if (capturing_)
        return absl::ResourceExhaustedError("the step arena is full while recording a step");
    }
    return Uninitialized(dtype, std::move(shape));
  }

  // Device memory freed on the stream when the last handle goes.
  absl::StatusOr<Tensor> Uninitialized(DType dtype, Shape shape) {
    const size_t bytes = static_cast<size_t>(ShapeNumel(shape)) * DTypeSize(dtype);
    void* ptr = nullptr;
    LAIR_RETURN_IF_ERROR(CudaStatus(cudaMallocAsync(&ptr, bytes > 0 ? bytes : 16, s()), "malloc"));
    std::shared_ptr<StreamHolder> holder = stream_;
    std::shared_ptr<void> owner(ptr, [holder](void* p) { cudaFreeAsync(p, holder->stream); });
    return Tensor::Wrap(ptr, dtype, std::move(shape), Device::kCuda, std::move(owner));
  }

  absl::Status ConvertInto(const Tensor& src, const Tensor& dst) {
    return CudaStatus(cuda::LaunchConvert(src.raw(), Elem(src.dtype()), dst.raw(),
                                          Elem(dst.dtype()), src.numel(), s()),
                      "convert");
  }

  // Checks the offsets and slots on the host and finds their device copies.
  absl::StatusOr<DeviceBatch> Prepare(const SequenceBatch& batch, const Tensor& q) {
    DeviceBatch db;
    const int S = batch.num_seqs;
    if (S < 0 || batch.cu_seqlens.size() != static_cast<size_t>(S) + 1 ||
        batch.state_slot.size() != static_cast<size_t>(S))
      return absl::InvalidArgumentError(
          "cu_seqlens needs num_seqs + 1 entries, state_slot num_seqs");
    if (q.rank() != 3) return absl::InvalidArgumentError(absl::StrCat("q is ", q.DebugString()));
    if (batch.cu_seqlens[0] != 0) return absl::InvalidArgumentError("cu_seqlens[0] must be 0");
    for (int i = 0; i < S; ++i) {
      const int len = batch.cu_seqlens[i + 1] - batch.cu_seqlens[i];
      if (len < 0) return absl::InvalidArgumentError("cu_seqlens must not decrease");
      db.max_len = std::max(db.max_len, len);
    }
    db.tokens = batch.cu_seqlens[S];
    if (db.tokens != q.dim(0))
      return absl::InvalidArgumentError(
          absl::StrCat("cu_seqlens ends at ", db.tokens, " but q has ", q.dim(0), " tokens"));
    if (batch.cu_seqlens_device) {
      db.cu_seqlens = batch.cu_seqlens_device;
    } else {
      LAIR_ASSIGN_OR_RETURN(db.keep_offsets, UploadInts(batch.cu_seqlens));
      db.cu_seqlens = db.keep_offsets.data<int32_t>();
    }
    if (batch.state_slot_device) {
      db.slots = batch.state_slot_device;
    } else {
      LAIR_ASSIGN_OR_RETURN(db.keep_slots, UploadInts(batch.state_slot));
      db.slots = db.keep_slots.data<int32_t>();
    }
    return db;
  }

  absl::StatusOr<Tensor> UploadInts(std::span<const int32_t> values) {
    Tensor host = Tensor::Zeros(DType::kI32, {static_cast<int64_t>(values.size())});
    std::copy(values.begin(), values.end(), host.data<int32_t>());
    return Upload(host, DType::kI32);
  }

  absl::Status CheckPool(const Tensor& pool, int H, int d1, int d2, const SequenceBatch& batch,
                         std::string_view what) {
    if (!pool.defined() || pool.rank() != 4)
      return absl::InvalidArgumentError(absl::StrCat(std::string(what), " must be [slots,H,.,.]"));
    LAIR_RETURN_IF_ERROR(CheckTensor(pool, {pool.dim(0), H, d1, d2}, what, true));
    for (int32_t slot : batch.state_slot)
      if (slot < 0 || slot >= pool.dim(0))
        return absl::InvalidArgumentError(
            absl::StrCat(std::string(what), ": slot ", slot, " out of range"));
    return absl::OkStatus();
  }

  absl::StatusOr<DeviceBatch> CheckDecay(const SequenceBatch& batch, const DecayForwardArgs& a) {
    LAIR_ASSIGN_OR_RETURN(DeviceBatch db, Prepare(batch, a.q));
    const int64_t n = db.tokens;
    const int H = a.heads, K = a.key_dim, V = a.value_dim;
    LAIR_RETURN_IF_ERROR(CheckTensor(a.q, {n, H, K}, "q", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(a.k, {n, H, K}, "k", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(a.v, {n, H, V}, "v", false));
    LAIR_RETURN_IF_ERROR(CheckPool(a.state, H, K, V, batch, "state"));
    switch (a.kind) {
      case DecayKind::kConstant:
        LAIR_RETURN_IF_ERROR(CheckTensor(a.log_gamma, {H}, "log_gamma", true));
        break;
      case DecayKind::kScalar:
        LAIR_RETURN_IF_ERROR(CheckTensor(a.g, {n, H}, "g", true));
        break;
      case DecayKind::kLeftRight:
        LAIR_RETURN_IF_ERROR(CheckTensor(a.gv, {n, H, V}, "gv", true));
        if (!a.gk.defined()) break;  // no key-side decay
        [[fallthrough]];
      case DecayKind::kVector:
        if (a.gk_low_rank.defined()) {
          const LowRankGate& g = a.gk_low_rank;
          const int64_t rank = g.weight.rank() == 2 ? g.weight.dim(1) : 0;
          LAIR_RETURN_IF_ERROR(CheckTensor(g.z, {n, rank}, "gk_low_rank.z", true));
          LAIR_RETURN_IF_ERROR(
              CheckTensor(g.weight, {int64_t{H} * K, rank}, "gk_low_rank.weight", false));
          if (g.bias.defined())
            LAIR_RETURN_IF_ERROR(CheckTensor(g.bias, {int64_t{H} * K}, "gk_low_rank.bias", true));
          break;
        }
        LAIR_RETURN_IF_ERROR(CheckTensor(a.gk, {n, H, K}, "gk", true));
        break;
      case DecayKind::kNone:
        break;
    }
    // Keys wider than a scan's state tile run in row blocks (RunKeyBlocks).
    if (K % 4 != 0 || V % 4 != 0)
      return absl::InvalidArgumentError(
          "the CUDA decay kernels need key_dim and value_dim multiples of 4");
    return db;
  }

  // What GSA forward and backward both read.
  absl::StatusOr<DeviceBatch> CheckGsa(const SequenceBatch& batch, const GsaForwardArgs& a) {
    LAIR_ASSIGN_OR_RETURN(DeviceBatch db, Prepare(batch, a.q));
    const int64_t n = db.tokens;
    const int H = a.heads, K = a.key_dim, V = a.value_dim, M = a.num_slots_m;
    LAIR_RETURN_IF_ERROR(CheckTensor(a.q, {n, H, K}, "q", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(a.k, {n, H, K}, "k", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(a.v, {n, H, V}, "v", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(a.s, {n, H, M}, "s", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(a.g, {n, H, M}, "g", true));
    LAIR_RETURN_IF_ERROR(CheckPool(a.state_k, H, K, M, batch, "state_k"));
    LAIR_RETURN_IF_ERROR(CheckPool(a.state_v, H, M, V, batch, "state_v"));
    // Pass 2 scans with the slots as its keys; pass 1's keys may be any width.
    if (M > kMaxScanKeyDim || K % 4 != 0 || M % 4 != 0)
      return absl::InvalidArgumentError(
          "GSA on CUDA needs num_slots_m ≤ 256 and key_dim, num_slots_m multiples of 4");
    return db;
  }

  // What mLSTM forward and backward both read.
  absl::StatusOr<DeviceBatch> CheckMlstm(const SequenceBatch& batch, const MlstmForwardArgs& a) {
    LAIR_ASSIGN_OR_RETURN(DeviceBatch db, Prepare(batch, a.q));
    const int64_t n = db.tokens;
    const int H = a.heads, K = a.key_dim, V = a.value_dim;
    LAIR_RETURN_IF_ERROR(CheckTensor(a.q, {n, H, K}, "q", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(a.k, {n, H, K}, "k", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(a.v, {n, H, V}, "v", false));
    LAIR_RETURN_IF_ERROR(CheckTensor(a.i, {n, H}, "i", true));
    LAIR_RETURN_IF_ERROR(CheckTensor(a.f, {n, H}, "f", true));
    LAIR_RETURN_IF_ERROR(CheckPool(a.state_c, H, K, V, batch, "state_c"));
    const int64_t slots = a.state_c.dim(0);
    LAIR_RETURN_IF_ERROR(CheckTensor(a.state_n, {slots, H, K}, "state_n", true));
    if (a.kind == MlstmKind::kExp)
      LAIR_RETURN_IF_ERROR(CheckTensor(a.state_m, {slots, H}, "state_m", true));
    if (a.norm_dot.defined()) {  // with h, what the backward reads back
      if (a.kind == MlstmKind::kSig)
        return absl::InvalidArgumentError("norm_dot: the sig kind has no normalizer");
      LAIR_RETURN_IF_ERROR(CheckTensor(a.norm_dot, {n, H}, "norm_dot", true));
      LAIR_RETURN_IF_ERROR(CheckTensor(a.h, {n, H, V}, "h", false));
    }
    return db;
  }

  static ScanParams Base(const DeviceBatch& db, const SequenceBatch& batch, int H, int dk, int dv) {
    ScanParams p;
    p.num_seqs = batch.num_seqs;
    p.heads = H;
    p.dk = dk;
    p.dv = dv;
    p.cu_seqlens = db.cu_seqlens;
    return p;
  }

  static LogGate LeftGate(const DecayForwardArgs& a) {
    switch (a.kind) {
      case DecayKind::kConstant:
        return Gate(a.log_gamma, 0, 1);
      case DecayKind::kScalar:
        return Gate(a.g, a.heads, 1);
      case DecayKind::kVector:
      case DecayKind::kLeftRight:
        return Gate(a.gk, a.heads * a.key_dim, a.key_dim);
      case DecayKind::kNone:
        break;
    }
    return LogGate{};
  }

  // The forward scan of a decay mixer, without state or output.
  static ScanParams DecayScan(const DeviceBatch& db, const SequenceBatch& batch,
                              const DecayForwardArgs& a) {
    ScanParams p = Base(db, batch, a.heads, a.key_dim, a.value_dim);
    p.q = Op(a.q);
    p.q_scale = a.scale;
    p.k = Op(a.k);
    p.v = Op(a.v);
    p.left = LeftGate(a);
    p.left_vector = a.kind == DecayKind::kVector || a.kind == DecayKind::kLeftRight;
    if (const LowRankGate& g = a.gk_low_rank; g.defined()) {
      p.left_low_rank.z = g.z.f32();
      p.left_low_rank.w = g.weight.raw();
      p.left_low_rank.w_type = Elem(g.weight.dtype());
      p.left_low_rank.bias = g.bias.defined() ? g.bias.f32() : nullptr;
      p.left_low_rank.rank = static_cast<int>(g.weight.dim(1));
      p.left_low_rank.scale = g.scale;
    }
    if (a.kind == DecayKind::kLeftRight) p.right = Gate(a.gv, a.heads * a.value_dim, a.value_dim);
    return p;
  }

  // A [slots, H, d1, d2] pool addressed through the slot table.
  static StateRef Pool(const Tensor& pool, const int32_t* slots, int d1, int d2) {
    StateRef r;
    r.ptr = pool.f32();
    r.slot = slots;
    r.slot_stride = static_cast<int64_t>(pool.dim(1)) * d1 * d2;
    r.stride_a = d2;
    r.stride_b = 1;
    return r;
  }

  // A dense per-sequence [S, H, d1, d2] tensor.
  static StateRef Dense(float* ptr, int heads, int d1, int d2) {
    StateRef r;
    r.ptr = ptr;
    r.slot_stride = static_cast<int64_t>(heads) * d1 * d2;
    r.stride_a = d2;
    r.stride_b = 1;
    return r;
  }

  // The same storage seen as its transpose: [d1, d2] read as [d2, d1].
  static StateRef Transposed(StateRef r, int d2) {
    r.stride_a = 1;
    r.stride_b = d2;
    return r;
  }

  // The widest key dimension one scan or step launch holds (its state tile).
  static constexpr int kMaxScanKeyDim = 256;
  // Fewest state rows per key block (KeyBlocks), and the fp32 scan's dv
  // columns per CTA (scan.h).
  static constexpr int kMinKeyBlockRows = 32;
  static constexpr int kMinMmaKeyBlockRows = 64;
  static constexpr int kScanTileColumns = 64;
  static constexpr int kScanChunk = 64;        // tokens per chunk of the tensor-core scan
  static constexpr int kTwoPassMaxKeys = 128;  // TwoPass
  // SegmentChunks. GLA 1.3B prefill of 4096 tokens, H100: 2 (8 segments)
  // 104.6 and 103.9k tokens/s, 4 101.9 and 103.2k, 6 97.7 and 97.9k.
  static constexpr int kSegmentCtasPerSm = 2;
  static constexpr int kMinEntryTermKeys = 128;  // SegmentEntryTerm

  // One forward scan: the step kernel for one-token decode, else the chunked
  // scan (its operands rounded for the tensor cores when the backend is
  // fast): in two passes where the tensor-core scan would leave
  // multiprocessors idle (TwoPass), else in one, with its keys split into
  // blocks scanned as heads of their own when they are wider than a launch's
  // tile or too few CTAs would run (KeyBlocks).
  //
  // Temporaries are freed in stream order when their last handle goes, and
  // the next allocation may reuse them at once: every one lives in `keep`
  // until the launches that read it are queued.
  // Whether Run takes the one-token step (LaunchStep) for `batch`: one token
  // per sequence, any form but the chunked one, dv a multiple of 32.
  static bool TakesStep(const SequenceBatch& batch, int dv, MixerForm form) {
    if (form == MixerForm::kChunked || dv % 32 != 0) return false;
    for (size_t i = 1; i < batch.cu_seqlens.size(); ++i) {
      if (batch.cu_seqlens[i] - batch.cu_seqlens[i - 1] != 1) return false;
    }
    return true;
  }

  absl::Status Run(ScanParams p, const DeviceBatch& db, const SequenceBatch& batch, MixerForm form,
                   std::string_view what) {
    const bool step = TakesStep(batch, p.dv, form);
    std::vector<Tensor> keep;
    if (!step && tensor_core_scans_) LAIR_RETURN_IF_ERROR(RoundForTensorCores(p, db.tokens, keep));
    if (!step && Segmented(p, db)) return RunSegmented(p, db, batch, keep, what);
    if (!step && TwoPass(p, db)) return RunTwoPass(p, db, batch.num_seqs, keep, what);
    LAIR_ASSIGN_OR_RETURN(const int blocks, KeyBlocks(p, step, what));
    return InKeyBlocks(p, db.tokens, blocks, keep, what, [&](const ScanParams& scan) {
      return step ? cuda::LaunchStep(scan, s()) : cuda::LaunchScan(scan, s());
    });
  }

  // `launch` on p, or with blocks > 1 on p split into key blocks scanned as
  // heads (SplitKeysIntoHeads), whose partial outputs then add into p.o.
  template <typename Launch>
  absl::Status InKeyBlocks(ScanParams p, int64_t tokens, int blocks, std::vector<Tensor>& keep,
                           std::string_view what, Launch launch) {
    if (blocks == 1) return CudaStatus(launch(p), what);
    const int64_t rows = tokens * p.heads;  // [tokens, heads] before the split
    void* const out = p.o;
    const ElemType out_type = p.o_type;
    LAIR_RETURN_IF_ERROR(SplitKeysIntoHeads(p, tokens, blocks, keep, what));
    LAIR_RETURN_IF_ERROR(CudaStatus(launch(p), what));
    return CudaStatus(cuda::LaunchSumRowGroups(static_cast<const float*>(p.o), rows, p.dv, blocks,
                                               out, out_type, s()),
                      what);
  }

  // One-pass CTAs of a scan: 64-column tiles of every (sequence, head), before
  // any key split.
  static int64_t OnePassCtas(const ScanParams& p) {
    return static_cast<int64_t>(p.dv + kScanTileColumns - 1) / kScanTileColumns * p.heads *
           p.num_seqs;
  }

  // Auto's test for leaving the one-pass scan (for the segments, else two
  // passes): its CTAs leave multiprocessors idle while each walks more than
  // one chunk (a prefill of one long prompt).
  bool OnePassLeavesSmsIdle(const ScanParams& p, const DeviceBatch& db) const {
    return OnePassCtas(p) < sm_count_ && db.max_len > kScanChunk;
  }

  // The segmented schedule (scan_segments.h) serves the forward scans the
  // two passes do, keys wider than a launch's tile too (both of its scans
  // take them in blocks), unless a gate is shifted (a segment's last token
  // would read past it). Auto takes it where OnePassLeavesSmsIdle.
  bool Segmented(const ScanParams& p, const DeviceBatch& db) const {
    ScanParams tile = p;
    tile.dk = std::min(p.dk, kMaxScanKeyDim);
    if (scan_schedule_ == ScanSchedule::kOnePass || scan_schedule_ == ScanSchedule::kTwoPass ||
        !cuda::ScanMmaTwoPassSupports(tile) || p.left.shift || p.right.shift)
      return false;
    if (scan_schedule_ == ScanSchedule::kSegmented) return true;
    return OnePassLeavesSmsIdle(p, db);
  }

  // Chunks per segment: the fewest segments giving kSegmentCtasPerSm one-pass
  // CTAs per multiprocessor, whole chunks each.
  int SegmentChunks(const ScanParams& p, const SequenceBatch& batch) const {
    int64_t chunks = 0;
    for (int s = 0; s < batch.num_seqs; ++s)
      chunks += (batch.cu_seqlens[s + 1] - batch.cu_seqlens[s] + kScanChunk - 1) / kScanChunk;
    int64_t per_segment = OnePassCtas(p) / std::max(p.num_seqs, 1);
    // Keys wider than a launch's tile split in both scans anyway, and their
    // key blocks count as CTAs: GSA 1.3B's 512-key pass in 16 segments
    // instead of 64 (prefill, H100: 111.9k and 110.5k tokens/s against 107.2k
    // and 107.1k). Narrower keys do not: GLA 1.3B's 256 counted as two blocks
    // gives 5 segments, 93.5k and 94.7k against 105.2k and 104.1k.
    if (p.dk > kMaxScanKeyDim) per_segment *= std::max(1, OutputBlocks(p));
    const int64_t segments =
        std::max<int64_t>(1, (kSegmentCtasPerSm * sm_count_ + per_segment - 1) / per_segment);
    return static_cast<int>(std::max<int64_t>(1, (chunks + segments - 1) / segments));
  }

  // Where the segments take the entry term (scan_segments.h) rather than a
  // state pass: a wide left-side state, whose sequential state pass costs
  // more than the entry's product. GLA 1.3B prefill of 4096 (256 keys),
  // H200: 0.483-0.489 of the matmul rate against 0.440-0.454. GSA 1.3B's
  // passes (64 keys and a vector decay; 512 and a right decay) lost with it:
  // 0.483-0.487 against 0.497-0.505.
  static bool SegmentEntryTerm(const ScanParams& p) {
    return p.right.ptr == nullptr && p.dk >= kMinEntryTermKeys;
  }

  // The segments' layout and the carry's parameters, then either schedule:
  // with the entry term, every segment runs the one-pass scan from a zero
  // state into parts of its outputs and its local final state, the carry
  // turns those into the states entering the segments and the sequences'
  // final states, and the entry term adds each segment's entering state to
  // its outputs, summing the key blocks' parts on the way. Otherwise a state
  // pass gives the local final states, and after the carry the one-pass scan
  // runs every segment from its entering state.
  absl::Status RunSegmented(const ScanParams& p, const DeviceBatch& db, const SequenceBatch& batch,
                            std::vector<Tensor>& keep, std::string_view what) {
    const int span = SegmentChunks(p, batch) * kScanChunk;
    int segments = 0;
    for (int s = 0; s < batch.num_seqs; ++s)
      segments += (batch.cu_seqlens[s + 1] - batch.cu_seqlens[s] + span - 1) / span;
    LAIR_ASSIGN_OR_RETURN(Tensor segment_cu_dev, Temporary(DType::kI32, {segments + 1}));
    LAIR_ASSIGN_OR_RETURN(Tensor seq_segments_dev, Temporary(DType::kI32, {batch.num_seqs + 1}));
    LAIR_RETURN_IF_ERROR(
        CudaStatus(cuda::LaunchSegmentOffsets(db.cu_seqlens, batch.num_seqs, span,
                                              segment_cu_dev.data<int32_t>(),
                                              seq_segments_dev.data<int32_t>(), s()),
                   what));
    const bool entry_term = SegmentEntryTerm(p);
    const Shape states = {std::max(segments, 1), p.heads, p.dk, p.dv};
    LAIR_ASSIGN_OR_RETURN(Tensor local, Temporary(DType::kF32, states));
    LAIR_ASSIGN_OR_RETURN(Tensor entering,
                          Temporary(entry_term ? DType::kBF16 : DType::kF32, states));
    LAIR_ASSIGN_OR_RETURN(
        Tensor sums,
        Temporary(DType::kF32, {std::max<int64_t>(1, cuda::SegmentDecaySumsFloats(
                                                         segments, span, p.heads, p.dk, p.dv))}));
    keep.insert(keep.end(), {segment_cu_dev, seq_segments_dev, local, entering, sums});

    cuda::SegmentParams seg;
    seg.num_seqs = batch.num_seqs, seg.heads = p.heads, seg.dk = p.dk, seg.dv = p.dv;
    seg.seq_segments = seq_segments_dev.data<int32_t>();
    seg.segment_cu = segment_cu_dev.data<int32_t>();
    seg.segments = segments, seg.span = span;
    seg.left = p.left, seg.left_vector = p.left_vector, seg.right = p.right;
    seg.decay_sums = sums.f32();
    seg.local_final = local.f32();
    seg.entering = entering.raw();
    seg.entering_type = Elem(entering.dtype());
    seg.s_init = p.s_init, seg.s_final = p.s_final;
    seg.q = p.q, seg.q_scale = p.q_scale;
    seg.o = p.o, seg.o_type = p.o_type;
    ScanParams local_scan = p;  // the segments as sequences
    local_scan.num_seqs = segments;
    local_scan.cu_seqlens = seg.segment_cu;
    local_scan.s_init = StateRef{};
    local_scan.s_final = Dense(local.f32(), p.heads, p.dk, p.dv);
    // The one-pass scan over the segments in key blocks: as in the two
    // passes' output pass, CTAs of more than kTwoPassMaxKeys keys would run
    // one per multiprocessor (GLA 1.3B prefill, H100: 8.2 ms of scans against
    // 5.8 plus 1.3 of partial sums in blocks of 128).
    LAIR_ASSIGN_OR_RETURN(const int fit, KeyBlocks(local_scan, /*step=*/false, what));
    const int scan_blocks = std::max(fit, OutputBlocks(local_scan));
    if (!entry_term) {
      if (segments > 0) {
        ScanParams state_pass = local_scan;
        state_pass.o = nullptr;
        LAIR_ASSIGN_OR_RETURN(const int blocks, KeyBlocks(state_pass, /*step=*/false, what));
        if (blocks > 1)
          LAIR_RETURN_IF_ERROR(KeyBlockView(state_pass, db.tokens, blocks, keep, what));
        LAIR_RETURN_IF_ERROR(CudaStatus(cuda::LaunchScanMmaStates(state_pass, nullptr, s()), what));
      }
      LAIR_RETURN_IF_ERROR(CudaStatus(cuda::LaunchCarrySegmentStates(seg, s()), what));
      if (segments == 0) return absl::OkStatus();
      local_scan.s_init = Dense(entering.f32(), p.heads, p.dk, p.dv);
      local_scan.s_final = StateRef{};
      return InKeyBlocks(local_scan, db.tokens, scan_blocks, keep, what,
                         [&](const ScanParams& scan) { return cuda::LaunchScan(scan, s()); });
    }
    if (segments > 0) {
      seg.copies = scan_blocks;
      // 16-bit parts where o is: the outputs are rounded there anyway.
      const bool sixteen_bit = p.o_type != ElemType::kF32;
      LAIR_RETURN_IF_ERROR(SplitKeysIntoHeads(local_scan, db.tokens, seg.copies, keep, what,
                                              sixteen_bit ? DType::kBF16 : DType::kF32));
      seg.local_out = local_scan.o;
      seg.local_type = local_scan.o_type;
      LAIR_RETURN_IF_ERROR(CudaStatus(cuda::LaunchScan(local_scan, s()), what));
    }
    LAIR_RETURN_IF_ERROR(CudaStatus(cuda::LaunchCarrySegmentStates(seg, s()), what));
    return CudaStatus(cuda::LaunchAddSegmentEntries(seg, s()), what);
  }

  // The two-pass schedule pays a store and a load of every chunk's bf16 state
  // to run every chunk's outputs at once: worth it when the one-pass CTAs
  // (64-column tiles, before any key split) leave multiprocessors idle while
  // each walks more than one chunk (a prefill of one long prompt). Output
  // CTAs of more than kTwoPassMaxKeys keys would run one per multiprocessor
  // (H100, GLA 1.3B prefill: 16.1 ms of scans against 14.8 in one pass), so
  // wider keys split into blocks for the output pass (OutputBlocks). Auto
  // takes it where the segments do not serve (Segmented, measured faster:
  // GLA 1.3B prefill, H100, 104k against 98k tokens/s).
  bool TwoPass(const ScanParams& p, const DeviceBatch& db) const {
    if (scan_schedule_ == ScanSchedule::kOnePass || !cuda::ScanMmaTwoPassSupports(p) ||
        OutputBlocks(p) == 0)
      return false;
    if (scan_schedule_ == ScanSchedule::kTwoPass) return true;
    return OnePassLeavesSmsIdle(p, db);
  }

  // Key blocks of the output pass: the fewest of at most kTwoPassMaxKeys
  // keys each, a multiple of 16; 0 when the keys do not split so.
  static int OutputBlocks(const ScanParams& p) {
    const int blocks = (p.dk + kTwoPassMaxKeys - 1) / kTwoPassMaxKeys;
    return p.dk % blocks == 0 && (p.dk / blocks) % 16 == 0 ? blocks : 0;
  }

  // The state pass over key blocks where that fills the multiprocessors
  // (KeyBlocks; each state row evolves alone), then the output pass over
  // OutputBlocks, whose partial outputs add.
  absl::Status RunTwoPass(const ScanParams& p, const DeviceBatch& db, int num_seqs,
                          std::vector<Tensor>& keep, std::string_view what) {
    LAIR_ASSIGN_OR_RETURN(Tensor states,
                          Temporary(DType::kBF16, {cuda::ScanMmaChunkStates(db.tokens, num_seqs),
                                                   p.heads, p.dk, p.dv}));
    keep.push_back(states);
    ScanParams state_pass = p;
    state_pass.o = nullptr;
    LAIR_ASSIGN_OR_RETURN(const int blocks, KeyBlocks(p, /*step=*/false, what));
    if (blocks > 1) LAIR_RETURN_IF_ERROR(KeyBlockView(state_pass, db.tokens, blocks, keep, what));
    LAIR_RETURN_IF_ERROR(
        CudaStatus(cuda::LaunchScanMmaStates(state_pass, states.raw(), s()), what));
    return InKeyBlocks(p, db.tokens, OutputBlocks(p), keep, what, [&](const ScanParams& scan) {
      return cuda::LaunchScanMmaOutputs(scan, states.raw(), db.max_len, s());
    });
  }

  // fp32 q, k, v become bf16 temporaries, so that a chunked scan takes the
  // tensor-core path (scan_mma.h: bf16 products, fp32 accumulation and
  // state) instead of the fp32 one: activations reach the scans in fp32, or
  // some of them in bf16 (a prefill's q, k, v: LinearWeight::sixteen_bit_ok),
  // and a prefill would otherwise spend most of its time in fp32 scans.
  // Scans the tensor-core path does not serve (a right decay with a left one,
  // dims not multiples of 16, f16 operands) keep their operands.
  absl::Status RoundForTensorCores(ScanParams& p, int64_t tokens, std::vector<Tensor>& keep) {
    const auto f32_or_bf16 = [](ElemType t) { return t == ElemType::kF32 || t == ElemType::kBF16; };
    ScanParams rounded = p;
    rounded.q.type = rounded.k.type = rounded.v.type = ElemType::kBF16;
    rounded.dk = std::min(p.dk, kMaxScanKeyDim);  // wider keys are scanned in blocks (KeyBlocks)
    if (!f32_or_bf16(p.q.type) || !f32_or_bf16(p.k.type) || !f32_or_bf16(p.v.type) ||
        !cuda::ScanMmaSupports(rounded) || tokens == 0)
      return absl::OkStatus();
    const int64_t rows = tokens * p.heads;
    for (auto [operand, width] :
         {std::pair{&p.q, p.dk}, std::pair{&p.k, p.dk}, std::pair{&p.v, p.dv}}) {
      if (operand->type == ElemType::kBF16) continue;
      LAIR_ASSIGN_OR_RETURN(Tensor half, Temporary(DType::kBF16, {rows, width}));
      LAIR_RETURN_IF_ERROR(CudaStatus(cuda::LaunchConvert(operand->ptr, ElemType::kF32, half.raw(),
                                                          ElemType::kBF16, rows * width, s()),
                                      "round scan operand"));
      *operand = Operand{half.raw(), ElemType::kBF16};
      keep.push_back(std::move(half));
    }
    return absl::OkStatus();
  }

  // Each row of a decay scan's state evolves on its own (left decays act
  // per row, right decays on every row alike) and o_t = Σ_a q_t[a]·S_t[a, :],
  // so the dk rows split into blocks whose partial outputs add. Splitting
  // into B blocks is a reshape of q, k, vector gates and states to B·H heads
  // of dk/B keys; the B heads of a block share v (ScanParams::v_head_share)
  // and the other gates repeat per block. Keys wider than a
  // launch's tile need it; chunked scans also take it while fewer CTAs than
  // multiprocessors would run (GSA's first pass at batch 1: four heads of
  // one 64-column tile each; GLA 1.3B's prefill: 32 tiles), down to
  // kMinKeyBlockRows rows per block (kMinMmaKeyBlockRows on the tensor-core
  // path), below which each block's repeated value-side work dominates.
  // The mLSTM normalizer and stabilizer are not sums over rows.
  absl::StatusOr<int> KeyBlocks(const ScanParams& p, bool step, std::string_view what) const {
    const bool row_sums = p.norm == cuda::NormKind::kNone && !p.stabilize && !p.key_weight.ptr &&
                          !p.row_weight.ptr && !p.n_final && !p.n_init;
    // The step kernel takes wide keys whole (no repeated operands and no
    // partial sums to add: GSA's key pass at key_dim 512).
    const int max_dk = step ? cuda::kMaxStepKeyDim : kMaxScanKeyDim;
    int blocks = 1;
    while (p.dk / blocks > max_dk && p.dk % (2 * blocks) == 0) blocks *= 2;
    if (p.dk / blocks > max_dk || (p.dk / blocks) % 4 != 0 || (blocks > 1 && !row_sums))
      return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": key_dim ", p.dk,
                                                     " does not split into blocks of at most ",
                                                     max_dk, " keys"));
    cuda::ScanParams block = p;
    block.dk = p.dk / blocks;
    if (step || !row_sums) return blocks;
    // The tensor-core path keeps 16-row blocks of at least kMinMmaKeyBlockRows.
    const bool mma = cuda::ScanMmaSupports(block);
    const int min_rows = mma ? kMinMmaKeyBlockRows : kMinKeyBlockRows;
    const int multiple = mma ? 16 : 4;
    const int64_t ctas = (p.dv + kScanTileColumns - 1) / kScanTileColumns * p.heads * p.num_seqs;
    while (ctas * blocks < sm_count_ && p.dk % (2 * blocks) == 0 &&
           p.dk / (2 * blocks) >= min_rows && (p.dk / (2 * blocks)) % multiple == 0)
      blocks *= 2;
    return blocks;
  }

  // p becomes the scan of `blocks`·H heads of dk/blocks keys (p itself for
  // one block) writing partial outputs [tokens, blocks·H, dv] (a temporary
  // in p.o, fp32 unless parts_type says).
  absl::Status SplitKeysIntoHeads(ScanParams& p, int64_t tokens, int blocks,
                                  std::vector<Tensor>& keep, std::string_view what,
                                  DType parts_type = DType::kF32) {
    const int64_t rows = tokens * p.heads;
    if (blocks > 1) LAIR_RETURN_IF_ERROR(KeyBlockView(p, tokens, blocks, keep, what));
    LAIR_ASSIGN_OR_RETURN(Tensor parts, Temporary(parts_type, {rows * blocks, p.dv}));
    keep.push_back(parts);
    p.o = parts.raw();
    p.o_type = Elem(parts_type);
    return absl::OkStatus();
  }

  // p becomes the scan of `blocks`·H heads of dk/blocks keys (its output
  // fields untouched): q, k, left vector gates and states reshaped, scalar
  // gates repeated per block, v and the right gate read in place.
  absl::Status KeyBlockView(ScanParams& p, int64_t tokens, int blocks, std::vector<Tensor>& keep,
                            std::string_view what) {
    for (const StateRef* state : {&p.s_init, &p.s_final})
      if (state->ptr && (state->stride_a != p.dv || state->stride_b != 1))
        return absl::InvalidArgumentError(
            absl::StrCat(std::string(what), ": key blocks need states in pool order"));
    const int heads = p.heads, dk = p.dk;
    auto repeat = [&](const void* src, ElemType type, int64_t rows,
                      int width) -> absl::StatusOr<void*> {
      const DType dtype = type == ElemType::kF32    ? DType::kF32
                          : type == ElemType::kBF16 ? DType::kBF16
                                                    : DType::kF16;
      LAIR_ASSIGN_OR_RETURN(Tensor copy, Temporary(dtype, {rows * blocks, width}));
      LAIR_RETURN_IF_ERROR(CudaStatus(
          cuda::LaunchRepeatRows(src, type, rows, width, blocks, copy.raw(), s()), what));
      keep.push_back(copy);
      return copy.raw();
    };
    // A scalar or constant gate: one value per (token, head) or per head.
    auto repeat_scalar_gate = [&](LogGate& g) -> absl::Status {
      if (!g.ptr) return absl::OkStatus();
      if (g.head_stride != 1 || (g.token_stride != 0 && g.token_stride != heads))
        return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": gate layout"));
      const int64_t rows = g.token_stride == 0 ? heads : tokens * heads;
      LAIR_ASSIGN_OR_RETURN(void* copy, repeat(g.ptr, ElemType::kF32, rows, 1));
      g.ptr = static_cast<const float*>(copy);
      if (g.token_stride != 0) g.token_stride = heads * blocks;
      return absl::OkStatus();
    };
    if (p.left_vector) {
      if (p.left.ptr && p.left.head_stride != dk)
        return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": gate layout"));
      p.left.head_stride = dk / blocks;  // a reshape: [N, H, dk] = [N, H·blocks, dk/blocks]
    } else {
      LAIR_RETURN_IF_ERROR(repeat_scalar_gate(p.left));
    }
    p.v_head_share = blocks;  // the blocks of a head read its v and right gate in place
    p.heads = heads * blocks;
    p.dk = dk / blocks;
    return absl::OkStatus();
  }

  std::shared_ptr<StreamHolder> stream_;
  std::string name_;
  std::unique_ptr<cuda::CudaDenseOps> dense_;  // destroyed before the stream
  // GemmMode::kFast: multi-token scans round fp32 q, k, v to bf16 for the
  // tensor-core path (RoundForTensorCores).
  bool tensor_core_scans_ = false;
  ScanSchedule scan_schedule_ = ScanSchedule::kAuto;
  int sm_count_ = 1;  // multiprocessors (KeyBlocks fills them)
  StepArena arena_;
  absl::Status step_status_;                             // of the last BeginStep
  PinnedUpload<int32_t> staging_{"staging"};             // StageInts
  PinnedUpload<RowSampling> sampling_{"sampling rows"};  // SampleRows
  PinnedDownload pinned_;
  bool capturing_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device_index,
                                                         const BackendOptions& options) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
    return absl::UnavailableError("no CUDA device is present");
  if (device_index < 0 || device_index >= count)
    return absl::UnavailableError(
        absl::StrCat("no CUDA device ", device_index, " (", count, " present)"));
  LAIR_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_index), "set device"));
  cudaDeviceProp prop{};
  LAIR_RETURN_IF_ERROR(
      CudaStatus(cudaGetDeviceProperties(&prop, device_index), "device properties"));
  // Temporaries come from the device's default stream-ordered pool. Keep
  // what it has mapped instead of returning it at every synchronization:
  // remapping hundreds of MB per prefill layer cost more than the scans.
  cudaMemPool_t pool = nullptr;
  LAIR_RETURN_IF_ERROR(
      CudaStatus(cudaDeviceGetDefaultMemPool(&pool, device_index), "default memory pool"));
  uint64_t keep_all = std::numeric_limits<uint64_t>::max();
  LAIR_RETURN_IF_ERROR(
      CudaStatus(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all),
                 "memory pool release threshold"));
  auto holder = std::make_shared<StreamHolder>();
  holder->device = device_index;
  LAIR_RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&holder->stream, cudaStreamNonBlocking), "stream"));
  LAIR_ASSIGN_OR_RETURN(
      std::unique_ptr<cuda::CudaDenseOps> dense,
      cuda::CudaDenseOps::Create(holder->stream, options.gemm == GemmMode::kFast
                                                     ? cuda::GemmPrecision::kFast
                                                     : cuda::GemmPrecision::kExact));
  return std::unique_ptr<Backend>(
      new CudaBackend(std::move(holder), absl::StrCat("cuda:", device_index, " (", prop.name, ")"),
                      std::move(dense), options, prop.multiProcessorCount));
}

}  // namespace lair::kernels
