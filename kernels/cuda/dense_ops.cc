// CudaDenseOps: argument validation (kernels/dense_checks.h, shared with the
// CPU reference, plus the CUDA limits), scratch and batch uploads, and the
// mapping of each op onto the launchers of kernels/cuda/dense_launch.h.
#include "kernels/cuda/dense_ops.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/dense_launch.h"
#include "kernels/cuda/dense_small_gemm.h"
#include "kernels/dense_checks.h"

namespace lair::kernels::cuda {
namespace {

using dense::ScratchLayout;

absl::Status CudaStatus(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("CUDA ", std::string(what), ": ", cudaGetErrorString(err)));
}

// Row-major strides of `shape`.
std::vector<int64_t> Strides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d)
    strides[d] = strides[d + 1] * shape[d + 1];
  return strides;
}

// The broadcast index of y's shape for operands with strides sa and sb.
absl::StatusOr<dense::BroadcastIndex> MakeIndex(std::string_view op, const Shape& shape,
                                                const std::vector<int64_t>& sa,
                                                const std::vector<int64_t>& sb) {
  if (shape.size() > static_cast<size_t>(dense::kMaxRank)) {
    return InvalidDenseArg(op, "y",
                           absl::StrCat("broadcasting supports rank up to ", dense::kMaxRank,
                                        ", got ", ShapeString(shape)));
  }
  dense::BroadcastIndex ix;
  ix.rank = static_cast<int>(shape.size());
  for (int d = 0; d < ix.rank; ++d) {
    ix.shape[d] = shape[d];
    ix.stride_a[d] = sa[d];
    ix.stride_b[d] = sb[d];
  }
  return ix;
}

dense::NormParams NormLaunch(const NormArgs& args, int64_t group) {
  dense::NormParams p;
  p.kind = args.kind;
  p.gate_mode = args.gate_mode;
  p.eps = args.eps;
  p.rows = args.x.dim(0);
  p.cols = args.x.dim(1);
  p.group = group;
  p.x = args.x.raw();
  p.x_type = args.x.dtype();
  p.weight = args.weight.defined() ? args.weight.f32() : nullptr;
  p.shared_weight = args.weight.defined() && args.weight.dim(0) != p.cols;
  if (NormHasGate(args.gate_mode)) {
    p.gate = args.gate.raw();
    p.gate_type = args.gate.dtype();
  }
  return p;
}

dense::ConvParams ConvLaunch(const SequenceBatch& batch, const Conv1dArgs& args, int64_t channels,
                             int64_t width) {
  dense::ConvParams p;
  p.num_seqs = batch.num_seqs;
  p.tokens = args.x.dim(0);
  p.channels = channels;
  p.width = width;
  p.zero_initial_state = batch.zero_initial_state;
  p.x = args.x.f32();
  p.weight = args.weight.f32();
  p.bias = args.bias.defined() ? args.bias.f32() : nullptr;
  p.silu = args.silu;
  p.state = args.state.f32();
  return p;
}

// CUDA's limit on attention's head_dim, on top of the shared checks.
absl::Status CheckHeadDim(std::string_view op, const AttentionArgs& args) {
  if (args.head_dim <= 0 || args.head_dim > CudaDenseOps::kMaxHeadDim) {
    return InvalidDenseArg(
        op, "head_dim",
        absl::StrCat(args.head_dim, " outside [1, ", CudaDenseOps::kMaxHeadDim, "]"));
  }
  return absl::OkStatus();
}

// Row chunks for a column sum of `columns` outputs over `rows`: enough
// threads to fill the GPU, at least kMinRows rows per chunk.
int ColumnSplits(int64_t columns, int64_t rows, int sm_count) {
  constexpr int64_t kMinRows = 32, kMaxSplits = 512;
  const int64_t want =
      std::max<int64_t>(1, int64_t{sm_count} * 2048 / std::max<int64_t>(columns, 1));
  const int64_t most = std::max<int64_t>(1, rows / kMinRows);
  return static_cast<int>(std::min({want, most, kMaxSplits}));
}

