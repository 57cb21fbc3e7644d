// Gated slot attention as two passes of the decay family (specs/gsa.md §1.5),
// shared by every backend so the mapping is written once:
//   pass 1 (key pass):   Hk_t = Hk_{t-1} diag(e^{g_t}) + k_t s_tᵀ,  z_t = scale·Hk_tᵀq_t
//                        = left-right decay with no key-side decay (gk undefined) and g on
//                        the slot side;
//   pass 2 (value pass): Hv_t = diag(e^{g_t}) Hv_{t-1} + s_t v_tᵀ,  o_t = Hv_tᵀp_t
//                        = vector decay over the M slots, queried by p = softmax(z).
#pragma once

#include "kernels/mixer.h"

namespace lair::kernels {

// `state` is the [slots,H,K,M] pool to read and write.
inline DecayForwardArgs GsaKeyPass(const GsaForwardArgs& a, const Tensor& state) {
  DecayForwardArgs p;
  p.kind = DecayKind::kLeftRight;
  p.heads = a.heads;
  p.key_dim = a.key_dim;
  p.value_dim = a.num_slots_m;
  p.scale = a.scale;
  p.chunk_size = a.chunk_size;
  p.q = a.q;
  p.k = a.k;
  p.v = a.s;
  p.gv = a.g;
  p.state = state;
  return p;
}

// `p_slots` holds the softmax probabilities [N,H,M]; `state` the [slots,H,M,V] pool.
inline DecayForwardArgs GsaValuePass(const GsaForwardArgs& a, const Tensor& p_slots,
                                     const Tensor& state) {
  DecayForwardArgs p;
  p.kind = DecayKind::kVector;
  p.heads = a.heads;
  p.key_dim = a.num_slots_m;
  p.value_dim = a.value_dim;
  p.scale = 1.0f;
  p.chunk_size = a.chunk_size;
  p.q = p_slots;
  p.k = a.s;
  p.v = a.v;
  p.gk = a.g;
  p.state = state;
  return p;
}

}  // namespace lair::kernels
