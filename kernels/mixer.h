// Argument structs for the linear-attention mixers: one struct per kernel
// family, in the FlashAttention style (plain fields, each commented). Kernels
// see no engine or model types; backends validate and dispatch.
//
// Layout shared by every mixer (ops fixtures use B sequences of equal length
// T, which is the packed layout with cu_seqlens = {0, T, 2T, ...}):
//   tokens are packed: sequence s owns tokens [cu_seqlens[s], cu_seqlens[s+1]);
//   q, k      [N, H, K]   N = total tokens, H heads, K key dim
//   v, o      [N, H, V]
//   per-token gates [N, H] or [N, H, K] / [N, H, V] / [N, H, M];
//   recurrent states live in a pool of slots, fp32, [num_slots, H, ...];
//   sequence s reads its initial state from slot state_slot[s] and writes its
//   final state back to the same slot (in place).
// The one-token decode step is the case N == num_seqs (every length 1).
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor.h"

namespace lair::kernels {

// Which sequences a launch covers and where their states live.
struct SequenceBatch {
  int num_seqs = 0;
  // [num_seqs + 1] token offsets, host memory (always set).
  std::span<const int32_t> cu_seqlens;
  // The same offsets in device memory (CUDA backend only; null on CPU).
  const int32_t* cu_seqlens_device = nullptr;
  // [num_seqs] slot index per sequence, host memory.
  std::span<const int32_t> state_slot;
  // The same in device memory (CUDA backend only).
  const int32_t* state_slot_device = nullptr;
  // When true every sequence starts from a zero state (slots are still written).
  bool zero_initial_state = false;
  int max_seqlen = 0;  // longest sequence, for grid sizing
};

// ---------------------------------------------------------------------------
// Decay family (ULA): S_t = diag(exp(lk_t)) S_{t-1} diag(exp(lv_t)) + k_t v_tᵀ,
// o_t = scale · S_tᵀ q_t. The kinds fix which log-decays are present.
enum class DecayKind {
  kNone,       // lk = lv = 0                          (linear attention)
  kConstant,   // lk = log_gamma[h] at every step       (RetNet, Lightning)
  kScalar,     // lk = g[t,h] broadcast over K          (Mamba2, simple GLA)
  kVector,     // lk = gk[t,h,:]                        (GLA, HGRN2)
  kLeftRight,  // lk = gk[t,h,:], lv = gv[t,h,:]        (the unified form)
};

// A vector decay's log gates formed from a low-rank input (GLA's gk_proj.1):
//   gk[t, h, a] = scale · log σ(z[t] · weight[h·K + a] + bias[h·K + a]),
// which a backend may compute where it reads them instead of storing gk
// (Backend::FormsLowRankGate: the CUDA decode step).
struct LowRankGate {
  Tensor z;       // [N, R] F32
  Tensor weight;  // [H·K, R] BF16/F16
  Tensor bias;    // [H·K] F32, or undefined (zero)
  float scale = 1.0f;
  bool defined() const { return z.defined(); }
};

struct DecayForwardArgs {
  DecayKind kind = DecayKind::kNone;
  int heads = 0, key_dim = 0, value_dim = 0;
  float scale = 1.0f;       // applied to q
  int chunk_size = 64;      // chunked form only
  Tensor q, k, v;           // [N,H,K], [N,H,K], [N,H,V]; F32 (CPU) or F32/BF16/F16 (CUDA)
  Tensor log_gamma;         // [H]       F32, kConstant
  Tensor g;                 // [N,H]     F32, kScalar (≤ 0)
  Tensor gk;                // [N,H,K]   F32, kVector and kLeftRight (≤ 0; kLeftRight may
                            //           leave it undefined: no key-side decay)
  Tensor gv;                // [N,H,V]   F32, kLeftRight (≤ 0)
  LowRankGate gk_low_rank;  // kVector, in place of gk where FormsLowRankGate (forward only)
  Tensor o;                 // out [N,H,V], same dtype as v
  Tensor state;             // in/out pool [num_slots,H,K,V] F32
};

// Gradients of L = <o, do> + <final state, dht> for the same inputs. The
// initial states are read from `state` (unchanged); dht and dh0 are dense,
// one per sequence.
struct DecayBackwardArgs {
  DecayForwardArgs fwd;  // the forward inputs; fwd.o and fwd.state are read-only
  Tensor d_o;            // [N,H,V]
  Tensor d_ht;           // [num_seqs,H,K,V] or undefined (zero)
  Tensor dq, dk, dv;     // out
  Tensor d_log_gamma;    // out [H], kConstant
  Tensor dg;             // out [N,H], kScalar
  Tensor dgk;            // out [N,H,K], kVector/kLeftRight
  Tensor dgv;            // out [N,H,V], kLeftRight
  Tensor dh0;            // out [num_seqs,H,K,V] or undefined (not wanted)
};

// ---------------------------------------------------------------------------
// Gated slot attention: two decay passes joined by a softmax over M slots.
//   Hk_t = Hk_{t-1} diag(exp g_t) + k_t s_tᵀ,  z_t = scale·q_tᵀHk_t, p_t = softmax(z_t)
//   Hv_t = diag(exp g_t) Hv_{t-1} + s_t v_tᵀ,  o_t = Hv_tᵀ p_t
struct GsaForwardArgs {
  int heads = 0, key_dim = 0, value_dim = 0, num_slots_m = 0;
  float scale = 1.0f;
  int chunk_size = 64;
  Tensor q, k, v;  // [N,H,K], [N,H,K], [N,H,V]
  Tensor s, g;     // [N,H,M] each; s = 1 - exp(g) in models, independent here
  Tensor o;        // out [N,H,V]
  Tensor state_k;  // in/out pool [num_slots,H,K,M] F32
  Tensor state_v;  // in/out pool [num_slots,H,M,V] F32
};

struct GsaBackwardArgs {
  GsaForwardArgs fwd;
  Tensor d_o;                 // [N,H,V]
  Tensor d_hkt, d_hvt;        // [num_seqs,H,K,M], [num_seqs,H,M,V] or undefined
  Tensor dq, dk, dv, ds, dg;  // out
  Tensor d_hk0, d_hv0;        // out or undefined
};

// ---------------------------------------------------------------------------
// mLSTM (xLSTM's matrix memory), gates are pre-activations [N,H].
enum class MlstmKind {
  kExp,      // exponential input gate, max stabilizer m, normalizer n
  kSig,      // sigmoid gates, no normalizer in the output (n still carried)
  kSigNorm,  // sigmoid gates, output divided by max(|q'ᵀn|, 1) + eps
};

struct MlstmForwardArgs {
  MlstmKind kind = MlstmKind::kExp;
  int heads = 0, key_dim = 0, value_dim = 0;
  float eps = 1e-6f;
  int chunk_size = 64;
  Tensor q, k, v;  // [N,H,K], [N,H,K], [N,H,V]; q' = q / sqrt(K) inside
  Tensor i, f;     // [N,H] gate pre-activations
  Tensor h;        // out [N,H,V]
  // out [N,H] F32, or undefined: each token's q'ᵀn as the normalized kinds'
  // den took it (kExp, kSigNorm). A training forward keeps it with h: a
  // backward whose fwd carries it reads both as the forward left them
  // instead of running the forward again.
  Tensor norm_dot;
  Tensor state_c;  // in/out pool [num_slots,H,K,V] F32
  Tensor state_n;  // in/out pool [num_slots,H,K]   F32
  Tensor state_m;  // in/out pool [num_slots,H]     F32, kExp only
};

struct MlstmBackwardArgs {
  MlstmForwardArgs fwd;
  Tensor d_h;                 // [N,H,V]
  Tensor d_ct, d_nt;          // [num_seqs,H,K,V], [num_seqs,H,K] or undefined
  Tensor dq, dk, dv, di, df;  // out
  Tensor d_c0, d_n0;          // out or undefined (m0 is treated as constant)
};

}  // namespace lair::kernels