// Room for CudaDenseOps::UploadBatch's three arrays.
void AddBatchInts(ScratchLayout* layout, const SequenceBatch& batch) {
  layout->Add<int32_t>(batch.num_seqs + 1);
  layout->Add<int32_t>(batch.num_seqs);
  layout->Add<int32_t>(batch.num_seqs);
}

}  // namespace

namespace dense {
namespace {

// Bumped whenever any DeviceScratch moves (CudaDenseOps::ScratchEpoch).
std::atomic<uint64_t> scratch_epoch{0};

}  // namespace

DeviceScratch::~DeviceScratch() {
  if (ptr_) cudaFreeAsync(ptr_, stream_);
}

absl::StatusOr<char*> DeviceScratch::Get(size_t bytes) {
  if (bytes <= size_ && ptr_) return ptr_;
  scratch_epoch.fetch_add(1, std::memory_order_relaxed);
  if (ptr_) LAIR_RETURN_IF_ERROR(CudaStatus(cudaFreeAsync(ptr_, stream_), "scratch free"));
  ptr_ = nullptr;
  size_ = 0;
  const size_t grown = std::max<size_t>(bytes + bytes / 2, 1 << 16);
  void* p = nullptr;
  LAIR_RETURN_IF_ERROR(CudaStatus(cudaMallocAsync(&p, grown, stream_), "scratch"));
  ptr_ = static_cast<char*>(p);
  size_ = grown;
  return ptr_;
}

}  // namespace dense

CudaDenseOps::CudaDenseOps(cudaStream_t stream, GemmPrecision precision)
    : stream_(stream),
      precision_(precision),
      scratch_(std::make_unique<dense::DeviceScratch>(stream)) {}

CudaDenseOps::~CudaDenseOps() {
  if (fault_) cudaFreeAsync(fault_, stream_);
}

absl::StatusOr<std::unique_ptr<CudaDenseOps>> CudaDenseOps::Create(cudaStream_t stream,
                                                                   GemmPrecision precision) {
  std::unique_ptr<CudaDenseOps> ops(new CudaDenseOps(stream, precision));
  int device = 0;
  LAIR_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&device), "get device"));
  LAIR_RETURN_IF_ERROR(CudaStatus(
      cudaDeviceGetAttribute(&ops->sm_count_, cudaDevAttrMultiProcessorCount, device), "SM count"));
  void* fault = nullptr;
  LAIR_RETURN_IF_ERROR(CudaStatus(cudaMallocAsync(&fault, sizeof(int), stream), "fault word"));
  ops->fault_ = static_cast<int*>(fault);
  LAIR_RETURN_IF_ERROR(
      CudaStatus(cudaMemsetAsync(ops->fault_, 0, sizeof(int), stream), "fault word"));
  LAIR_ASSIGN_OR_RETURN(ops->gemm_, dense::GemmRunner::Create(stream));
  return ops;
}

absl::StatusOr<char*> CudaDenseOps::Scratch(size_t bytes) { return scratch_->Get(bytes); }

uint64_t CudaDenseOps::ScratchEpoch() {
  return dense::scratch_epoch.load(std::memory_order_relaxed);
}

absl::StatusOr<CudaDenseOps::DeviceInts> CudaDenseOps::UploadBatch(const SequenceBatch& batch,
                                                                   bool with_slots,
                                                                   std::span<const int32_t> starts,
                                                                   const int32_t* starts_device,
                                                                   char** scratch) {
  const int64_t s = batch.num_seqs;
  int32_t* cu = ScratchLayout::Take<int32_t>(scratch, s + 1);
  int32_t* slots = ScratchLayout::Take<int32_t>(scratch, s);
  int32_t* start = ScratchLayout::Take<int32_t>(scratch, s);
  DeviceInts ints{batch.cu_seqlens_device, with_slots ? batch.state_slot_device : nullptr,
                  starts.empty() ? nullptr : starts_device};
  // Host spans go through pageable memory, so the stream is synchronized
  // before they may change (only when a device copy is missing).
  bool copied = false;
  auto upload = [&](std::span<const int32_t> host, int32_t* dst,
                    const int32_t** out) -> absl::Status {
    if (*out != nullptr || host.empty()) return absl::OkStatus();
    LAIR_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(dst, host.data(), host.size_bytes(), cudaMemcpyHostToDevice, stream_),
        "batch upload"));
    *out = dst;
    copied = true;
    return absl::OkStatus();
  };
  LAIR_RETURN_IF_ERROR(upload(batch.cu_seqlens, cu, &ints.cu_seqlens));
  if (with_slots) LAIR_RETURN_IF_ERROR(upload(batch.state_slot, slots, &ints.slots));
  LAIR_RETURN_IF_ERROR(upload(starts, start, &ints.starts));
  if (copied) LAIR_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), "batch upload"));
  return ints;
}

