// Launch contracts of the GSA and mLSTM backward kernels (host-visible, no
// CUDA syntax). GSA backward is two decay backwards joined by the softmax
// Jacobian below; mLSTM backward is its own kernel, exact reverse mode through
// the recurrent step (kernels/cpu/mlstm.cc's semantics).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/scan.h"

namespace lair::kernels::cuda {

// dP ← P ⊙ (dP − Σ_c P_c dP_c) per row of fp32 [rows, width], in place of dP.
cudaError_t LaunchSoftmaxBackward(const float* p, float* dp, int64_t rows, int width,
                                  cudaStream_t stream);

// out[i] = a[i] + b[i] from fp32 inputs, stored as out_type; out may alias a.
cudaError_t LaunchAdd(const float* a, const float* b, void* out, ElemType out_type, int64_t count,
                      cudaStream_t stream);

enum class MlstmGate : int {
  kExp = 0,      // exponential input gate, max stabilizer m, normalized output
  kSig = 1,      // sigmoid gates, unnormalized output
  kSigNorm = 2,  // sigmoid gates, output / (max(|q'ᵀn|, 1) + eps)
};

// mLSTM backward, chunkwise and parallel over (sequence, head, chunk): the
// chunk-boundary states forward and reversed go to `scratch`, then every
// chunk's gradients are computed independently (kernels/cuda/mixer_backward.cu).
// dk, dv ≤ kMlstmBackwardMaxDim. m0 is a constant (no gradient).
inline constexpr int kMlstmBackwardMaxDim = 128;

struct MlstmBackwardParams {
  int num_seqs = 0, heads = 0;
  int dk = 0, dv = 0;
  int max_len = 0;                      // longest sequence
  int block = 0;                        // unused: left for the callers that still set it
  const int32_t* cu_seqlens = nullptr;  // device [num_seqs + 1]
  MlstmGate gate = MlstmGate::kExp;
  float eps = 0.0f;
  Operand q, k, v, dh;       // [N,H,dk], [N,H,dk], [N,H,dv], [N,H,dv]
  const float* i = nullptr;  // [N,H] pre-activations
  const float* f = nullptr;
  // Initial states: pools [slots,H,dk,dv], [slots,H,dk], [slots,H] read through
  // `slot`; c_init null means zero states (m_init null: m0 = 0).
  const int32_t* slot = nullptr;
  const float* c_init = nullptr;
  const float* n_init = nullptr;
  const float* m_init = nullptr;
  const float* d_ct = nullptr;  // [num_seqs,H,dk,dv] or null (zero)
  const float* d_nt = nullptr;  // [num_seqs,H,dk] or null
  void* dq = nullptr;           // [N,H,dk] of dq_type
  void* dk_out = nullptr;       // [N,H,dk] of dk_type
  void* dv_out = nullptr;       // [N,H,dv] of dv_type
  ElemType dq_type = ElemType::kF32, dk_type = ElemType::kF32, dv_type = ElemType::kF32;
  float* di = nullptr;       // [N,H]
  float* df = nullptr;       // [N,H]
  float* d_c0 = nullptr;     // [num_seqs,H,dk,dv] or null (not wanted)
  float* d_n0 = nullptr;     // [num_seqs,H,dk] or null
  float* scratch = nullptr;  // MlstmBackwardScratchFloats(*this) floats
};

// The sigmoid kind's backward through the decay-family scans (cuda_backend.cc)
// sees the mLSTM as a scalar decay lf = log σ(f) over keys k' = σ(i)·k. Per
// row of [rows, K]:
//   k'[r] = σ(i_r)·k[r], lf[r] = log σ(f_r).
cudaError_t LaunchMlstmSigKeys(Operand k, const float* i, const float* f, int64_t rows, int K,
                               void* k_scaled, ElemType k_scaled_type, float* lf,
                               cudaStream_t stream);
// From the scans' dk' (fp32) and decay gradient dg: dk = σ(i)·dk',
// di = (k'·dk')·σ(−i), df = dg·σ(−f).
cudaError_t LaunchMlstmSigGateGrads(Operand k_scaled, const float* dk_scaled, const float* i,
                                    const float* f, const float* dg, int64_t rows, int K, void* dk,
                                    ElemType dk_type, float* di, float* df, cudaStream_t stream);

// The normalized kinds' backward on the scans (cuda_backend.cc) takes the
// mLSTM kernel's per-token steps around its scans, in a scratch of
// MlstmTokenScratchFloats(p) (no chunk states), from zero initial states
// without state cotangents:
//   LaunchMlstmStabilizers    b and m_t of every token (m = 0 for the sigmoid kinds);
//   LaunchMlstmNormCotangent  from the forward's h ([N,H,V], any float type) and
//     its q'·n (norm_dot [N,H], ScanParams::norm_dot: the max's branch as the
//     forward took it) and p.dh, with den = max(|q'·n|, lower) + eps (lower =
//     e^{−m}, or 1 for kSigNorm): dh/den into d_num [N,H,V] (of `type`) and
//     x = −(dh·h)/den·sign(q'·n), q'·n's cotangent, into x_out [N,H]; for kExp
//     also −m_t into neg_m [N,H] and the explicit dm_t = −(dh·h)·eps/den;
//   (the dq and dk scans, which store dq and dk and add q·dq and k·dk into
//     MlstmTokenRowDots, zeroed first: ScanParams::row_dots)
//   LaunchMlstmNormGateGrads  di, df from q·dq − k·dk and, for kExp, the m chain.
int64_t MlstmTokenScratchFloats(const MlstmBackwardParams& p);
cudaError_t LaunchMlstmStabilizers(const MlstmBackwardParams& p, cudaStream_t stream);
cudaError_t LaunchMlstmNormCotangent(const MlstmBackwardParams& p, Operand h_out,
                                     const float* norm_dot, void* d_num, ElemType type,
                                     float* x_out, float* neg_m, cudaStream_t stream);
// The token scratch's q·dq and k·dk: fp32, num_seqs·seq_stride each,
// sequence s's token t at head h at s·seq_stride + t·H + h.
struct MlstmRowDots {
  float* qdq;
  float* kdk;
  int64_t seq_stride;
};
MlstmRowDots MlstmTokenRowDots(const MlstmBackwardParams& p);
cudaError_t LaunchMlstmNormGateGrads(const MlstmBackwardParams& p, cudaStream_t stream);

// fp32 elements of scratch the launch needs (dims, num_seqs and max_len set).
int64_t MlstmBackwardScratchFloats(const MlstmBackwardParams& p);

cudaError_t LaunchMlstmBackward(const MlstmBackwardParams& p, cudaStream_t stream);

}  // namespace lair::kernels::cuda
