#include "kernels/dense_checks.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace lair::kernels {
namespace {

// A defined tensor on `device` of `dtype` and, when rank >= 0, that rank.
absl::Status CheckTensor(std::string_view op, std::string_view field, const Tensor& t,
                         Device device, DType dtype = DType::kF32, int rank = -1) {
  if (!t.defined()) return InvalidDenseArg(op, field, "missing tensor");
  if (t.device() != device) {
    return InvalidDenseArg(op, field,
                           device == Device::kCpu ? "not a host tensor" : "not a CUDA tensor");
  }
  if (t.dtype() != dtype) {
    return InvalidDenseArg(
        op, field,
        absl::StrCat("expected ", std::string(DTypeName(dtype)), ", got ", t.DebugString()));
  }
  if (rank >= 0 && t.rank() != rank) {
    return InvalidDenseArg(op, field,
                           absl::StrCat("expected rank ", rank, ", got ", t.DebugString()));
  }
  return absl::OkStatus();
}

absl::Status CheckShape(std::string_view op, std::string_view field, const Tensor& t,
                        const Shape& shape) {
  if (t.shape() != shape) {
    return InvalidDenseArg(
        op, field,
        absl::StrCat("expected shape ", ShapeString(shape), ", got ", ShapeString(t.shape())));
  }
  return absl::OkStatus();
}

// The packed-batch invariants of kernels/mixer.h against `num_tokens` and a
// pool of `num_slots` (negative: no pool).
absl::Status CheckBatch(std::string_view op, const SequenceBatch& batch, int64_t num_tokens,
                        int64_t num_slots) {
  if (batch.num_seqs < 0 || static_cast<int64_t>(batch.cu_seqlens.size()) != batch.num_seqs + 1) {
    return InvalidDenseArg(op, "cu_seqlens", "expected num_seqs + 1 offsets");
  }
  if (batch.cu_seqlens[0] != 0 || batch.cu_seqlens[batch.num_seqs] != num_tokens) {
    return InvalidDenseArg(op, "cu_seqlens", absl::StrCat("must run from 0 to ", num_tokens));
  }
  for (int s = 0; s < batch.num_seqs; ++s) {
    if (batch.cu_seqlens[s + 1] < batch.cu_seqlens[s]) {
      return InvalidDenseArg(op, "cu_seqlens", "decreasing");
    }
  }
  if (num_slots >= 0) {
    if (static_cast<int>(batch.state_slot.size()) != batch.num_seqs) {
      return InvalidDenseArg(op, "state_slot", "expected one slot per sequence");
    }
    for (int32_t slot : batch.state_slot) {
      if (slot < 0 || slot >= num_slots) {
        return InvalidDenseArg(op, "state_slot",
                               absl::StrCat("slot ", slot, " outside [0, ", num_slots, ")"));
      }
    }
  }
  return absl::OkStatus();
}

// Strides of `x` over the index space of `shape` (0 along broadcast
// dimensions), or an error when x does not broadcast to shape.
absl::StatusOr<std::vector<int64_t>> BroadcastStrides(std::string_view op, std::string_view field,
                                                      const Tensor& x, const Shape& shape) {
  if (x.rank() != static_cast<int>(shape.size())) {
    return InvalidDenseArg(
        op, field,
        absl::StrCat("rank of ", ShapeString(x.shape()), " differs from ", ShapeString(shape)));
  }
  std::vector<int64_t> strides(shape.size(), 0);
  int64_t stride = 1;
  for (int d = x.rank() - 1; d >= 0; --d) {
    if (x.shape()[d] == shape[d]) {
      strides[d] = stride;
    } else if (x.shape()[d] != 1) {
      return InvalidDenseArg(
          op, field,
          absl::StrCat(ShapeString(x.shape()), " does not broadcast to ", ShapeString(shape)));
    }
    stride *= x.shape()[d];
  }
  return strides;
}

bool SameMemory(const Tensor& a, const Tensor& b) { return a.raw() == b.raw(); }

// "F32", "F32 or BF16", "F32, BF16 or F16".
std::string DTypeList(std::span<const DType> dtypes) {
  std::string list;
  for (size_t i = 0; i < dtypes.size(); ++i) {
    if (i > 0) absl::StrAppend(&list, i + 1 == dtypes.size() ? " or " : ", ");
    absl::StrAppend(&list, std::string(DTypeName(dtypes[i])));
  }
  return list;
}

bool SixteenBit(const Tensor& t) { return t.defined() && IsSixteenBitFloat(t.dtype()); }

// The forward norm's inputs, shared by Norm and NormBackward. x is F32, or
// in the CUDA backend's forward also BF16/F16 (a product's or a scan's
// rounded output).
absl::StatusOr<int64_t> CheckNormInputs(std::string_view op, const NormArgs& args, Device device,
                                        bool forward) {
  const bool sixteen_bit_x = forward && device == Device::kCuda && SixteenBit(args.x);
  LAIR_RETURN_IF_ERROR(
      CheckTensor(op, "x", args.x, device, sixteen_bit_x ? args.x.dtype() : DType::kF32, 2));
  const int64_t cols = args.x.dim(1);
  const int64_t group = args.group_size == 0 ? cols : args.group_size;
  if (group <= 0 || cols % group != 0) {
    return InvalidDenseArg(op, "group_size",
                           absl::StrCat(args.group_size, " does not divide ", cols));
  }
  if (args.weight.defined()) {
    LAIR_RETURN_IF_ERROR(CheckTensor(op, "weight", args.weight, device, DType::kF32, 1));
    if (args.weight.dim(0) != cols && args.weight.dim(0) != group) {
      return InvalidDenseArg(op, "weight",
                             absl::StrCat("expected shape [", cols, "] or one group's [", group,
                                          "], got ", ShapeString(args.weight.shape())));
    }
  }
  if (NormHasGate(args.gate_mode)) {
    const bool sixteen_bit_gate = forward && device == Device::kCuda &&
                                  args.gate_mode == NormGate::kAfter &&
                                  args.gate.dtype() == DType::kBF16;
    LAIR_RETURN_IF_ERROR(CheckTensor(op, "gate", args.gate, device,
                                     sixteen_bit_gate ? args.gate.dtype() : DType::kF32, 2));
    LAIR_RETURN_IF_ERROR(CheckShape(op, "gate", args.gate, args.x.shape()));
  }
  return group;
}

// The forward convolution's inputs, shared by Conv1d and Conv1dBackward.
absl::StatusOr<ConvDims> CheckConvInputs(std::string_view op, const SequenceBatch& batch,
                                         const Conv1dArgs& args, Device device) {
  LAIR_RETURN_IF_ERROR(CheckTensor(op, "x", args.x, device, DType::kF32, 2));
  LAIR_RETURN_IF_ERROR(CheckTensor(op, "weight", args.weight, device, DType::kF32, 2));
  LAIR_RETURN_IF_ERROR(CheckTensor(op, "state", args.state, device, DType::kF32, 3));
  ConvDims dims{args.x.dim(1), args.weight.dim(1)};
  if (dims.width < 1) return InvalidDenseArg(op, "weight", "kernel width must be positive");
  LAIR_RETURN_IF_ERROR(CheckShape(op, "weight", args.weight, {dims.channels, dims.width}));
  LAIR_RETURN_IF_ERROR(
      CheckShape(op, "state", args.state, {args.state.dim(0), dims.channels, dims.width - 1}));
  if (args.bias.defined()) {
    LAIR_RETURN_IF_ERROR(CheckTensor(op, "bias", args.bias, device, DType::kF32, 1));
    LAIR_RETURN_IF_ERROR(CheckShape(op, "bias", args.bias, {dims.channels}));
  }
  LAIR_RETURN_IF_ERROR(CheckBatch(op, batch, args.x.dim(0), args.state.dim(0)));
  return dims;
}

// The forward attention's q, k, v and heads, shared by Attention and
// AttentionBackward; on success the token count N.
absl::StatusOr<int64_t> CheckAttentionInputs(std::string_view op, const AttentionArgs& args,
                                             Device device) {
  LAIR_RETURN_IF_ERROR(CheckTensor(op, "q", args.q, device, DType::kF32, 3));
  LAIR_RETURN_IF_ERROR(CheckTensor(op, "k", args.k, device, DType::kF32, 3));
  LAIR_RETURN_IF_ERROR(CheckTensor(op, "v", args.v, device, DType::kF32, 3));
  if (args.heads <= 0 || args.kv_heads <= 0 || args.heads % args.kv_heads != 0) {
    return InvalidDenseArg(op, "kv_heads",
                           absl::StrCat(args.kv_heads, " must divide heads ", args.heads));
  }
  const int64_t n = args.q.dim(0);
  LAIR_RETURN_IF_ERROR(CheckShape(op, "q", args.q, {n, args.heads, args.head_dim}));
  LAIR_RETURN_IF_ERROR(CheckShape(op, "k", args.k, {n, args.kv_heads, args.head_dim}));
  LAIR_RETURN_IF_ERROR(CheckShape(op, "v", args.v, {n, args.kv_heads, args.head_dim}));
  return n;
}

}  // namespace