absl::Status CudaDenseOps::TakeIndexFault() {
  if (!fault_unread_) return absl::OkStatus();
  fault_unread_ = false;
  int fault = 0;
  LAIR_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(&fault, fault_, sizeof(int), cudaMemcpyDeviceToHost, stream_), "fault"));
  LAIR_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), "fault"));
  if (fault == 0) return absl::OkStatus();
  LAIR_RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(fault_, 0, sizeof(int), stream_), "fault"));
  std::string what;
  if (fault & dense::kFaultEmbeddingIds) absl::StrAppend(&what, "Embedding: ids; ");
  if (fault & dense::kFaultEmbeddingBackwardIds) absl::StrAppend(&what, "EmbeddingBackward: ids; ");
  if (fault & dense::kFaultCrossEntropyTargets) absl::StrAppend(&what, "CrossEntropy: targets; ");
  return absl::InvalidArgumentError(
      absl::StrCat(what,
                   "device values out of range were skipped (NaN rows in Embedding.out and "
                   "CrossEntropy.losses/d_logits)"));
}

namespace {

// `sixteen_bit_c`: c may be BF16/F16 (GemmCall::c16). `a_formed`: the
// product reads a's input norm, formed by GemmRunner::RunGroup, so a may be
// BF16/F16 too (then GemmCall::a is left null).
absl::StatusOr<dense::GemmCall> CheckedGemmCall(const GemmArgs& args, bool sixteen_bit_c = false,
                                                bool a_formed = false) {
  constexpr DType kWeightDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  LAIR_ASSIGN_OR_RETURN(GemmDims dims,
                        CheckGemmArgs(args, Device::kCuda, kWeightDTypes, sixteen_bit_c, a_formed));
  dense::GemmCall call;
  call.m = dims.m;
  call.n = dims.n;
  call.k = dims.k;
  call.a = args.a.dtype() == DType::kF32 ? args.a.f32() : nullptr;
  call.trans_a = args.trans_a;
  call.b = args.b.raw();
  call.b_type = args.b.dtype();
  call.trans_b = args.trans_b;
  if (args.c.dtype() == DType::kF32) {
    call.c = args.c.f32();
  } else {
    call.c16 = args.c.raw();
    call.c16_type = args.c.dtype();
  }
  call.alpha = args.alpha;
  call.beta = args.beta;
  call.bias = args.bias.defined() ? args.bias.f32() : nullptr;
  return call;
}

}  // namespace

absl::Status CudaDenseOps::Gemm(const GemmArgs& args) {
  LAIR_ASSIGN_OR_RETURN(dense::GemmCall call, CheckedGemmCall(args));
  return gemm_->Run(call, precision_);
}

