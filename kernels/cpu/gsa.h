// Gated slot attention (GSA) on the CPU: the fp32 reference, per head, in the
// notation of specs/gsa.md §1.4–1.5 (g = log α ≤ 0, s the slot write strengths,
// both [N,H,M] and independent inputs here):
//
//   Hk_t = Hk_{t-1} Diag(e^{g_t}) + k_t s_tᵀ      Hk ∈ R^{K×M}   (state_k)
//   z_t  = scale · Hk_tᵀ q_t,   p_t = softmax(z_t) over the M slots
//   Hv_t = Diag(e^{g_t}) Hv_{t-1} + s_t v_tᵀ      Hv ∈ R^{M×V}   (state_v)
//   o_t  = Hv_tᵀ p_t
//
// Both passes are the decay family of kernels/cpu/decay.h: pass 1 is
// kLeftRight with lk = 0, lv = g on (q, k, v' = s); pass 2 is kVector with
// lk = g on (q' = p, k' = s, v). The softmax joins them.
//
// Layouts, state pools and the packed batch are those of kernels/mixer.h;
// every tensor is F32.
//
// Thread safety: the calls touch only their arguments; the decay passes spread
// work over `threads` threads by (sequence, head) (<= 0: every core).
#pragma once

#include "kernels/backend.h"
#include "kernels/mixer.h"

namespace lair::kernels::cpu {

// Writes args.o and replaces each sequence's slots in state_k and state_v
// with its final states (read first unless batch.zero_initial_state). `form`
// is passed to both decay passes (kAuto: recurrent when every sequence has at
// most one token). InvalidArgument naming the field for a bad shape, dtype,
// size, offset, slot (slots must be distinct) or a log-decay g > 0; nothing
// is written then.
absl::Status GsaForwardCpu(const SequenceBatch& batch, const GsaForwardArgs& args, MixerForm form,
                           int threads = 0);

// Gradients of L = <o, d_o> + <Hk_T, d_hkt> + <Hv_T, d_hvt> with respect to
// q, k, v, s, g and the initial states (spec §2.5): the decay backward of
// pass 2, the softmax Jacobian, the decay backward of pass 1; ds and dg sum
// both passes. The initial states are read from the pools, which are left
// unchanged; d_hkt, d_hvt, d_hk0 and d_hv0 may be undefined. Same errors as
// the forward, except that slots may repeat.
absl::Status GsaBackwardCpu(const SequenceBatch& batch, const GsaBackwardArgs& args,
                            int threads = 0);

}  // namespace lair::kernels::cpu