absl::Status InvalidDenseArg(std::string_view op, std::string_view field,
                             std::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(op), ": ", std::string(field), ": ", std::string(problem)));
}

int64_t DenseRows(const Tensor& t) {
  return t.rank() == 0 || t.dim(-1) == 0 ? 0 : t.numel() / t.dim(-1);
}

absl::StatusOr<GemmDims> CheckGemmArgs(const GemmArgs& args, Device device,
                                       std::span<const DType> weight_dtypes, bool sixteen_bit_c,
                                       bool sixteen_bit_a) {
  constexpr std::string_view kOp = "Gemm";
  LAIR_RETURN_IF_ERROR(
      CheckTensor(kOp, "a", args.a, device,
                  sixteen_bit_a && SixteenBit(args.a) ? args.a.dtype() : DType::kF32, 2));
  DType b_type = weight_dtypes.front();
  if (args.b.defined()) {
    b_type = args.b.dtype();
    if (std::find(weight_dtypes.begin(), weight_dtypes.end(), b_type) == weight_dtypes.end()) {
      return InvalidDenseArg(
          kOp, "b",
          absl::StrCat("expected ", DTypeList(weight_dtypes), ", got ", args.b.DebugString()));
    }
  }
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "b", args.b, device, b_type, 2));
  const bool rounded_c = sixteen_bit_c && SixteenBit(args.c);
  LAIR_RETURN_IF_ERROR(
      CheckTensor(kOp, "c", args.c, device, rounded_c ? args.c.dtype() : DType::kF32, 2));
  GemmDims dims;
  dims.m = args.trans_a ? args.a.dim(1) : args.a.dim(0);
  dims.k = args.trans_a ? args.a.dim(0) : args.a.dim(1);
  dims.n = args.trans_b ? args.b.dim(0) : args.b.dim(1);
  const int64_t kb = args.trans_b ? args.b.dim(1) : args.b.dim(0);
  if (kb != dims.k) {
    return InvalidDenseArg(
        kOp, "b",
        absl::StrCat("inner dimension ", kb, " differs from a's ", dims.k, " (a ",
                     args.a.DebugString(), ", b ", args.b.DebugString(), ")"));
  }
  LAIR_RETURN_IF_ERROR(CheckShape(kOp, "c", args.c, {dims.m, dims.n}));
  if (args.bias.defined()) {
    LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "bias", args.bias, device, DType::kF32, 1));
    LAIR_RETURN_IF_ERROR(CheckShape(kOp, "bias", args.bias, {dims.n}));
  }
  return dims;
}

