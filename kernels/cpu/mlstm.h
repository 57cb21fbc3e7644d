// mLSTM (xLSTM's matrix memory) on the CPU: the fp32 reference for the three
// MlstmKinds of kernels/mixer.h, per head, with q' = q / sqrt(K):
//
//   kExp      m_t = max(logσ(f_t) + m_{t-1}, i_t)
//             C_t = e^{logσ(f_t)+m_{t-1}-m_t} C_{t-1} + e^{i_t-m_t} k_t v_tᵀ,  n_t likewise with
//             k_t h_t = C_tᵀq' / (max(|q'ᵀn_t|, e^{-m_t}) + eps)
//   kSig      C_t = σ(f_t) C_{t-1} + σ(i_t) k_t v_tᵀ,  n_t likewise,  h_t = C_tᵀq'
//   kSigNorm  as kSig,  h_t = C_tᵀq' / (max(|q'ᵀn_t|, 1) + eps)
//
// C and n are stored stabilized (the unstabilized memory is C·e^{m}); m lives
// in state_m for kExp and is absent (0) for the sigmoid kinds. Layouts, state
// pools and the packed batch are those of kernels/mixer.h; slots must be
// distinct.
//
// Thread safety: the calls touch only their arguments; work is spread over
// `threads` threads by (sequence, head) (<= 0: every core).
#pragma once

#include "kernels/backend.h"
#include "kernels/mixer.h"

namespace lair::kernels::cpu {

// Writes args.h and updates the state slots in place. kRecurrent steps token
// by token; kChunked runs the chunkwise form with args.chunk_size; kAuto is
// recurrent when every sequence has one token and chunked otherwise.
// InvalidArgument naming the field when a shape, dtype, device, chunk size,
// offset or slot is wrong; nothing is written then.
absl::Status MlstmForwardCpu(const SequenceBatch& batch, const MlstmForwardArgs& args,
                             MixerForm form, int threads = 0);

// Gradients of L = <h, d_h> + <C_T, d_ct> + <n_T, d_nt> (C_T, n_T the final
// stabilized states) with respect to q, k, v, i, f and the initial C_0, n_0,
// with m_0 held constant; the exact derivative of the forward above, including
// the paths through m and through the denominator. The initial states are read
// from the pools, which are left unchanged. d_ct, d_nt, d_c0 and d_n0 may be
// undefined (zero cotangent / not wanted). Same errors as the forward.
absl::Status MlstmBackwardCpu(const SequenceBatch& batch, const MlstmBackwardArgs& args,
                              int threads = 0);

}  // namespace lair::kernels::cpu