absl::Status CudaDenseOps::LinearGroup(const LinearGroupArgs& args) {
  LAIR_ASSIGN_OR_RETURN(std::vector<LinearProduct> products,
                        LinearGroupProducts(args, Device::kCuda));
  std::vector<dense::GemmCall> calls;
  for (const LinearProduct& product : products) {
    LAIR_ASSIGN_OR_RETURN(dense::GemmCall call,
                          CheckedGemmCall(product.gemm, true, args.input_norm.has_value()));
    call.act = product.activation;
    call.residual = product.residual.defined() ? product.residual.f32() : nullptr;
    call.a_gate = args.silu_gate.defined() ? args.silu_gate.f32() : nullptr;
    calls.push_back(call);
  }
  if (!args.input_norm) return gemm_->RunGroup(calls, precision_);
  NormArgs norm = *args.input_norm;
  norm.x = args.x;
  LAIR_ASSIGN_OR_RETURN(int64_t group, CheckInputNorm(args, Device::kCuda));
  const dense::NormParams norm_launch = NormLaunch(norm, group);
  return gemm_->RunGroup(calls, precision_, &norm_launch);
}

namespace {

// The gate, up and down products of a SwiGLU MLP with 16-bit weights of one
// type (the down product's a is formed by the runner), checked.
absl::StatusOr<std::array<dense::GemmCall, 3>> SwiGluCalls(const SwiGluArgs& args) {
  LAIR_RETURN_IF_ERROR(CheckSwiGluArgs(args, Device::kCuda).status());
  const DType type = args.w_gate.dtype();
  if (type != DType::kBF16 && type != DType::kF16)
    return InvalidDenseArg("SwiGlu", "w_gate", "16-bit weights expected");
  std::array<dense::GemmCall, 3> calls;
  const std::array<const Tensor*, 3> weights = {&args.w_gate, &args.w_up, &args.w_down};
  for (int i = 0; i < 3; ++i) {
    dense::GemmCall& c = calls[i];
    c.m = args.x.dim(0);
    c.n = weights[i]->dim(0);
    c.k = weights[i]->dim(1);
    c.a = i < 2 ? args.x.f32() : nullptr;
    c.b = weights[i]->raw();
    c.b_type = type;
  }
  calls[2].c = args.out.f32();
  calls[2].residual = args.residual.defined() ? args.residual.f32() : nullptr;
  return calls;
}

}  // namespace

DType CudaDenseOps::ProductOutputDType(int64_t rows) const {
  return precision_ == GemmPrecision::kFast && rows > dense::kSmallProductMaxRows ? DType::kBF16
                                                                                  : DType::kF32;
}

bool CudaDenseOps::TakesSwiGlu(const SwiGluArgs& args) const {
  const absl::StatusOr<std::array<dense::GemmCall, 3>> calls = SwiGluCalls(args);
  return calls.ok() && dense::GemmRunner::TakesSwiGlu(*calls, precision_);
}

absl::Status CudaDenseOps::SwiGlu(const SwiGluArgs& args) {
  LAIR_ASSIGN_OR_RETURN(const auto calls, SwiGluCalls(args));
  if (!dense::GemmRunner::TakesSwiGlu(calls, precision_)) {
    return absl::InvalidArgumentError(
        "SwiGlu: the fused path needs gate and up products the decode GEMV takes, or fast "
        "precision and rows past the decode kernels'");
  }
  if (!args.input_norm) return gemm_->RunSwiGlu(calls, precision_, nullptr);
  NormArgs norm = *args.input_norm;
  norm.x = args.x;
  LAIR_ASSIGN_OR_RETURN(int64_t group, CheckSwiGluArgs(args, Device::kCuda));
  const dense::NormParams norm_launch = NormLaunch(norm, group);
  return gemm_->RunSwiGlu(calls, precision_, &norm_launch);
}

absl::Status CudaDenseOps::Embedding(const EmbeddingArgs& args) {
  constexpr std::string_view kOp = "Embedding";
  LAIR_RETURN_IF_ERROR(CheckEmbeddingArgs(args, Device::kCuda));
  dense::EmbeddingParams p;
  p.rows = args.table.dim(0);
  p.width = args.table.dim(1);
  p.count = args.ids.dim(0);
  p.table = args.table.f32();
  p.ids = args.ids.data<int32_t>();
  p.out = args.out.f32();
  p.fault = fault_;
  fault_unread_ = true;
  return CudaStatus(dense::LaunchEmbedding(p, stream_), kOp);
}