absl::StatusOr<std::vector<LinearProduct>> LinearGroupProducts(const LinearGroupArgs& args,
                                                               Device device) {
  constexpr std::string_view kOp = "LinearGroup";
  if (args.weights.empty()) return InvalidDenseArg(kOp, "weights", "empty group");
  if (args.outs.size() != args.weights.size()) {
    return InvalidDenseArg(
        kOp, "outs", absl::StrCat(args.outs.size(), " for ", args.weights.size(), " weights"));
  }
  if (!args.biases.empty() && args.biases.size() != args.weights.size()) {
    return InvalidDenseArg(
        kOp, "biases", absl::StrCat(args.biases.size(), " for ", args.weights.size(), " weights"));
  }
  if (!args.activations.empty() && args.activations.size() != args.weights.size()) {
    return InvalidDenseArg(
        kOp, "activations",
        absl::StrCat(args.activations.size(), " for ", args.weights.size(), " weights"));
  }
  if (!args.residuals.empty() && args.residuals.size() != args.weights.size()) {
    return InvalidDenseArg(
        kOp, "residuals",
        absl::StrCat(args.residuals.size(), " for ", args.weights.size(), " weights"));
  }
  if (args.silu_gate.defined()) {
    LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "silu_gate", args.silu_gate, device, DType::kF32, 2));
    LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "x", args.x, device, DType::kF32, 2));
    LAIR_RETURN_IF_ERROR(CheckShape(kOp, "silu_gate", args.silu_gate, args.x.shape()));
    if (args.input_norm) {
      return InvalidDenseArg(kOp, "input_norm", "cannot be set with silu_gate");
    }
  }
  if (args.input_norm) LAIR_RETURN_IF_ERROR(CheckInputNorm(args, device).status());
  std::vector<LinearProduct> products;
  for (size_t i = 0; i < args.weights.size(); ++i) {
    LinearProduct product;
    product.gemm.a = args.x;
    product.gemm.b = args.weights[i];
    product.gemm.c = args.outs[i];
    if (!args.biases.empty()) product.gemm.bias = args.biases[i];
    if (!args.activations.empty()) product.activation = args.activations[i];
    if (!args.residuals.empty() && args.residuals[i].defined()) {
      const std::string name = absl::StrCat("residuals[", i, "]");
      // (Also rejects a 16-bit out, which takes no residual.)
      LAIR_RETURN_IF_ERROR(CheckTensor(kOp, name, args.residuals[i], device, DType::kF32, 2));
      LAIR_RETURN_IF_ERROR(
          CheckTensor(kOp, absl::StrCat("outs[", i, "]"), args.outs[i], device, DType::kF32, 2));
      LAIR_RETURN_IF_ERROR(CheckShape(kOp, name, args.residuals[i], args.outs[i].shape()));
      product.residual = args.residuals[i];
    }
    products.push_back(std::move(product));
  }
  return products;
}

