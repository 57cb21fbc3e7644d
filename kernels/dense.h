// Argument structs for the dense operations of the model skeleton, in the
// style of kernels/mixer.h: plain fields, each commented with its shape and
// dtype. Backend (kernels/backend.h) declares one method per struct; the CPU
// backend implements them in kernels/cpu/dense.cc, the CUDA backend in
// kernels/cuda/. Every op returns InvalidArgument naming the bad field (and
// writes nothing) when a shape, dtype or device is wrong.
//
// Conventions shared by every op:
//   * tensors are dense and row-major, on the backend's device;
//   * activations, gradients and states are F32; weights are F32 on the CPU
//     (the CUDA backend may also take BF16/F16 for `GemmArgs::b`);
//   * token ids, positions and targets are I32 device tensors;
//   * packed sequences use kernels::SequenceBatch (cu_seqlens, state slots);
//   * "written" outputs are overwritten, "accumulated" ones are added to;
//   * outputs never alias inputs unless the op says so.
// Backward ops give the exact derivative of their forward, computed in fp32
// (the CPU reference accumulates reductions in double).
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "core/tensor.h"
#include "kernels/mixer.h"

namespace lair::kernels {

// c = alpha · op(a) · op(b) + beta · c (+ bias[j] on every row), fp32
// accumulation. op(a) is a [M,K] (a stored [K,M] when trans_a); op(b) is
// [K,N] (b stored [N,K] when trans_b, the nn.Linear weight layout [out,in]).
// So a linear layer is {x, W, y, trans_b=true}; its input gradient
// {dy, W, dx, trans_b=false}; its weight gradient {dy, x, dW, trans_a=true,
// trans_b=false, beta=1}. All three are rank 2.
struct GemmArgs {
  Tensor a;  // [M,K] or [K,M] F32
  Tensor b;  // [N,K] or [K,N] F32 (CUDA: also BF16/F16)
  Tensor c;  // in/out [M,N] F32; read only when beta != 0
  bool trans_a = false;
  bool trans_b = true;
  float alpha = 1.0f;
  float beta = 0.0f;
  Tensor bias;  // [N] F32 or undefined
};

// Row gather: out[i,:] = table[ids[i],:]. Also gathers rows of any [R,D]
// activation (e.g. the last token of each sequence).
struct EmbeddingArgs {
  Tensor table;  // [V,D] F32
  Tensor ids;    // [N] I32, each in [0, V)
  Tensor out;    // written [N,D] F32
};

// d_table[ids[i],:] += d_out[i,:] (repeated ids add up).
struct EmbeddingBackwardArgs {
  Tensor ids;      // [N] I32
  Tensor d_out;    // [N,D]
  Tensor d_table;  // accumulated [V,D]
};

enum class NormKind {
  kRms,    // u · rsqrt(mean(u²) + eps)
  kLayer,  // (u − mean(u)) · rsqrt(var(u) + eps), biased variance, no bias term
};

enum class NormGate {
  kNone,       // y = norm(x) · w
  kAfter,      // y = norm(x) · w · silu(gate)   (fla FusedRMSNormGated, norm_before_gate)
  kBefore,     // y = norm(x · silu(gate)) · w   (Mamba2 RMSNormGated, norm_before_gate=False)
  kSiluInput,  // y = norm(silu(x)) · w          (GSA's output stage; no gate tensor)
};

// Whether a norm of this mode reads a gate tensor.
inline bool NormHasGate(NormGate mode) {
  return mode == NormGate::kAfter || mode == NormGate::kBefore;
}

// Normalization over groups of `group_size` consecutive elements of each row
// (group_size 0 means the whole row). `weight` spans the whole row, so a
// per-head norm whose weight is shared by every head is run on x viewed as
// [rows·heads, head_dim].
struct NormArgs {
  NormKind kind = NormKind::kRms;
  NormGate gate_mode = NormGate::kNone;
  float eps = 1e-6f;
  int group_size = 0;
  Tensor x;       // [R,C] F32; forward on the CUDA backend also BF16/F16 (a rounded output)
  Tensor weight;  // [C], or [group_size] shared by a row's groups (a per-head norm), F32;
                  // or undefined (no affine weight)
  Tensor gate;    // [R,C] F32 when gate_mode != kNone; kAfter's forward on CUDA also BF16
  Tensor y;       // written [R,C] F32
};

struct NormBackwardArgs {
  NormArgs fwd;     // the forward inputs (fwd.y is not read)
  Tensor d_y;       // [R,C]
  Tensor dx;        // written [R,C]
  Tensor d_weight;  // accumulated [C], or undefined (not wanted)
  Tensor d_gate;    // written [R,C] when gated, or undefined (not wanted)
};

// Elementwise y = alpha · f(in_scale · x) + beta.
enum class UnaryOp {
  kAffine,      // f(x) = x
  kSilu,        // x·σ(x)
  kSigmoid,     // σ(x)
  kLogSigmoid,  // log σ(x), computed stably
  kSoftplus,    // log(1 + eˣ), = x above 20 (PyTorch's threshold)
  kExp,
  kLog,
  kTanh,  // soft cap c·tanh(x/c): alpha = c, in_scale = 1/c
  kRelu,
  kEluPlusOne,  // elu(x) + 1
};

// x broadcasts to y: the same rank, each dimension of x equal to y's or 1
// (so kAffine with alpha 1 also expands a tensor, e.g. repeating kv heads).
struct UnaryArgs {
  UnaryOp op = UnaryOp::kAffine;
  float alpha = 1.0f, beta = 0.0f, in_scale = 1.0f;
  Tensor x;  // F32, broadcastable to y
  Tensor y;  // written F32; may alias x when the shapes are equal
};

// dx = d_y · alpha · in_scale · f'(in_scale · x), for x of y's shape (an
// expanding forward is differentiated with ReduceSum instead).
struct UnaryBackwardArgs {
  UnaryArgs fwd;  // fwd.y is not read
  Tensor d_y;
  Tensor dx;  // written, shape of fwd.x
};

// An elementwise function applied to a product in the op that makes it,
// y ← alpha · f(in_scale · y) + beta as UnaryArgs computes it: a gate's
// activation fused into its projection. The defaults are the identity.
struct Activation {
  UnaryOp op = UnaryOp::kAffine;
  float alpha = 1.0f, beta = 0.0f, in_scale = 1.0f;
  bool identity() const {
    return op == UnaryOp::kAffine && alpha == 1.0f && beta == 0.0f && in_scale == 1.0f;
  }
};

// Linear layers that read the same input: outs[i] = act_i(x · weights[i]ᵀ
// (+ biases[i])) (+ residuals[i]), each product exactly GemmArgs{x,
// weights[i], outs[i]} (trans_b), each act_i a Unary on it and the residual
// added last. One op so that a backend may read x once and stream every
// weight in one launch (a decode step's q/k/v/gate projections, an MLP's
// gate and up) with the activations and the residual add in its epilogue (a
// block's last product joining the residual stream). An out may alias its
// residual, nothing else. With silu_gate defined the products read
// silu(silu_gate) ∘ x in place of x (SwiGLU's down projection), and with
// input_norm set they read Norm(x) as it describes (a block's input norm;
// its x and y are not read), so a backend may form that input while it
// loads the activations or rounds them for its tensor cores.
struct LinearGroupArgs {
  Tensor x;  // [M,K] F32 (with input_norm, its x: 16 bits as NormArgs allows)
  std::span<const Tensor> weights;  // each [N_i,K] (dtypes as GemmArgs::b)
  std::span<const Tensor> biases;   // empty, or one per weight: [N_i] F32 or undefined
  // Written, each [M,N_i] F32, or BF16/F16 (without a residual) where the
  // backend's ProductOutputDType says so: rounded after the activation.
  std::span<const Tensor> outs;
  std::span<const Activation> activations = {};  // empty (none), or one per weight
  std::span<const Tensor> residuals = {};   // empty, or one per weight: [M,N_i] F32 or undefined
  Tensor silu_gate = {};                    // undefined, or [M,K] F32
  std::optional<NormArgs> input_norm = {};  // unset, or the norm (not with silu_gate)
};

// A SwiGLU MLP: out = (silu(x·w_gateᵀ) ∘ (x·w_upᵀ))·w_downᵀ (+ residual),
// x normalized first when input_norm is set (as in LinearGroupArgs). One op
// so that a backend may keep the [M, F] intermediates in 16 bits where its
// products read them so; the default runs two LinearGroups.
struct SwiGluArgs {
  Tensor x;             // [M,K] F32
  Tensor w_gate, w_up;  // [F,K] (dtypes as GemmArgs::b)
  Tensor w_down;        // [K2,F]
  Tensor residual;      // [M,K2] F32 or undefined; out may alias it
  Tensor out;           // written [M,K2] F32
  std::optional<NormArgs> input_norm = {};
};

enum class BinaryOp {
  kAdd,
  kSub,
  kMul,
  kDiv,
  kSiluMul,  // silu(a) · b: SwiGLU's gate times its up projection
};

// y = a ∘ b with broadcasting: a and b have y's rank, and each of their
// dimensions equals y's or is 1. y may alias a or b when shapes are equal.
struct BinaryArgs {
  BinaryOp op = BinaryOp::kAdd;
  Tensor a, b;  // F32
  Tensor y;     // written F32
};

// y = x summed over the dimensions where y has extent 1 and x does not (the
// adjoint of broadcasting). Same rank.
struct ReduceSumArgs {
  Tensor x;  // F32
  Tensor y;  // written F32
};

// Column block copy between two tensors viewed as 2-D [rows, columns] (the
// last dimension is the columns): dst[:, dst_col + j] (+)= src[:, src_col + j]
// for j < width. Splits a fused projection and, accumulating, joins the
// gradients of its parts.
struct CopyColumnsArgs {
  Tensor src;  // [R, Cs] F32 (any rank; leading dimensions are rows)
  int64_t src_col = 0;
  Tensor dst;  // [R, Cd] F32, same row count
  int64_t dst_col = 0;
  int64_t width = 0;
  bool accumulate = false;
};

// Depthwise causal convolution over packed sequences (PyTorch Conv1d with
// groups = channels and padding width−1, keeping the first outputs):
//   pre[t,c] = bias[c] + Σ_i weight[c,i] · x[t − (W−1) + i, c]
//   y = silu(pre) when `silu`, else pre
// where inputs before a sequence's first new token come from its slot's
// window (the last W−1 inputs seen, oldest first; zeros when
// batch.zero_initial_state). The window is then updated in place.
struct Conv1dArgs {
  Tensor x;       // [N,C] F32
  Tensor weight;  // [C,W] F32
  Tensor bias;    // [C] F32 or undefined
  bool silu = false;
  Tensor y;      // written [N,C]
  Tensor state;  // in/out pool [num_slots, C, W−1] F32
};

// Gradients of the forward above; the initial windows are read from
// fwd.state (which the caller must hold at its pre-forward value, or zero
// with batch.zero_initial_state) and not written.
struct Conv1dBackwardArgs {
  Conv1dArgs fwd;   // fwd.y is not read
  Tensor d_y;       // [N,C]
  Tensor dx;        // written [N,C]
  Tensor d_weight;  // accumulated [C,W]
  Tensor d_bias;    // accumulated [C], or undefined
};

// Rotary position embedding (RoFormer / GPT-NeoX layout) on the first
// rotary_dim features of each head: for i < rotary_dim/2, with
// θ_i = pos · theta^(−2i/rotary_dim) (fp32, as PyTorch computes it),
//   non-interleaved: (x[i], x[i+R/2]) rotated by θ_i
//   interleaved:     (x[2i], x[2i+1]) rotated by θ_i
// `inverse` rotates by −θ (the backward of the forward). Features past
// rotary_dim are copied.
struct RotaryArgs {
  int rotary_dim = 0;
  float theta = 10000.0f;
  bool interleaved = false;
  bool inverse = false;
  Tensor x;          // [N,H,D] F32
  Tensor positions;  // [N] I32, absolute position of each token
  Tensor y;          // written [N,H,D]; may alias x
};

// Causal softmax attention with a per-slot KV cache (grouped-query heads:
// query head h reads kv head h / (heads / kv_heads)). Sequence s appends its
// new k, v at cache rows [start_positions[s], start_positions[s] + len) of
// slot state_slot[s], then every new token attends to cache rows [0, own
// position]: o = softmax(scale · q·Kᵀ) V.
struct AttentionArgs {
  int heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 1.0f;
  Tensor q;        // [N,heads,head_dim] F32
  Tensor k, v;     // [N,kv_heads,head_dim] F32
  Tensor o;        // written [N,heads,head_dim]
  Tensor k_cache;  // in/out pool [num_slots, max_context, kv_heads, head_dim] F32
  Tensor v_cache;  // same shape
  std::span<const int32_t> start_positions;         // [num_seqs] host: tokens already cached
  const int32_t* start_positions_device = nullptr;  // the same on the device (CUDA only)
};

// Gradients of causal attention over the new tokens alone (every start
// position must be 0: the training path has no cached prefix). The cache
// tensors of fwd are not used.
struct AttentionBackwardArgs {
  AttentionArgs fwd;  // q, k, v, shapes and scale; fwd.o is not read
  Tensor d_o;         // [N,heads,head_dim]
  Tensor dq;          // written [N,heads,head_dim]
  Tensor dk, dv;      // written [N,kv_heads,head_dim]
};

// Softmax cross-entropy per row: losses[i] = logsumexp(logits[i]) −
// logits[i, targets[i]]; when d_logits is defined it is written with
// grad_scale · (softmax(logits[i]) − onehot(targets[i])).
struct CrossEntropyArgs {
  Tensor logits;    // [N,V] F32
  Tensor targets;   // [N] I32 in [0, V)
  Tensor losses;    // written [N] F32
  Tensor d_logits;  // written [N,V] F32, or undefined
  float grad_scale = 1.0f;
};

}  // namespace lair::kernels