absl::Status CudaDenseOps::EmbeddingBackward(const EmbeddingBackwardArgs& args) {
  constexpr std::string_view kOp = "EmbeddingBackward";
  LAIR_RETURN_IF_ERROR(CheckEmbeddingBackwardArgs(args, Device::kCuda));
  dense::EmbeddingBackwardParams p;
  p.rows = args.d_table.dim(0);
  p.width = args.d_table.dim(1);
  p.count = args.ids.dim(0);
  p.ids = args.ids.data<int32_t>();
  p.d_out = args.d_out.f32();
  p.d_table = args.d_table.f32();
  p.fault = fault_;
  fault_unread_ = true;
  return CudaStatus(dense::LaunchEmbeddingBackward(p, stream_), kOp);
}

absl::Status CudaDenseOps::Norm(const NormArgs& args) {
  constexpr std::string_view kOp = "Norm";
  LAIR_ASSIGN_OR_RETURN(int64_t group, CheckNormArgs(args, Device::kCuda));
  dense::NormParams p = NormLaunch(args, group);
  p.y = args.y.f32();
  return CudaStatus(dense::LaunchNorm(p, stream_), kOp);
}

absl::Status CudaDenseOps::NormBackward(const NormBackwardArgs& args) {
  constexpr std::string_view kOp = "NormBackward";
  const NormArgs& fwd = args.fwd;
  LAIR_ASSIGN_OR_RETURN(int64_t group, CheckNormBackwardArgs(args, Device::kCuda));
  dense::NormBackwardParams p;
  p.fwd = NormLaunch(fwd, group);
  p.d_y = args.d_y.f32();
  p.dx = args.dx.f32();
  p.d_gate = args.d_gate.defined() ? args.d_gate.f32() : nullptr;
  if (args.d_weight.defined()) {
    p.d_weight = args.d_weight.f32();
    // A weight shared by the groups of a row has one group's columns.
    const int64_t columns = args.d_weight.numel();
    p.splits = ColumnSplits(columns, p.fwd.rows, sm_count_);
    ScratchLayout layout;
    layout.Add<float2>(p.fwd.rows * (p.fwd.cols / group));
    layout.Add<double>(p.splits * columns);
    LAIR_ASSIGN_OR_RETURN(char* cursor, Scratch(layout.bytes()));
    p.stats = ScratchLayout::Take<float2>(&cursor, p.fwd.rows * (p.fwd.cols / group));
    p.partial = ScratchLayout::Take<double>(&cursor, p.splits * columns);
  }
  return CudaStatus(dense::LaunchNormBackward(p, stream_), kOp);
}

absl::Status CudaDenseOps::Unary(const UnaryArgs& args) {
  constexpr std::string_view kOp = "Unary";
  LAIR_ASSIGN_OR_RETURN(std::vector<int64_t> sx, CheckUnaryArgs(args, Device::kCuda));
  dense::UnaryParams p;
  p.op = args.op;
  p.alpha = args.alpha;
  p.beta = args.beta;
  p.in_scale = args.in_scale;
  p.x = args.x.f32();
  p.y = args.y.f32();
  p.count = args.y.numel();
  p.broadcast = args.x.shape() != args.y.shape();
  if (p.broadcast) {
    LAIR_ASSIGN_OR_RETURN(p.index, MakeIndex(kOp, args.y.shape(), sx, sx));
  }
  return CudaStatus(dense::LaunchUnary(p, stream_), kOp);
}

absl::Status CudaDenseOps::UnaryBackward(const UnaryBackwardArgs& args) {
  constexpr std::string_view kOp = "UnaryBackward";
  const UnaryArgs& fwd = args.fwd;
  LAIR_RETURN_IF_ERROR(CheckUnaryBackwardArgs(args, Device::kCuda));
  dense::UnaryBackwardParams p;
  p.op = fwd.op;
  p.alpha = fwd.alpha;
  p.in_scale = fwd.in_scale;
  p.x = fwd.x.f32();
  p.d_y = args.d_y.f32();
  p.dx = args.dx.f32();
  p.count = fwd.x.numel();
  return CudaStatus(dense::LaunchUnaryBackward(p, stream_), kOp);
}

