// The one function the whole decay family is built from: the unified linear
// attention pass f of the ULA paper (specs/ula-and-la-cuda.md §1.4), for one
// (sequence, head), in fp32:
//
//   s'_t = diag(exp ℓ_t) s'_{t∓1} diag(exp r_t) + k'_t v'_tᵀ      s' ∈ R^{dk×dv}
//   o'_t = s'_tᵀ q'_t
//
// iterated from the first token to the last, or from the last to the first
// when `reverse` is set. By permuting its arguments the same pass yields the
// forward output and all three input gradients (§1.5.3 and decay.cc):
//
//   O  = f(q̃,  K,  V,  L,  R,  fwd)        q̃ = scale·q
//   dq̃ = f(dO, V,  K,  R,  L,  fwd)        starting from s0ᵀ, ending at s_nᵀ
//   dK = f(V,  dO, q̃,  R+, L+, rev)        starting from dS_nᵀ
//   dV = f(K,  q̃,  dO, L+, R+, rev)        starting from dS_n, ending at G_1
//
// where L+ / R+ are the decays shifted by one step (token t uses the decay of
// token t+1, none at the last token): erratum U1 of the spec.
//
// Two forms compute the same thing. The recurrent form follows the recurrence
// token by token. The chunked form works on chunks of `chunk_size` tokens with
// BLAS matmuls (§1.5.2): the inter-chunk part through the state entering the
// chunk, the intra-chunk part through a masked c×c matrix. No exponential it
// takes can overflow, so strongly decaying gates underflow towards zero:
//   * cumulative log-decays are chunk-local (and summed in double);
//   * scalar decays build the decay matrix exp(b_i − b_j) only for j ≤ i;
//   * vector decays use secondary chunking (gla.md §5.4): each query
//     sub-chunk of 16 rows rescales queries, keys and values relative to its
//     first row, so factors towards earlier keys are ≤ 1; its own diagonal
//     block joins the matmul when the decay across the sub-chunk spans at
//     most e^40, and is otherwise accumulated with running products of
//     per-step decays (each ≤ 1).
//
// Thread safety: UlaPass touches only its arguments; passes over disjoint
// outputs and states may run concurrently.
#pragma once

#include <cstdint>

namespace lair::kernels::cpu {

// Rows of one (sequence, head) inside a packed [N, H, dim] tensor: token t of
// the sequence is at base + t * stride.
struct RowsView {
  const float* base = nullptr;
  int64_t stride = 0;  // floats between consecutive tokens
  int dim = 0;
  float scale = 1.0f;  // multiplies every element as it is read
};

// The per-token log-decay on one side of the state (all values ≤ 0).
struct LogDecayView {
  enum class Kind { kNone, kScalar, kVector };
  Kind kind = Kind::kNone;
  // kScalar: token t's value at base[t * stride] (stride 0: one constant).
  // kVector: token t's `dim` values at base + t * stride.
  const float* base = nullptr;
  int64_t stride = 0;
  // Token t uses the decay of token t+1, and the last token none (the L+ / R+
  // of erratum U1).
  bool shifted = false;
};

// The operands of one pass over `length` tokens. q and k have the left dim
// dk, v and the output the right dim dv; `left` acts on dk, `right` on dv.
struct UlaOperands {
  int length = 0;
  RowsView q, k, v;
  LogDecayView left, right;
  bool reverse = false;
};

enum class UlaForm { kRecurrent, kChunked };

// Runs f. `state` ([dk, dv] row-major, contiguous) holds on entry the state
// before the first iterated token and on exit the state after the last.
// Output row t (in the sequence's own order) is written to out + t*out_stride.
// REQUIRES: chunk_size >= 1; the views cover `length` rows; out rows do not
// overlap the inputs.
void UlaPass(const UlaOperands& ops, UlaForm form, int chunk_size, float* state, float* out,
             int64_t out_stride);

}  // namespace lair::kernels::cpu
