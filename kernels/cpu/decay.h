// The decay family (kernels/mixer.h DecayKind) on the CPU: the exact fp32
// reference, per (sequence, head) on the packed layout,
//
//   S_t = diag(exp lk_t) S_{t-1} diag(exp lv_t) + k_t v_tᵀ,   o_t = scale · S_tᵀ q_t
//
// with lk = 0 (kNone), log_gamma[h] (kConstant), g[t,h] broadcast (kScalar),
// gk[t,h,:] (kVector, kLeftRight), and lv = gv[t,h,:] for kLeftRight, 0
// otherwise. Forward and backward are argument permutations of one pass
// (kernels/cpu/ula_core.h); the gate gradients come from reversed cumulative
// sums (specs/ula-and-la-cuda.md §1.7).
//
// q, k, v, o, d_o, dq, dk, dv may be F32, BF16 or F16 (computed in F32);
// gates, states and their gradients are F32. Chunked and recurrent forms
// agree to rounding; chunk_size is any positive number of tokens.
//
// Thread safety: the calls touch only their arguments; work is spread over
// `threads` threads by (sequence, head) (<= 0: every core).
#pragma once

#include "kernels/backend.h"
#include "kernels/mixer.h"

namespace lair::kernels::cpu {

// Writes args.o and replaces each sequence's slot in args.state with its
// final state (read first, unless batch.zero_initial_state). kAuto runs the
// recurrent form when every sequence has at most one token, else chunked.
// InvalidArgument naming the field (shape, dtype, device, kind, chunk size,
// offsets, slot range, a slot shared by two sequences); nothing is written.
absl::Status DecayForwardCpu(const SequenceBatch& batch, const DecayForwardArgs& args,
                             MixerForm form, int threads = 0);

// Gradients of L = <o, d_o> + Σ_seq <S_final, d_ht> with respect to q, k, v,
// the gates of the kind and the initial states, for the inputs in args.fwd
// (args.fwd.o and args.fwd.state are only read; the initial states come from
// the slots unless batch.zero_initial_state). dq, dk, dv are required;
// d_ht may be undefined (zero); d_log_gamma, dg, dgk, dgv and dh0 may be
// undefined (not wanted). Slots may repeat. `form` picks the pass form as in
// the forward. Same errors as the forward.
absl::Status DecayBackwardCpu(const SequenceBatch& batch, const DecayBackwardArgs& args,
                              MixerForm form = MixerForm::kAuto, int threads = 0);

}  // namespace lair::kernels::cpu