absl::Status CudaDenseOps::Binary(const BinaryArgs& args) {
  constexpr std::string_view kOp = "Binary";
  LAIR_ASSIGN_OR_RETURN(BinaryStrides strides, CheckBinaryArgs(args, Device::kCuda));
  dense::BinaryParams p;
  p.op = args.op;
  p.a = args.a.f32();
  p.b = args.b.f32();
  p.y = args.y.f32();
  p.count = args.y.numel();
  p.broadcast = args.a.shape() != args.y.shape() || args.b.shape() != args.y.shape();
  if (p.broadcast) {
    LAIR_ASSIGN_OR_RETURN(p.index, MakeIndex(kOp, args.y.shape(), strides.a, strides.b));
  }
  return CudaStatus(dense::LaunchBinary(p, stream_), kOp);
}

absl::Status CudaDenseOps::ReduceSum(const ReduceSumArgs& args) {
  constexpr std::string_view kOp = "ReduceSum";
  LAIR_RETURN_IF_ERROR(CheckReduceSumArgs(args, Device::kCuda).status());
  if (args.x.rank() > dense::kMaxRank) {
    return InvalidDenseArg(
        kOp, "x", absl::StrCat("rank up to ", dense::kMaxRank, ", got ", args.x.DebugString()));
  }
  // Kept dims index y (extent-1 dims dropped); reduced dims are those where
  // y is 1 and x is not, the innermost held apart.
  const std::vector<int64_t> sx = Strides(args.x.shape());
  dense::ReduceSumParams p;
  p.x = args.x.f32();
  p.y = args.y.f32();
  p.outputs = args.y.numel();
  p.reduce_count = 1;
  std::vector<int> reduced;
  for (int d = 0; d < args.x.rank(); ++d) {
    const int64_t xe = args.x.shape()[d], ye = args.y.shape()[d];
    if (ye == xe) {
      if (ye == 1) continue;
      p.kept_shape[p.kept_rank] = ye;
      p.kept_stride[p.kept_rank++] = sx[d];
    } else {
      reduced.push_back(d);
      p.reduce_count *= xe;
    }
  }
  if (!reduced.empty()) {
    p.inner_count = args.x.shape()[reduced.back()];
    p.inner_stride = sx[reduced.back()];
    for (size_t i = 0; i + 1 < reduced.size(); ++i) {
      p.outer_shape[p.outer_rank] = args.x.shape()[reduced[i]];
      p.outer_stride[p.outer_rank++] = sx[reduced[i]];
    }
  }
  p.splits = ColumnSplits(p.outputs, p.reduce_count, sm_count_);
  if (p.splits > 1) {
    LAIR_ASSIGN_OR_RETURN(char* cursor,
                          Scratch(static_cast<size_t>(p.splits * p.outputs) * sizeof(double)));
    p.partial = reinterpret_cast<double*>(cursor);
  }
  return CudaStatus(dense::LaunchReduceSum(p, stream_), kOp);
}

absl::Status CudaDenseOps::CopyColumns(const CopyColumnsArgs& args) {
  constexpr std::string_view kOp = "CopyColumns";
  LAIR_RETURN_IF_ERROR(CheckCopyColumnsArgs(args, Device::kCuda));
  dense::CopyColumnsParams p;
  p.rows = DenseRows(args.src);
  p.src_cols = args.src.dim(-1);
  p.dst_cols = args.dst.dim(-1);
  p.src = args.src.f32();
  p.dst = args.dst.f32();
  p.src_col = args.src_col;
  p.dst_col = args.dst_col;
  p.width = args.width;
  p.accumulate = args.accumulate;
  return CudaStatus(dense::LaunchCopyColumns(p, stream_), kOp);
}