absl::StatusOr<int64_t> CheckSwiGluArgs(const SwiGluArgs& args, Device device) {
  constexpr std::string_view kOp = "SwiGlu";
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "x", args.x, device, DType::kF32, 2));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "w_gate", args.w_gate, device, args.w_gate.dtype(), 2));
  for (const auto& [name, w] : {std::pair{"w_up", &args.w_up}, std::pair{"w_down", &args.w_down}}) {
    LAIR_RETURN_IF_ERROR(CheckTensor(kOp, name, *w, device, args.w_gate.dtype(), 2));
  }
  const int64_t m = args.x.dim(0), k = args.x.dim(1), f = args.w_gate.dim(0);
  LAIR_RETURN_IF_ERROR(CheckShape(kOp, "w_gate", args.w_gate, {f, k}));
  LAIR_RETURN_IF_ERROR(CheckShape(kOp, "w_up", args.w_up, {f, k}));
  const int64_t k2 = args.w_down.dim(0);
  LAIR_RETURN_IF_ERROR(CheckShape(kOp, "w_down", args.w_down, {k2, f}));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "out", args.out, device, DType::kF32, 2));
  LAIR_RETURN_IF_ERROR(CheckShape(kOp, "out", args.out, {m, k2}));
  if (args.residual.defined()) {
    LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "residual", args.residual, device, DType::kF32, 2));
    LAIR_RETURN_IF_ERROR(CheckShape(kOp, "residual", args.residual, {m, k2}));
  }
  if (!args.input_norm) return 0;
  NormArgs norm = *args.input_norm;
  norm.x = args.x;
  return CheckNormInputs("SwiGlu input_norm", norm, device, /*forward=*/true);
}

absl::StatusOr<int64_t> CheckInputNorm(const LinearGroupArgs& args, Device device) {
  NormArgs norm = *args.input_norm;
  norm.x = args.x;
  return CheckNormInputs("LinearGroup input_norm", norm, device, /*forward=*/true);
}

absl::Status CheckEmbeddingArgs(const EmbeddingArgs& args, Device device) {
  constexpr std::string_view kOp = "Embedding";
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "table", args.table, device, DType::kF32, 2));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "ids", args.ids, device, DType::kI32, 1));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "out", args.out, device, DType::kF32, 2));
  return CheckShape(kOp, "out", args.out, {args.ids.dim(0), args.table.dim(1)});
}

