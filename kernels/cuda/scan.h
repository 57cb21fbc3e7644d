// Launch contracts of the CUDA mixer kernels (host-visible, no CUDA syntax).
//
// Every mixer reduces to one generic chunked scan, the ULA unified function
//   f(Q', K', V', L', R', reverse):  s'_t = diag(L'_t) s'_{t∓1} diag(R'_t) + (w_t K'_t) V'_tᵀ,
//                                   o'_t = s'_tᵀ Q'_t
// run per (sequence, head) over packed tokens. Forward, dQ, dK and dV are the
// four argument permutations (spec ula-and-la-cuda.md §1.4, with the shifted
// decays of erratum U1); GSA is two scans joined by a softmax; mLSTM is the
// scalar-decay scan with a per-token key weight w_t, the max stabilizer m and
// the normalizer n carried as an extra value column.
//
// Layouts: operands are [N, H, dim] (token-major, packed by cu_seqlens);
// states are fp32 tiles addressed as base + slot·slot_stride + h·dk·dv +
// a·stride_a + b·stride_b, so a transposed state is a stride swap.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lair::kernels::cuda {

enum class ElemType : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

// A read-only [N, H, dim] operand of any float element type.
struct Operand {
  const void* ptr = nullptr;
  ElemType type = ElemType::kF32;
};

// Maps a gate pre-activation x to a log value.
enum class GateFn : int {
  kIdentity = 0,    // x is already a log value (≤ 0 for decays)
  kLogSigmoid = 1,  // log σ(x)
};

// A per-token log decay or log weight, fp32. Null ptr means 0 (no decay).
struct LogGate {
  const float* ptr = nullptr;
  int token_stride = 0;  // floats between consecutive tokens (0: constant in time)
  int head_stride = 0;   // floats between heads
  GateFn fn = GateFn::kIdentity;
  // Erratum U1: read token t+1 of the same sequence, and 0 at its last token.
  bool shift = false;
};

// The left log decay of the decode step formed from a low-rank input
// (kernels/mixer.h LowRankGate): key a of head h at token t is
//   scale · log σ(bias[h·dk + a] + Σ_r z[t, r] · w[h·dk + a, r]).
struct LowRankLeft {
  const float* z = nullptr;  // [N, rank]; null: not formed
  const void* w = nullptr;   // [H·dk, rank] of w_type (16-bit)
  ElemType w_type = ElemType::kBF16;
  const float* bias = nullptr;  // [H·dk] or null
  int rank = 0;                 // a multiple of 8, at most kMaxLowRank
  float scale = 1.0f;
};
constexpr int kMaxLowRank = 64;

// A pool of fp32 state tiles [., H, dk, dv] (viewed from the scan).
struct StateRef {
  float* ptr = nullptr;            // null: zero initial state / final not wanted
  const int32_t* slot = nullptr;   // [num_seqs] device slot ids; null: slot = sequence
  int64_t slot_stride = 0;         // floats per slot
  int stride_a = 0, stride_b = 0;  // floats per step of the dk / dv index
};

enum class NormKind : int {
  kNone = 0,      // o = s'ᵀ q'
  kMlstmExp = 1,  // o = num / (max(|q'ᵀn|, e^{−m}) + eps)
  kSigNorm = 2,   // o = num / (max(|q'ᵀn|, 1) + eps)
};

struct ScanParams {
  int num_seqs = 0, heads = 0;
  int dk = 0, dv = 0;                   // dims of Q'/K' and of V'/O' (dk ≤ 256, multiple of 4)
  const int32_t* cu_seqlens = nullptr;  // device [num_seqs + 1]
  bool reverse = false;                 // iterate from the last token to the first
  Operand q, k, v;
  float q_scale = 1.0f, k_scale = 1.0f;
  LogGate left;               // on the dk side
  bool left_vector = false;   // left.ptr is [N,H,dk] (else one value per token)
  LowRankLeft left_low_rank;  // the step's vector left decay in place of left (LaunchStep only)
  LogGate right;              // on the dv side, [N,H,dv] or null
  LogGate key_weight;         // log w_t per token (mLSTM input gate) or null
  bool stabilize = false;     // mLSTM max stabilizer m (needs m_init/m_final)
  // log r_t per token or null: output row t is scaled by e^{r_t + m_t}, m_t the
  // stabilizer (0 without it). Scalar decays on the tensor-core path only (the
  // mLSTM exp backward's reverse scans: the input gate of the row's token).
  LogGate row_weight;
  // One more key feature (scalar decays on the tensor-core path, in one pass,
  // without a norm): q'_t and k'_t gain an entry, extra_q[t] and extra_k[t]
  // (fp32 [N, H]; null: 1), under q_scale and k_scale as the others, so S
  // gains a row, which starts at 0. The mLSTM backward's share of q'·n
  // (cuda_backend.cc, MlstmNormBackward) without columns of ones.
  bool extra_key = false;
  const float* extra_q = nullptr;
  const float* extra_k = nullptr;
  // With the extra key feature, where row_dots is set: each output row's dot
  // with the same row of dot_with (bf16 or f16, [N, H, dv]), taken before the
  // row is rounded to o_type, added atomically into
  // row_dots[seq·row_dots_seq_stride + t·heads + h] (t the token's place in
  // its sequence; the value tiles' parts add). The mLSTM backward's q·dq and
  // k·dk for its gate gradients.
  Operand dot_with;
  float* row_dots = nullptr;
  int64_t row_dots_seq_stride = 0;
  // [N, H] or null: each row's q'ᵀn before the normalizer's max (norm kinds;
  // the mLSTM backward's branch of that max, as the forward took it).
  float* norm_dot = nullptr;
  NormKind norm = NormKind::kNone;
  float eps = 0.0f;
  StateRef s_init, s_final;  // s_init.ptr null → zero state
  // mLSTM normalizer n [., H, dk] and stabilizer m [., H]: same slot mapping
  // as s_init/s_final. n_init/m_init must not alias n_final/m_final.
  const float* n_init = nullptr;
  float* n_final = nullptr;
  const float* m_init = nullptr;
  float* m_final = nullptr;
  void* o = nullptr;  // [N, H, dv]
  ElemType o_type = ElemType::kF32;
  // Consecutive heads sharing one head of the value side: v and the right
  // gate are [N, H / v_head_share, dv] and head h reads their head
  // h / v_head_share (key blocks scanned as heads of their own,
  // cuda_backend.cc).
  int v_head_share = 1;
};