absl::Status CudaDenseOps::Conv1d(const SequenceBatch& batch, const Conv1dArgs& args) {
  constexpr std::string_view kOp = "Conv1d";
  LAIR_ASSIGN_OR_RETURN(ConvDims dims, CheckConv1dArgs(batch, args, Device::kCuda));
  const int64_t channels = dims.channels, width = dims.width;
  ScratchLayout layout;
  AddBatchInts(&layout, batch);
  LAIR_ASSIGN_OR_RETURN(char* cursor, Scratch(layout.bytes()));
  LAIR_ASSIGN_OR_RETURN(DeviceInts ints, UploadBatch(batch, true, {}, nullptr, &cursor));
  dense::ConvParams p = ConvLaunch(batch, args, channels, width);
  p.cu_seqlens = ints.cu_seqlens;
  p.slots = ints.slots;
  p.y = args.y.f32();
  return CudaStatus(dense::LaunchConv1d(p, stream_), kOp);
}

absl::Status CudaDenseOps::Conv1dBackward(const SequenceBatch& batch,
                                          const Conv1dBackwardArgs& args) {
  constexpr std::string_view kOp = "Conv1dBackward";
  const Conv1dArgs& fwd = args.fwd;
  LAIR_ASSIGN_OR_RETURN(ConvDims dims, CheckConv1dBackwardArgs(batch, args, Device::kCuda));
  const int64_t channels = dims.channels, width = dims.width;
  dense::ConvBackwardParams p;
  p.fwd = ConvLaunch(batch, fwd, channels, width);
  const int64_t outputs = channels * width + (args.d_bias.defined() ? channels : 0);
  p.splits = ColumnSplits(outputs, p.fwd.tokens, sm_count_);
  ScratchLayout layout;
  AddBatchInts(&layout, batch);
  layout.Add<float>(p.fwd.tokens * channels);
  layout.Add<double>(p.splits * outputs);
  LAIR_ASSIGN_OR_RETURN(char* cursor, Scratch(layout.bytes()));
  LAIR_ASSIGN_OR_RETURN(DeviceInts ints, UploadBatch(batch, true, {}, nullptr, &cursor));
  p.fwd.cu_seqlens = ints.cu_seqlens;
  p.fwd.slots = ints.slots;
  p.d_pre = ScratchLayout::Take<float>(&cursor, p.fwd.tokens * channels);
  p.partial = ScratchLayout::Take<double>(&cursor, p.splits * outputs);
  p.d_y = args.d_y.f32();
  p.dx = args.dx.f32();
  p.d_weight = args.d_weight.f32();
  p.d_bias = args.d_bias.defined() ? args.d_bias.f32() : nullptr;
  return CudaStatus(dense::LaunchConv1dBackward(p, stream_), kOp);
}

absl::Status CudaDenseOps::Rotary(const RotaryArgs& args) {
  constexpr std::string_view kOp = "Rotary";
  LAIR_RETURN_IF_ERROR(CheckRotaryArgs(args, Device::kCuda));
  const int64_t n = args.x.dim(0), heads = args.x.dim(1), dim = args.x.dim(2);
  if (args.rotary_dim > CudaDenseOps::kMaxRotaryDim) {
    return InvalidDenseArg(
        kOp, "rotary_dim",
        absl::StrCat(args.rotary_dim, " above the CUDA limit ", CudaDenseOps::kMaxRotaryDim));
  }
  dense::RotaryParams p;
  p.x = args.x.f32();
  p.positions = args.positions.data<int32_t>();
  p.y = args.y.f32();
  p.tokens = n;
  p.heads = static_cast<int>(heads);
  p.dim = static_cast<int>(dim);
  p.rotary_dim = args.rotary_dim;
  p.interleaved = args.interleaved;
  p.inverse = args.inverse;
  // The CPU reference's float expression, so angles match bit for bit.
  for (int i = 0; i < args.rotary_dim / 2; ++i) {
    p.inv_freq[i] = 1.0f / std::pow(args.theta, static_cast<float>(2 * i) /
                                                    static_cast<float>(args.rotary_dim));
  }
  return CudaStatus(dense::LaunchRotary(p, stream_), kOp);
}

