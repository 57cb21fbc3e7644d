// The argument checks of kernels/dense.h, shared by the CPU and CUDA backends
// so that both reject the same input with the same InvalidArgument,
// "<Op>: <field>: <problem>", before anything is written or launched.
//
// Each check takes the device every tensor must live on and returns what the
// op derives from its arguments (sizes, broadcast strides). Limits of one
// backend alone (CUDA's head_dim, rotary_dim and rank) are checked by that
// backend after these.
//
// Thread safety: the functions keep no state.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/dense.h"
#include "kernels/mixer.h"

namespace lair::kernels {

// InvalidArgument "<op>: <field>: <problem>".
absl::Status InvalidDenseArg(std::string_view op, std::string_view field, std::string_view problem);

// Rows of `t` viewed as [rows, last dimension].
int64_t DenseRows(const Tensor& t);

// Gemm's sizes: op(a) is [m,k], op(b) [k,n], c [m,n]. `weight_dtypes` are
// the dtypes the backend multiplies b in; c is F32, or also BF16/F16 with
// `sixteen_bit_c` (a linear group's rounded output, LinearWeight in
// models/graph.h); a is F32, or also BF16/F16 with `sixteen_bit_a` (the
// input of a linear group's input norm, which the products read formed).
struct GemmDims {
  int64_t m = 0, n = 0, k = 0;
};
absl::StatusOr<GemmDims> CheckGemmArgs(const GemmArgs& args, Device device,
                                       std::span<const DType> weight_dtypes,
                                       bool sixteen_bit_c = false, bool sixteen_bit_a = false);

// One member of a linear group: its product, the activation applied to it
// and the residual added last.
struct LinearProduct {
  GemmArgs gemm;
  Activation activation;
  Tensor residual;  // [M,N] F32 or undefined
};
// The group's members (each reading x; the caller applies silu_gate or
// input_norm), after checking that the spans agree in length, that the group
// is not empty, that residuals match their outputs and silu_gate x, and the
// input norm (each product's own fields are checked by the Gemm that runs
// it, or by CheckGemmArgs).
absl::StatusOr<std::vector<LinearProduct>> LinearGroupProducts(const LinearGroupArgs& args,
                                                               Device device);
// x, out and the residual, the weights' shapes against them and their one
// dtype (which the backend's products must take), and the input norm. On
// success: the columns each input norm runs over (0 without one).
absl::StatusOr<int64_t> CheckSwiGluArgs(const SwiGluArgs& args, Device device);
// The input norm of a group (REQUIRES: input_norm set) as a Norm of x:
// checked, with the columns each norm runs over.
absl::StatusOr<int64_t> CheckInputNorm(const LinearGroupArgs& args, Device device);

absl::Status CheckEmbeddingArgs(const EmbeddingArgs& args, Device device);
absl::Status CheckEmbeddingBackwardArgs(const EmbeddingBackwardArgs& args, Device device);

// On success: the columns each norm runs over (group_size, 0 meaning all).
absl::StatusOr<int64_t> CheckNormArgs(const NormArgs& args, Device device);
absl::StatusOr<int64_t> CheckNormBackwardArgs(const NormBackwardArgs& args, Device device);

// On success: strides of x over the index space of y (0 where x broadcasts).
absl::StatusOr<std::vector<int64_t>> CheckUnaryArgs(const UnaryArgs& args, Device device);
absl::Status CheckUnaryBackwardArgs(const UnaryBackwardArgs& args, Device device);

// Strides of a and b over the index space of y (0 where they broadcast).
struct BinaryStrides {
  std::vector<int64_t> a, b;
};
absl::StatusOr<BinaryStrides> CheckBinaryArgs(const BinaryArgs& args, Device device);

// On success: strides of y over the index space of x (0 along summed dims).
absl::StatusOr<std::vector<int64_t>> CheckReduceSumArgs(const ReduceSumArgs& args, Device device);

absl::Status CheckCopyColumnsArgs(const CopyColumnsArgs& args, Device device);

// Conv1d's channels C and kernel width W.
struct ConvDims {
  int64_t channels = 0, width = 0;
};
absl::StatusOr<ConvDims> CheckConv1dArgs(const SequenceBatch& batch, const Conv1dArgs& args,
                                         Device device);
absl::StatusOr<ConvDims> CheckConv1dBackwardArgs(const SequenceBatch& batch,
                                                 const Conv1dBackwardArgs& args, Device device);

absl::Status CheckRotaryArgs(const RotaryArgs& args, Device device);

// On success: the token count N of q.
absl::StatusOr<int64_t> CheckAttentionArgs(const SequenceBatch& batch, const AttentionArgs& args,
                                           Device device);
absl::StatusOr<int64_t> CheckAttentionBackwardArgs(const SequenceBatch& batch,
                                                   const AttentionBackwardArgs& args,
                                                   Device device);

absl::Status CheckCrossEntropyArgs(const CrossEntropyArgs& args, Device device);

}  // namespace lair::kernels