absl::Status CheckEmbeddingBackwardArgs(const EmbeddingBackwardArgs& args, Device device) {
  constexpr std::string_view kOp = "EmbeddingBackward";
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "ids", args.ids, device, DType::kI32, 1));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "d_out", args.d_out, device, DType::kF32, 2));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "d_table", args.d_table, device, DType::kF32, 2));
  return CheckShape(kOp, "d_out", args.d_out, {args.ids.dim(0), args.d_table.dim(1)});
}

absl::StatusOr<int64_t> CheckNormArgs(const NormArgs& args, Device device) {
  constexpr std::string_view kOp = "Norm";
  LAIR_ASSIGN_OR_RETURN(int64_t group, CheckNormInputs(kOp, args, device, /*forward=*/true));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "y", args.y, device, DType::kF32, 2));
  LAIR_RETURN_IF_ERROR(CheckShape(kOp, "y", args.y, args.x.shape()));
  return group;
}

absl::StatusOr<int64_t> CheckNormBackwardArgs(const NormBackwardArgs& args, Device device) {
  constexpr std::string_view kOp = "NormBackward";
  const NormArgs& fwd = args.fwd;
  LAIR_ASSIGN_OR_RETURN(int64_t group, CheckNormInputs(kOp, fwd, device, /*forward=*/false));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "d_y", args.d_y, device, DType::kF32, 2));
  LAIR_RETURN_IF_ERROR(CheckShape(kOp, "d_y", args.d_y, fwd.x.shape()));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "dx", args.dx, device, DType::kF32, 2));
  LAIR_RETURN_IF_ERROR(CheckShape(kOp, "dx", args.dx, fwd.x.shape()));
  if (args.d_weight.defined()) {
    if (!fwd.weight.defined()) return InvalidDenseArg(kOp, "d_weight", "the forward has no weight");
    LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "d_weight", args.d_weight, device, DType::kF32, 1));
    LAIR_RETURN_IF_ERROR(CheckShape(kOp, "d_weight", args.d_weight, fwd.weight.shape()));
  }
  if (args.d_gate.defined()) {
    if (!NormHasGate(fwd.gate_mode)) {
      return InvalidDenseArg(kOp, "d_gate", "the forward has no gate");
    }
    LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "d_gate", args.d_gate, device, DType::kF32, 2));
    LAIR_RETURN_IF_ERROR(CheckShape(kOp, "d_gate", args.d_gate, fwd.x.shape()));
  }
  return group;
}

absl::StatusOr<std::vector<int64_t>> CheckUnaryArgs(const UnaryArgs& args, Device device) {
  constexpr std::string_view kOp = "Unary";
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "x", args.x, device));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "y", args.y, device));
  LAIR_ASSIGN_OR_RETURN(std::vector<int64_t> sx,
                        BroadcastStrides(kOp, "x", args.x, args.y.shape()));
  if (SameMemory(args.x, args.y) && args.x.shape() != args.y.shape()) {
    return InvalidDenseArg(kOp, "y", "may alias x only when the shapes are equal");
  }
  return sx;
}

absl::Status CheckUnaryBackwardArgs(const UnaryBackwardArgs& args, Device device) {
  constexpr std::string_view kOp = "UnaryBackward";
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "x", args.fwd.x, device));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "d_y", args.d_y, device));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "dx", args.dx, device));
  LAIR_RETURN_IF_ERROR(CheckShape(kOp, "d_y", args.d_y, args.fwd.x.shape()));
  return CheckShape(kOp, "dx", args.dx, args.fwd.x.shape());
}

absl::StatusOr<BinaryStrides> CheckBinaryArgs(const BinaryArgs& args, Device device) {
  constexpr std::string_view kOp = "Binary";
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "a", args.a, device));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "b", args.b, device));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "y", args.y, device));
  BinaryStrides strides;
  LAIR_ASSIGN_OR_RETURN(strides.a, BroadcastStrides(kOp, "a", args.a, args.y.shape()));
  LAIR_ASSIGN_OR_RETURN(strides.b, BroadcastStrides(kOp, "b", args.b, args.y.shape()));
  if ((SameMemory(args.a, args.y) && args.a.shape() != args.y.shape()) ||
      (SameMemory(args.b, args.y) && args.b.shape() != args.y.shape())) {
    return InvalidDenseArg(kOp, "y", "may alias an input only when the shapes are equal");
  }
  return strides;
}