absl::Status CudaDenseOps::Attention(const SequenceBatch& batch, const AttentionArgs& args) {
  constexpr std::string_view kOp = "Attention";
  LAIR_ASSIGN_OR_RETURN(const int64_t n, CheckAttentionArgs(batch, args, Device::kCuda));
  LAIR_RETURN_IF_ERROR(CheckHeadDim(kOp, args));
  const int64_t max_context = args.k_cache.dim(1);
  ScratchLayout layout;
  AddBatchInts(&layout, batch);
  LAIR_ASSIGN_OR_RETURN(char* cursor, Scratch(layout.bytes()));
  LAIR_ASSIGN_OR_RETURN(DeviceInts ints, UploadBatch(batch, true, args.start_positions,
                                                     args.start_positions_device, &cursor));
  dense::AttentionParams p;
  p.num_seqs = batch.num_seqs;
  p.heads = args.heads;
  p.kv_heads = args.kv_heads;
  p.head_dim = args.head_dim;
  p.tokens = n;
  p.scale = args.scale;
  p.cu_seqlens = ints.cu_seqlens;
  p.slots = ints.slots;
  p.starts = ints.starts;
  p.q = args.q.f32();
  p.k = args.k.f32();
  p.v = args.v.f32();
  p.o = args.o.f32();
  p.k_cache = args.k_cache.f32();
  p.v_cache = args.v_cache.f32();
  p.max_context = max_context;
  return CudaStatus(dense::LaunchAttention(p, stream_), kOp);
}

absl::Status CudaDenseOps::AttentionBackward(const SequenceBatch& batch,
                                             const AttentionBackwardArgs& args) {
  constexpr std::string_view kOp = "AttentionBackward";
  const AttentionArgs& fwd = args.fwd;
  LAIR_ASSIGN_OR_RETURN(const int64_t n, CheckAttentionBackwardArgs(batch, args, Device::kCuda));
  LAIR_RETURN_IF_ERROR(CheckHeadDim(kOp, fwd));
  ScratchLayout layout;
  AddBatchInts(&layout, batch);
  layout.Add<float>(n * fwd.heads);
  layout.Add<float>(n * fwd.heads);
  LAIR_ASSIGN_OR_RETURN(char* cursor, Scratch(layout.bytes()));
  LAIR_ASSIGN_OR_RETURN(DeviceInts ints, UploadBatch(batch, false, {}, nullptr, &cursor));
  dense::AttentionBackwardParams p;
  p.lse = ScratchLayout::Take<float>(&cursor, n * fwd.heads);
  p.delta = ScratchLayout::Take<float>(&cursor, n * fwd.heads);
  p.num_seqs = batch.num_seqs;
  p.heads = fwd.heads;
  p.kv_heads = fwd.kv_heads;
  p.head_dim = fwd.head_dim;
  p.tokens = n;
  p.scale = fwd.scale;
  p.cu_seqlens = ints.cu_seqlens;
  p.q = fwd.q.f32();
  p.k = fwd.k.f32();
  p.v = fwd.v.f32();
  p.d_o = args.d_o.f32();
  p.dq = args.dq.f32();
  p.dk = args.dk.f32();
  p.dv = args.dv.f32();
  return CudaStatus(dense::LaunchAttentionBackward(p, stream_), kOp);
}

absl::Status CudaDenseOps::CrossEntropy(const CrossEntropyArgs& args) {
  constexpr std::string_view kOp = "CrossEntropy";
  LAIR_RETURN_IF_ERROR(CheckCrossEntropyArgs(args, Device::kCuda));
  dense::CrossEntropyParams p;
  p.rows = args.logits.dim(0);
  p.vocab = args.logits.dim(1);
  p.logits = args.logits.f32();
  p.targets = args.targets.data<int32_t>();
  p.losses = args.losses.f32();
  p.d_logits = args.d_logits.defined() ? args.d_logits.f32() : nullptr;
  p.grad_scale = args.grad_scale;
  p.fault = fault_;
  fault_unread_ = true;
  return CudaStatus(dense::LaunchCrossEntropy(p, stream_), kOp);
}

}  // namespace lair::kernels::cuda