// Chunked scan, one CTA per (sequence, head, 64-wide dv tile), sequential over
// chunks. bf16/f16 operands take the tensor-core path (scan_mma.h: chunks of
// 64, bf16 mma, fp32 accumulation and state) unless a right decay comes with a
// left one or the mLSTM fields; the rest runs chunks of 32 tokens in fp32
// arithmetic throughout.
cudaError_t LaunchScan(const ScanParams& p, cudaStream_t stream);

// One-token decode step for every sequence (N == num_seqs, so sequence s's
// token is token s: cu_seqlens is not read), states in place in their slots.
// Same fields as the scan; reverse and shift are not allowed; s_init and
// s_final must be the same pool (in place); dv multiple of 32.
// A programmatic dependent of the kernel before it in `stream`, it reads the
// states (and the slots) before that kernel completes: the states' last
// writer must have completed before that kernel started, as it has when a
// normally launched kernel (a layer's norm) or a copy lies between them.
cudaError_t LaunchStep(const ScanParams& p, cudaStream_t stream);
// The widest key dim LaunchStep takes (its token operands sit in shared
// memory; the state streams through in row groups, so any width works).
constexpr int kMaxStepKeyDim = 1024;
// Whether LaunchStep's launch for these sizes holds its rows in registers:
// at most a wave, bound by latency rather than by the state's bytes (on a
// device of `sms` multiprocessors).
bool StepHoldsRows(int dv, int heads, int num_seqs, int sms);

// --- Elementwise helpers ----------------------------------------------------
// dst[i] = (T) src[i] between element types.
cudaError_t LaunchConvert(const void* src, ElemType src_type, void* dst, ElemType dst_type,
                          int64_t count, cudaStream_t stream);
// dst[r·copies + c, :] = src[r, :] for rows of `width` elements of one type:
// an operand of H heads seen as H·copies heads (key blocks as heads).
cudaError_t LaunchRepeatRows(const void* src, ElemType type, int64_t rows, int width, int copies,
                             void* dst, cudaStream_t stream);
// out[r, :] = Σ_c parts[r·copies + c, :] over fp32 rows of `width`, stored as out_type.
cudaError_t LaunchSumRowGroups(const float* parts, int64_t rows, int width, int copies, void* out,
                               ElemType out_type, cudaStream_t stream);
// Softmax over the last dim of a fp32 [rows, width] matrix into out (of
// out_type; in place when out is x and fp32).
cudaError_t LaunchSoftmaxRows(const float* x, int64_t rows, int width, void* out, ElemType out_type,
                              cudaStream_t stream);

// Decay gradient (spec §1.7): for each sequence, head and feature a
//   out[t,h,a] = Σ_{τ≥t} (x[τ,h,a]·dx[τ,h,a] − y[τ,h,a]·dy[τ,h,a]) + Σ_b dS[a,b]·S[a,b]
// (Σ_a dS[b,a]·S[b,a] when transposed: the right-decay column sum). x, y are
// [N,H,dim] operands; dS, S fp32 [num_seqs,H,dim,other] or null.
// When reduce_features the sum over a is taken and out is [N,H].
// dx_out / dy_out, when set, receive dx / dy in their own element types as the
// term pass reads them (the backward's dq and dk, rounded once to their dtype).
struct DecayGradParams {
  int num_seqs = 0, heads = 0, dim = 0, other = 0;
  int64_t tokens = 0;  // N
  const int32_t* cu_seqlens = nullptr;
  Operand x, dx, y, dy;
  void* dx_out = nullptr;
  ElemType dx_out_type = ElemType::kF32;
  void* dy_out = nullptr;
  ElemType dy_out_type = ElemType::kF32;
  const float* d_state = nullptr;  // dS_n per sequence
  const float* state = nullptr;    // s_n per sequence
  bool transposed = false;         // dim is the second state axis
  bool reduce_features = false;
  float* out = nullptr;
};
cudaError_t LaunchDecayGrad(const DecayGradParams& p, cudaStream_t stream);

// out[h] = Σ_n x[n,h] over fp32 [N,H].
cudaError_t LaunchSumTokens(const float* x, int64_t tokens, int heads, float* out,
                            cudaStream_t stream);

// dh0[s,h,a,b] = exp(left(first token of s)[a]) · G[s,h,a,b] · exp(right(first)[b]).
cudaError_t LaunchScaleByFirstDecay(const float* g, int num_seqs, int heads, int dk, int dv,
                                    const int32_t* cu_seqlens, const LogGate& left,
                                    bool left_vector, const LogGate& right, float* out,
                                    cudaStream_t stream);

}  // namespace lair::kernels::cuda