absl::StatusOr<std::vector<int64_t>> CheckReduceSumArgs(const ReduceSumArgs& args, Device device) {
  constexpr std::string_view kOp = "ReduceSum";
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "x", args.x, device));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "y", args.y, device));
  return BroadcastStrides(kOp, "y", args.y, args.x.shape());
}

absl::Status CheckCopyColumnsArgs(const CopyColumnsArgs& args, Device device) {
  constexpr std::string_view kOp = "CopyColumns";
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "src", args.src, device));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "dst", args.dst, device));
  if (args.src.rank() < 1 || args.dst.rank() < 1) return InvalidDenseArg(kOp, "src", "rank 0");
  const int64_t src_cols = args.src.dim(-1), dst_cols = args.dst.dim(-1);
  if (DenseRows(args.dst) != DenseRows(args.src)) {
    return InvalidDenseArg(
        kOp, "dst",
        absl::StrCat(args.dst.DebugString(), " has other rows than src ", args.src.DebugString()));
  }
  if (args.width < 0 || args.src_col < 0 || args.src_col + args.width > src_cols) {
    return InvalidDenseArg(kOp, "src_col",
                           absl::StrCat("columns [", args.src_col, ", ", args.src_col + args.width,
                                        ") outside ", src_cols));
  }
  if (args.dst_col < 0 || args.dst_col + args.width > dst_cols) {
    return InvalidDenseArg(kOp, "dst_col",
                           absl::StrCat("columns [", args.dst_col, ", ", args.dst_col + args.width,
                                        ") outside ", dst_cols));
  }
  return absl::OkStatus();
}

absl::StatusOr<ConvDims> CheckConv1dArgs(const SequenceBatch& batch, const Conv1dArgs& args,
                                         Device device) {
  constexpr std::string_view kOp = "Conv1d";
  LAIR_ASSIGN_OR_RETURN(ConvDims dims, CheckConvInputs(kOp, batch, args, device));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "y", args.y, device, DType::kF32, 2));
  LAIR_RETURN_IF_ERROR(CheckShape(kOp, "y", args.y, args.x.shape()));
  return dims;
}

absl::StatusOr<ConvDims> CheckConv1dBackwardArgs(const SequenceBatch& batch,
                                                 const Conv1dBackwardArgs& args, Device device) {
  constexpr std::string_view kOp = "Conv1dBackward";
  const Conv1dArgs& fwd = args.fwd;
  LAIR_ASSIGN_OR_RETURN(ConvDims dims, CheckConvInputs(kOp, batch, fwd, device));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "d_y", args.d_y, device, DType::kF32, 2));
  LAIR_RETURN_IF_ERROR(CheckShape(kOp, "d_y", args.d_y, fwd.x.shape()));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "dx", args.dx, device, DType::kF32, 2));
  LAIR_RETURN_IF_ERROR(CheckShape(kOp, "dx", args.dx, fwd.x.shape()));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "d_weight", args.d_weight, device, DType::kF32, 2));
  LAIR_RETURN_IF_ERROR(CheckShape(kOp, "d_weight", args.d_weight, fwd.weight.shape()));
  if (args.d_bias.defined()) {
    LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "d_bias", args.d_bias, device, DType::kF32, 1));
    LAIR_RETURN_IF_ERROR(CheckShape(kOp, "d_bias", args.d_bias, {dims.channels}));
  }
  return dims;
}

absl::Status CheckRotaryArgs(const RotaryArgs& args, Device device) {
  constexpr std::string_view kOp = "Rotary";
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "x", args.x, device, DType::kF32, 3));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "positions", args.positions, device, DType::kI32, 1));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "y", args.y, device, DType::kF32, 3));
  LAIR_RETURN_IF_ERROR(CheckShape(kOp, "y", args.y, args.x.shape()));
  LAIR_RETURN_IF_ERROR(CheckShape(kOp, "positions", args.positions, {args.x.dim(0)}));
  const int64_t dim = args.x.dim(2);
  if (args.rotary_dim <= 0 || args.rotary_dim % 2 != 0 || args.rotary_dim > dim) {
    return InvalidDenseArg(kOp, "rotary_dim",
                           absl::StrCat(args.rotary_dim, " must be even and in (0, ", dim, "]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CheckAttentionArgs(const SequenceBatch& batch, const AttentionArgs& args,
                                           Device device) {
  constexpr std::string_view kOp = "Attention";
  LAIR_ASSIGN_OR_RETURN(int64_t n, CheckAttentionInputs(kOp, args, device));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "o", args.o, device, DType::kF32, 3));
  LAIR_RETURN_IF_ERROR(CheckShape(kOp, "o", args.o, args.q.shape()));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "k_cache", args.k_cache, device, DType::kF32, 4));
  const int64_t slots = args.k_cache.dim(0), max_context = args.k_cache.dim(1);
  LAIR_RETURN_IF_ERROR(
      CheckShape(kOp, "k_cache", args.k_cache, {slots, max_context, args.kv_heads, args.head_dim}));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "v_cache", args.v_cache, device, DType::kF32, 4));
  LAIR_RETURN_IF_ERROR(CheckShape(kOp, "v_cache", args.v_cache, args.k_cache.shape()));
  LAIR_RETURN_IF_ERROR(CheckBatch(kOp, batch, n, slots));
  if (static_cast<int>(args.start_positions.size()) != batch.num_seqs) {
    return InvalidDenseArg(kOp, "start_positions", "expected one per sequence");
  }
  for (int s = 0; s < batch.num_seqs; ++s) {
    const int64_t end = static_cast<int64_t>(args.start_positions[s]) + batch.cu_seqlens[s + 1] -
                        batch.cu_seqlens[s];
    if (args.start_positions[s] < 0 || end > max_context) {
      return InvalidDenseArg(kOp, "start_positions",
                             absl::StrCat("sequence ", s, " would fill cache rows up to ", end,
                                          ", past max_context ", max_context));
    }
  }
  return n;
}

absl::StatusOr<int64_t> CheckAttentionBackwardArgs(const SequenceBatch& batch,
                                                   const AttentionBackwardArgs& args,
                                                   Device device) {
  constexpr std::string_view kOp = "AttentionBackward";
  const AttentionArgs& fwd = args.fwd;
  LAIR_ASSIGN_OR_RETURN(int64_t n, CheckAttentionInputs(kOp, fwd, device));
  LAIR_RETURN_IF_ERROR(CheckBatch(kOp, batch, n, -1));
  for (int32_t start : fwd.start_positions) {
    if (start != 0) {
      return InvalidDenseArg(kOp, "start_positions", "the backward needs every start at 0");
    }
  }
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "d_o", args.d_o, device, DType::kF32, 3));
  LAIR_RETURN_IF_ERROR(CheckShape(kOp, "d_o", args.d_o, fwd.q.shape()));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "dq", args.dq, device, DType::kF32, 3));
  LAIR_RETURN_IF_ERROR(CheckShape(kOp, "dq", args.dq, fwd.q.shape()));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "dk", args.dk, device, DType::kF32, 3));
  LAIR_RETURN_IF_ERROR(CheckShape(kOp, "dk", args.dk, fwd.k.shape()));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "dv", args.dv, device, DType::kF32, 3));
  LAIR_RETURN_IF_ERROR(CheckShape(kOp, "dv", args.dv, fwd.v.shape()));
  return n;
}

absl::Status CheckCrossEntropyArgs(const CrossEntropyArgs& args, Device device) {
  constexpr std::string_view kOp = "CrossEntropy";
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "logits", args.logits, device, DType::kF32, 2));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "targets", args.targets, device, DType::kI32, 1));
  LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "losses", args.losses, device, DType::kF32, 1));
  const int64_t n = args.logits.dim(0);
  LAIR_RETURN_IF_ERROR(CheckShape(kOp, "targets", args.targets, {n}));
  LAIR_RETURN_IF_ERROR(CheckShape(kOp, "losses", args.losses, {n}));
  if (args.d_logits.defined()) {
    LAIR_RETURN_IF_ERROR(CheckTensor(kOp, "d_logits", args.d_logits, device, DType::kF32, 2));
    LAIR_RETURN_IF_ERROR(CheckShape(kOp, "d_logits", args.d_logits, args.logits.shape()));
  }
  return absl::OkStatus();
}

}  // namespace lair::kernels
