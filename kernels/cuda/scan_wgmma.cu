// The scalar-decay scan on warpgroup products (scan_wgmma.h): one CTA of one
// warpgroup (four warps) per (sequence, head, 64-column dv tile), sequential
// over chunks of C = 64 tokens (in reverse for the backward's dk and dv
// scans). Every product is an m64n64k16 wgmma with fp32 accumulators; S [128
// keys × 64] lives in fp32 registers (two m64 accumulators) and, rounded once
// per chunk to bf16, in shared memory as the B operand of Q S (as the
// mma.sync scan and fla round it). Operand tiles use the 128-byte swizzle
// (wgmma.cuh). Per chunk, with b the inclusive in-chunk cumsum of the log
// decay, lw the key weights and m the stabilizer of scan_mma.cu
// (m_i = b_i + max(m_prev, max_{j≤i}(lw_j − b_j)); m = 0 without one):
//   A  = (Q Kᵀ) ⊙ qk_scale·e^{(b_i − m_i) − (b_j − lw_j)}, masked j ≤ i
//   O  = diag(q_scale·e^{b_i + m_prev − m_i}) (Q S) + A V    (A from registers)
//   S ← e^{b_C + m_prev − m_C} S + Kᵀ V̂,  V̂_j = k_scale·e^{b_C − b_j + lw_j − m_C} v_j
// Every factor is at most 1, the per-token scalars are scanned by every warp
// for itself (shuffles, no tables), A is rounded to bf16 in registers and V̂
// in shared memory. mLSTM's normalizer n (a [128] vector, one key a thread)
// is summed on the CUDA cores beside the products, as is the row S gains
// with the extra key feature (the normalized mLSTM backward's dq and dk
// scans, whose output rows are also dotted with ScanParams::dot_with). The
// copies of chunk c + 1 (cp.async, two stages) fly while chunk c computes;
// V̂ and A's factors are formed while Q Kᵀ and Q S run, A's fragments while
// the state update runs. Three barriers a chunk.
#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/mma_fragments.cuh"
#include "kernels/cuda/scan_wgmma.h"
#include "kernels/cuda/wgmma.cuh"

namespace lair::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kChunk = 64;     // C, the m64 of every product
constexpr int kKeys = 128;     // dk
constexpr int kTileV = 64;     // dv columns per CTA, the n64 of every product
constexpr int kThreads = 128;  // one warpgroup
constexpr int kStages = 2;
static_assert(kThreads == kKeys, "the normalizer: one key a thread");

// The per-token fp32 rows of a stage: the log decay, key weight, row weight
// and the extra key feature of q' and of k'.
enum TokenRow { kDecayRow, kKeyWeightRow, kRowWeightRow, kExtraQRow, kExtraKRow, kTokenRows };

// The optional fields an instance serves; each adds registers the leaner
// ones do without.
enum class Fields {
  kPlain,       // the decay alone: simple GLA's and RetNet's scans
  kGated,       // + key and row weights and the stabilizer (mLSTM's scans)
  kNormalizer,  // + n carried (a norm or n_final)
  kExtraKey,    // + the extra key feature and its row dots (no norm)
};

// Byte offsets of the dynamic shared memory from its first 1024-byte boundary
// (tiles swizzled, wgmma.cuh).
struct Layout {
  static constexpr int kQ = 0;                              // q [C][dk]
  static constexpr int kK = kQ + kChunk * kKeys * 2;        // k [C][dk]
  static constexpr int kV = kK + kChunk * kKeys * 2;        // v tile [C][TV]
  static constexpr int kTokens = kV + kChunk * kTileV * 2;  // raw [kTokenRows][C] fp32
  static constexpr int kStageBytes = (kTokens + kTokenRows * kChunk * 4 + wgmma::kAtomBytes - 1) /
                                     wgmma::kAtomBytes * wgmma::kAtomBytes;
  static constexpr int kVhat = kStages * kStageBytes;     // V̂ [C][TV]
  static constexpr int kS = kVhat + kChunk * kTileV * 2;  // S in bf16 [dk][TV]
  static constexpr int kN = kS + kKeys * kTileV * 2;      // n entering the chunk, fp32 [dk]
  // The extra key feature: S's extra row entering the chunk, and the two
  // halves of the chunk's addition to it, fp32 [TV] each.
  static constexpr int kExtraRow = kN + kKeys * 4;
  static constexpr int kExtraParts = kExtraRow + kTileV * 4;
  static constexpr int kBytes = kExtraParts + 2 * kTileV * 4 + wgmma::kAtomBytes;  // + alignment
};
static_assert(2 * (Layout::kBytes + 1024) <= 228 * 1024, "two CTAs per SM");

// Byte offsets in a swizzled tile (wgmma.cuh) of this thread's pairs of an
// m64n64 accumulator: pair i, row 16w + g + 8·(i/2 % 2) and column
// 8·(i/4) + 2t4, lies at row·128 + (i/4 ⊕ g)·16 + 4t4, since row % 8 = g.
// Made where it is used from opaque copies of the thread's coordinates: left
// to itself, the compiler forms every offset once and holds them in
// registers across the chunk loop, which the kernel's 255 cannot spare.
struct PairOffsets {
  int first;  // (16w + g)·128 + 4t4
  int g;
  __device__ static PairOffsets Here(int warp, int lane) {
    return {wgmma::Here(128 * (16 * warp + lane / 4) + 4 * (lane % 4)), wgmma::Here(lane / 4)};
  }
  __device__ int operator()(int i) const { return first + (i / 2 % 2) * 1024 + ((i / 4) ^ g) * 16; }
};

template <Fields kFields>
__global__ void __launch_bounds__(kThreads, 2) ScanWgmmaKernel(const ScanParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int C = kChunk;
  constexpr unsigned kAll = 0xffffffffu;
  constexpr bool kGated = kFields != Fields::kPlain;
  constexpr bool kNormalizer = kFields == Fields::kNormalizer;
  constexpr bool kExtra = kFields == Fields::kExtraKey;
  // A's factors formed while Q Kᵀ runs take 32 registers the normalizer's
  // and the extra feature's instances lack; they form them after the wait.
  constexpr bool kEarlyFactors = !kNormalizer && !kExtra;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem =
      smem_raw + (wgmma::kAtomBytes - SmemAddr(smem_raw) % wgmma::kAtomBytes) % wgmma::kAtomBytes;
  [[maybe_unused]] float* n_prev = reinterpret_cast<float*>(smem + Layout::kN);
  [[maybe_unused]] float* extra_row = reinterpret_cast<float*>(smem + Layout::kExtraRow);
  [[maybe_unused]] float* extra_parts = reinterpret_cast<float*>(smem + Layout::kExtraParts);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int h = blockIdx.y, seq = blockIdx.z, e0 = blockIdx.x * kTileV;
  const int64_t bos = p.cu_seqlens[seq];
  const int len = p.cu_seqlens[seq + 1] - static_cast<int>(bos);
  const int num_chunks = (len + C - 1) / C;
  const int dir = p.reverse ? -1 : 1;
  const int v_heads = p.heads / p.v_head_share, vh = h / p.v_head_share;
  const int64_t head_off = static_cast<int64_t>(h) * kKeys * p.dv;
  const float qk_scale = p.q_scale * p.k_scale;
  const bool norm = kNormalizer && p.norm != NormKind::kNone;
  const bool stabilize = kGated && p.stabilize;
  const int slot_in = p.s_init.slot ? p.s_init.slot[seq] : seq;
  // 16-bit outputs leave through shared memory in 16-byte pieces.
  const bool stage_out = (p.o_type == ElemType::kBF16 || p.o_type == ElemType::kF16) &&
                         reinterpret_cast<uintptr_t>(p.o) % 16 == 0;
  // The local token of chunk row 0 of chunk c, and of row i.
  const auto first_token = [&](int chunk) { return p.reverse ? len - 1 - chunk * C : chunk * C; };

  // 1. The copies of chunk `chunk` into stage st, one cp.async group; rows
  //    past the sequence are zero. q and k: thread t takes column piece t % 16
  //    of rows t / 16 + 8i (a warp reads two whole rows); v: piece t % 8 of
  //    rows t / 8 + 16i. The swizzle keeps each warp's writes in distinct banks.
  const int qk_row = tid / 16, qk_col = 8 * (tid % 16), v_row = tid / 8, v_col = 8 * (tid % 8);
  auto issue = [&](int chunk, int st) {
    unsigned char* base = smem + st * Layout::kStageBytes;
    const int lc = min(C, len - chunk * C), t0 = first_token(chunk);
    const int64_t qk_step = static_cast<int64_t>(dir) * p.heads * kKeys;
    const auto* q = static_cast<const bf16*>(p.q.ptr) + ((bos + t0) * p.heads + h) * kKeys + qk_col;
    const auto* k = static_cast<const bf16*>(p.k.ptr) + ((bos + t0) * p.heads + h) * kKeys + qk_col;
    const int qk_at = wgmma::Swizzled(C, qk_row, qk_col);
#pragma unroll
    for (int i = 0; i < C / 8; ++i) {
      const int r = qk_row + 8 * i;
      const bool live = r < lc;
      const int64_t off = live ? r * qk_step : 0;
      CpAsync16(base + Layout::kQ + qk_at + 8 * 128 * i, q + off, live);
      CpAsync16(base + Layout::kK + qk_at + 8 * 128 * i, k + off, live);
    }
    const int64_t v_step = static_cast<int64_t>(dir) * v_heads * p.dv;
    const auto* v =
        static_cast<const bf16*>(p.v.ptr) + ((bos + t0) * v_heads + vh) * p.dv + e0 + v_col;
    const int v_at = wgmma::Swizzled(C, v_row, v_col);
#pragma unroll
    for (int i = 0; i < C / 16; ++i) {
      const int r = v_row + 16 * i;
      const bool live = r < lc;
      CpAsync16(base + Layout::kV + v_at + 16 * 128 * i, v + (live ? r * v_step : 0), live);
    }
    if (tid < C) {
      // Raw values; gate() below applies the gates' functions and liveness.
      float* rows = reinterpret_cast<float*>(base + Layout::kTokens);
      const int t = t0 + dir * tid;
      const auto* any = static_cast<const float*>(p.q.ptr);  // mapped; read by no dead copy
      const auto copy_row = [&](const float* ptr, int64_t token_stride, int64_t head_stride,
                                bool shift, int row) {
        const int src = t + (shift ? 1 : 0);
        const bool live = tid < lc && ptr != nullptr && src < len;
        CpAsync4(rows + row * C + tid,
                 live ? ptr + (bos + src) * token_stride + h * head_stride : any, live);
      };
      const auto copy_gate = [&](const LogGate& gt, int row) {
        copy_row(gt.ptr, gt.token_stride, gt.head_stride, gt.shift, row);
      };
      copy_gate(p.left, kDecayRow);
      if constexpr (kGated) {
        copy_gate(p.key_weight, kKeyWeightRow);
        copy_gate(p.row_weight, kRowWeightRow);
      }
      if constexpr (kExtra) {
        copy_row(p.extra_q, p.heads, 1, false, kExtraQRow);
        copy_row(p.extra_k, p.heads, 1, false, kExtraKRow);
      }
    }
    CpAsyncCommit();
  };

  // S: sacc[r] holds keys 64r.. as an m64n64 accumulator (wgmma.cuh); n: key
  // tid in n_reg.
  float sacc[2][32];
  const auto s_row = [&](int r, int i) { return 64 * r + 16 * warp + g + 8 * (i / 2 % 2); };
  const auto s_col = [&](int i) { return 8 * (i / 4) + 2 * t4 + i % 2; };
  {
    const float* base =
        p.s_init.ptr ? p.s_init.ptr + slot_in * p.s_init.slot_stride + head_off : nullptr;
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int i = 0; i < 32; ++i)
        sacc[r][i] = base ? base[static_cast<int64_t>(s_row(r, i)) * p.s_init.stride_a +
                                 static_cast<int64_t>(e0 + s_col(i)) * p.s_init.stride_b]
                          : 0.0f;
  }
  [[maybe_unused]] float n_reg = 0.0f;
  if constexpr (kNormalizer) {
    if (p.n_init) n_reg = p.n_init[(static_cast<int64_t>(slot_in) * p.heads + h) * kKeys + tid];
  }
  float m_prev = 0.0f;
  if (stabilize && p.m_init) m_prev = p.m_init[static_cast<int64_t>(slot_in) * p.heads + h];
  // The extra row of S, which starts at 0: column tid of it in extra_reg
  // (threads below TV), decayed, without the last chunk's parts.
  [[maybe_unused]] float extra_reg = 0.0f;
  if constexpr (kExtra) extra_parts[tid] = 0.0f;  // both halves; the first barrier orders it

  if (num_chunks > 0) issue(0, 0);
  for (int chunk = 0; chunk < num_chunks; ++chunk) {
    const int st = chunk % kStages;
    const int c0 = chunk * C, lc = min(C, len - c0), t0 = first_token(chunk);
    unsigned char* base = smem + st * Layout::kStageBytes;
    const float* rows = reinterpret_cast<const float*>(base + Layout::kTokens);
    CpAsyncWait<0>();
    // S entering the chunk, rounded to bf16: the B operand of Q S; n too.
    {
      const PairOffsets at = PairOffsets::Here(warp, lane);
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int i = 0; i < 32; i += 2)
          *reinterpret_cast<uint32_t*>(smem + Layout::kS + wgmma::Swizzled(kKeys, 64 * r, 0) +
                                       at(i)) = PackBf16(sacc[r][i], sacc[r][i + 1]);
    }
    if constexpr (kNormalizer) n_prev[tid] = n_reg;
    wgmma::FenceSharedForAsync();
    // Past this barrier every warp is done with chunk − 1, so the next
    // chunk's copies may go to its stage.
    __syncthreads();
    if (chunk + 1 < num_chunks) issue(chunk + 1, st ^ 1);

    // 2. Every warp scans the chunk's per-token scalars itself: lane l holds
    //    rows 2l and 2l + 1, and at(x, even, odd) reads row x's from its lane.
    const auto at = [&](int x, float even, float odd) {
      const float e = __shfl_sync(kAll, even, x / 2), o = __shfl_sync(kAll, odd, x / 2);
      return x % 2 ? o : e;
    };
    const auto gate = [&](const LogGate& gt, TokenRow row, int i) {
      if (gt.ptr == nullptr || i >= lc || (gt.shift && t0 + dir * i + 1 >= len)) return 0.0f;
      const float x = rows[row * C + i];
      return gt.fn == GateFn::kLogSigmoid ? LogSigmoid(x) : x;
    };
    const int i0 = 2 * lane, i1 = i0 + 1;
    const float x1 = gate(p.left, kDecayRow, i1);
    float b1 = gate(p.left, kDecayRow, i0) + x1;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const float y = __shfl_up_sync(kAll, b1, off);
      if (lane >= off) b1 += y;
    }
    const float b0 = b1 - x1;
    const float b_last = __shfl_sync(kAll, b1, 31);
    // Row terms x = b − m, column terms y = b − lw (∞ past the chunk: k' is 0
    // there and the factor must be too), and m.
    float lw0 = 0.0f, lw1 = 0.0f, m0 = 0.0f, m1 = 0.0f;
    if constexpr (kGated) {
      lw0 = gate(p.key_weight, kKeyWeightRow, i0);
      lw1 = gate(p.key_weight, kKeyWeightRow, i1);
      if (stabilize) {
        const float y0 = i0 < lc ? lw0 - b0 : -INFINITY;
        const float y1 = fmaxf(y0, i1 < lc ? lw1 - b1 : -INFINITY);
        float run = y1;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
          const float z = __shfl_up_sync(kAll, run, off);  // every lane shuffles
          if (lane >= off) run = fmaxf(run, z);
        }
        float before = __shfl_up_sync(kAll, run, 1);
        before = fmaxf(lane == 0 ? -INFINITY : before, m_prev);
        m0 = b0 + fmaxf(before, y0);
        m1 = b1 + fmaxf(before, y1);
      }
    }
    const float m_last = __shfl_sync(kAll, m1, 31), mp = stabilize ? m_prev : 0.0f;
    const float xr0 = b0 - m0, xr1 = b1 - m1;
    const float yc0 = i0 < lc ? b0 - lw0 : INFINITY, yc1 = i1 < lc ? b1 - lw1 : INFINITY;
    const float w0 = i0 < lc ? p.k_scale * __expf(b_last - b0 + lw0 - m_last) : 0.0f;
    const float w1 = i1 < lc ? p.k_scale * __expf(b_last - b1 + lw1 - m_last) : 0.0f;
    const float decay = __expf(b_last + mp - m_last);
    if (stabilize) m_prev = m_last;
    if constexpr (kExtra) {
      // The extra row entering the chunk, from the previous chunk's parts
      // (which the first barrier made visible); read past the second.
      if (tid < kTileV) {
        extra_reg += extra_parts[tid] + extra_parts[kTileV + tid];
        extra_row[tid] = extra_reg;
        extra_reg *= decay;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int i = 0; i < 32; ++i) sacc[r][i] *= decay;
    wgmma::Pin(sacc[0]);
    wgmma::Pin(sacc[1]);

    // A norm's q'ᵀ n_prev: rows row0 and row0 + 8, keys 32·t4.. of each
    // (before the products, when fewer registers are live).
    [[maybe_unused]] float qn[2] = {0.0f, 0.0f};
    if constexpr (kNormalizer) {
      if (norm) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
#pragma unroll
          for (int c8 = 0; c8 < 4; ++c8) {
            const int key = 32 * t4 + 8 * c8;
            const uint4 raw = *reinterpret_cast<const uint4*>(
                base + Layout::kQ + wgmma::Swizzled(C, 16 * warp + g + 8 * half, key));
            const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
            for (int w = 0; w < 4; ++w) {
              __nv_bfloat162 pair;
              memcpy(&pair, &words[w], 4);
              const float2 qv = __bfloat1622float2(pair);
              qn[half] += qv.x * n_prev[key + 2 * w] + qv.y * n_prev[key + 2 * w + 1];
            }
          }
          qn[half] += __shfl_xor_sync(kAll, qn[half], 1);
          qn[half] += __shfl_xor_sync(kAll, qn[half], 2);
        }
        wgmma::Pin(qn);  // formed here, not sunk to its use among the products
      }
    }

    // 3. Q Kᵀ and Q S on the tensor cores (unconditionally: a branch between
    //    the issues would make the compiler serialize them).
    // The stage's operands as descriptors, formed once a chunk; each product
    // advances them by a constant.
    const uint64_t q_kmajor = wgmma::Here(wgmma::SwizzledKMajor(base + Layout::kQ));
    const uint64_t k_kmajor = wgmma::Here(wgmma::SwizzledKMajor(base + Layout::kK));
    const uint64_t k_mnmajor = wgmma::Here(wgmma::SwizzledMnMajor(base + Layout::kK, C));
    const uint64_t v_mnmajor = wgmma::Here(wgmma::SwizzledMnMajor(base + Layout::kV, C));
    const uint64_t s_mnmajor = wgmma::Here(wgmma::SwizzledMnMajor(smem + Layout::kS, kKeys));
    const uint64_t vhat_mnmajor = wgmma::Here(wgmma::SwizzledMnMajor(smem + Layout::kVhat, C));
    float acc_a[32], acc_o[32];
    wgmma::Fence();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const int col = wgmma::Swizzled(C, 0, 16 * kk);
      const uint64_t qd = wgmma::Advance(q_kmajor, col);
      wgmma::MmaShared<0, 0>(acc_a, qd, wgmma::Advance(k_kmajor, col), kk > 0);
      wgmma::MmaShared<0, 1>(acc_o, qd,
                             wgmma::Advance(s_mnmajor, wgmma::Swizzled(kKeys, 16 * kk, 0)), kk > 0);
    }
    wgmma::Commit();

    // 4. V̂ = diag(w) V in a tile of its own (V feeds A V): warp w its rows
    //    16w.., 16 bytes (8 columns of a row) a piece.
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int piece = 16 * 8 * warp + lane + 32 * u;
      const float w = at(piece / 8, w0, w1);
      uint4 x = *reinterpret_cast<const uint4*>(base + Layout::kV + 16 * piece);
      x.x = Scale2(x.x, w, w), x.y = Scale2(x.y, w, w);
      x.z = Scale2(x.z, w, w), x.w = Scale2(x.w, w, w);
      *reinterpret_cast<uint4*>(smem + Layout::kVhat + 16 * piece) = x;
    }
    wgmma::FenceSharedForAsync();

    // 5. A's factors, qk_scale·e^{x_i − y_j} where j ≤ i (else e^{−∞} = 0, no
    //    branch), for n-tile nb of the accumulator (its entries 4nb + e), and
    //    the rows' weights, while Q Kᵀ runs. The normalizer's instance forms
    //    the factors after the wait instead: it has no registers to hold them.
    const int row0 = 16 * warp + g;  // this thread's rows: row0 and row0 + 8
    const float xr_r0 = at(row0, xr0, xr1), xr_r8 = at(row0 + 8, xr0, xr1);
    const auto factors_of = [&](int nb, float(&f)[4]) {
      const int j = 8 * nb + 2 * t4;
      const float yj0 = __shfl_sync(kAll, yc0, 4 * nb + t4);
      const float yj1 = __shfl_sync(kAll, yc1, 4 * nb + t4);
      f[0] = qk_scale * __expf(j <= row0 ? xr_r0 - yj0 : -INFINITY);
      f[1] = qk_scale * __expf(j + 1 <= row0 ? xr_r0 - yj1 : -INFINITY);
      f[2] = qk_scale * __expf(j <= row0 + 8 ? xr_r8 - yj0 : -INFINITY);
      f[3] = qk_scale * __expf(j + 1 <= row0 + 8 ? xr_r8 - yj1 : -INFINITY);
    };
    float factor[8][4];
    if constexpr (kEarlyFactors) {
#pragma unroll
      for (int nb = 0; nb < 8; ++nb) factors_of(nb, factor[nb]);
    }
    // q_scale·e^{b_i + m_prev − m_i}: Q S's row weights.
    const float coef0 = __expf(b0 + mp - m0), coef1 = __expf(b1 + mp - m1);
    const float rs0 = p.q_scale * at(row0, coef0, coef1);
    const float rs8 = p.q_scale * at(row0 + 8, coef0, coef1);
    // The rows' output scales: a row weight e^{r_i + m_i}, and a norm's
    // 1/den later, whose floor is e^{−m_i} (exp) or 1. The normalizer's
    // instance forms them here (pinned: registers are scarce later), the
    // others after the products are issued.
    float out_scale[2] = {1.0f, 1.0f};
    [[maybe_unused]] float den_floor[2] = {1.0f, 1.0f};
    const auto row_scales = [&] {
      if constexpr (kGated) {
        const float ms0 = at(row0, m0, m1), ms8 = at(row0 + 8, m0, m1);
        if (p.row_weight.ptr) {
          const float rw0 = gate(p.row_weight, kRowWeightRow, i0);
          const float rw1 = gate(p.row_weight, kRowWeightRow, i1);
          out_scale[0] = __expf(at(row0, rw0, rw1) + ms0);
          out_scale[1] = __expf(at(row0 + 8, rw0, rw1) + ms8);
        }
        if (p.norm == NormKind::kMlstmExp) den_floor[0] = __expf(-ms0), den_floor[1] = __expf(-ms8);
      }
    };
    if constexpr (kNormalizer) {
      row_scales();
      wgmma::Pin(out_scale);
      wgmma::Pin(den_floor);
    }
    wgmma::Wait<0>();
    wgmma::Pin(acc_a);
    wgmma::Pin(acc_o);
    // Past this barrier V̂ and the extra row are whole, and no warp reads
    // this chunk's S copy or q tile any more (the next chunk rewrites S
    // before its first barrier).
    __syncthreads();

    // 6. S += Kᵀ V̂ (Kᵀ: k's tile read MN-major, keys as M); meanwhile A,
    //    masked and weighted, becomes the bf16 A fragments of A V (n-tile nb
    //    of the accumulator is half of k-step nb / 2), and Q S's rows are
    //    weighted; then O += A V.
    wgmma::Fence();
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int kk = 0; kk < C / 16; ++kk)
        wgmma::MmaShared<1, 1>(sacc[r],
                               wgmma::Advance(k_mnmajor, wgmma::Swizzled(C, 16 * kk, 64 * r)),
                               wgmma::Advance(vhat_mnmajor, wgmma::Swizzled(C, 16 * kk, 0)), true);
    wgmma::Commit();
    uint32_t afrag[4][4];
    float row_sum[2] = {0.0f, 0.0f};  // a norm's in-chunk share of q'ᵀn
    // The extra feature of q' in rows row0 and row0 + 8 (1 where not given).
    [[maybe_unused]] float q_extra[2] = {1.0f, 1.0f};
    if constexpr (kExtra) {
      if (p.extra_q)
        q_extra[0] = rows[kExtraQRow * C + row0], q_extra[1] = rows[kExtraQRow * C + row0 + 8];
    }
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
      float f[4];
      if constexpr (kEarlyFactors) {
        f[0] = factor[nb][0], f[1] = factor[nb][1], f[2] = factor[nb][2], f[3] = factor[nb][3];
      } else {
        factors_of(nb, f);
      }
      if constexpr (kExtra) {
        // q'_i·k'_j gains extra_q[i]·extra_k[j].
        const float2 ek =
            p.extra_k ? *reinterpret_cast<const float2*>(rows + kExtraKRow * C + 8 * nb + 2 * t4)
                      : make_float2(1.0f, 1.0f);
        acc_a[4 * nb] += q_extra[0] * ek.x, acc_a[4 * nb + 1] += q_extra[0] * ek.y;
        acc_a[4 * nb + 2] += q_extra[1] * ek.x, acc_a[4 * nb + 3] += q_extra[1] * ek.y;
      }
      const float v0 = acc_a[4 * nb] * f[0], v1 = acc_a[4 * nb + 1] * f[1];
      const float v2 = acc_a[4 * nb + 2] * f[2], v3 = acc_a[4 * nb + 3] * f[3];
      if constexpr (kNormalizer) row_sum[0] += v0 + v1, row_sum[1] += v2 + v3;
      afrag[nb / 2][nb % 2 * 2] = PackBf16(v0, v1);
      afrag[nb / 2][nb % 2 * 2 + 1] = PackBf16(v2, v3);
    }
    if constexpr (kExtra) {
      // Q S gains extra_q[i] times S's extra row.
#pragma unroll
      for (int i = 0; i < 32; i += 2) {
        const float2 s = *reinterpret_cast<const float2*>(extra_row + s_col(i));
        acc_o[i] += q_extra[i / 2 % 2] * s.x, acc_o[i + 1] += q_extra[i / 2 % 2] * s.y;
      }
    }
#pragma unroll
    for (int i = 0; i < 32; ++i) acc_o[i] *= i / 2 % 2 ? rs8 : rs0;
    wgmma::Pin(acc_o);
    wgmma::Fence();
#pragma unroll
    for (int kk = 0; kk < C / 16; ++kk)
      wgmma::MmaRegisterA<1>(acc_o, afrag[kk],
                             wgmma::Advance(v_mnmajor, wgmma::Swizzled(C, 16 * kk, 0)), true);
    wgmma::Commit();

    // 7. While the products run: the rows' output scales (with a norm's
    //    1/den), and the extra row's addition, Σ_j extra_k[j] V̂_j, in two
    //    halves of the chunk's tokens.
    if constexpr (kExtra) {
      // The dot_with rows of this warp's outputs, into the q tile's second
      // block of 64 keys (its first stages the outputs), 16 bytes a piece.
      if (p.row_dots) {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int r = 16 * warp + (lane + 32 * u) / 8, col = 8 * (lane % 8);
          const bool live = r < lc;
          const int64_t off = live ? ((bos + t0 + dir * r) * p.heads + h) * p.dv + e0 + col : 0;
          CpAsync16(base + Layout::kQ + wgmma::Swizzled(C, r, kTileV + col),
                    static_cast<const bf16*>(p.dot_with.ptr) + off, live);
        }
        CpAsyncCommit();
      }
    }
    if constexpr (!kNormalizer) row_scales();
    if constexpr (kExtra) {
      // Column col of row j lies at j·128 + (col/8 ⊕ j % 8)·16 + (col % 8)·2
      // (opaque here, as S's stores above).
      const int col = wgmma::Here(tid % kTileV), half = tid / kTileV;
      const unsigned char* column = smem + Layout::kVhat + (col % 8) * 2;
      float add = 0.0f;
#pragma unroll 8
      for (int j = half * C / 2; j < (half + 1) * C / 2; ++j) {
        const float ek = p.extra_k ? rows[kExtraKRow * C + j] : 1.0f;
        add += ek * __bfloat162float(*reinterpret_cast<const bf16*>(column + j * 128 +
                                                                    ((col / 8) ^ (j % 8)) * 16));
      }
      extra_parts[tid] = add;
    }
    if constexpr (kNormalizer) {
      if (norm) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = row0 + 8 * half;
          float s = row_sum[half];
          s += __shfl_xor_sync(kAll, s, 1);
          s += __shfl_xor_sync(kAll, s, 2);
          const float dot = s + (half ? rs8 : rs0) * qn[half];
          out_scale[half] *= 1.0f / (fmaxf(fabsf(dot), den_floor[half]) + p.eps);
          if (p.norm_dot && blockIdx.x == 0 && t4 == 0 && i < lc)
            p.norm_dot[(bos + t0 + dir * i) * p.heads + h] = dot;
        }
      }
    }
    wgmma::Wait<0>();
    wgmma::Pin(acc_o);
    wgmma::Pin(sacc[0]);
    wgmma::Pin(sacc[1]);
#pragma unroll
    for (int i = 0; i < 32; ++i) acc_o[i] *= out_scale[i / 2 % 2];
    if constexpr (kExtra) {
      // Each output row's dot with its dot_with row, in fp32 before the
      // rounding; the value tiles' parts add in row_dots.
      if (p.row_dots) {
        CpAsyncWait<0>();
        __syncwarp();
        float dot[2] = {0.0f, 0.0f};
        const PairOffsets at = PairOffsets::Here(warp, lane);
#pragma unroll
        for (int i = 0; i < 32; i += 2) {
          __nv_bfloat162 pair;
          memcpy(&pair, base + Layout::kQ + wgmma::Swizzled(C, 0, kTileV) + at(i), 4);
          const float2 d = __bfloat1622float2(pair);
          dot[i / 2 % 2] += acc_o[i] * d.x + acc_o[i + 1] * d.y;
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float d = dot[half];
          d += __shfl_xor_sync(kAll, d, 1);
          d += __shfl_xor_sync(kAll, d, 2);
          const int r = row0 + 8 * half;
          if (t4 == 0 && r < lc)
            atomicAdd(p.row_dots + seq * p.row_dots_seq_stride +
                          static_cast<int64_t>(t0 + dir * r) * p.heads + h,
                      d);
        }
      }
    }
    if constexpr (kNormalizer) {
      // n's update (key tid: Σ_j w_j k_j), after the products: fewer
      // registers are live.
      float n_add = 0.0f;
#pragma unroll 4
      for (int j = 0; j < C; ++j)
        n_add += at(j, w0, w1) * __bfloat162float(*reinterpret_cast<const bf16*>(
                                     base + Layout::kK + wgmma::Swizzled(C, j, tid)));
      n_reg = n_reg * decay + n_add;
    }
    // 8. The outputs of the chunk's live rows. 16-bit ones: each warp stages
    //    its 16 rows in this stage's q tile (its own rows, which its part of
    //    Q Kᵀ has read; free until the copies of chunk + 2, issued past the
    //    next chunk's barrier) and copies them out by rows.
    if (stage_out) {
      void* staged = base + Layout::kQ;
      const PairOffsets at = PairOffsets::Here(warp, lane);
#pragma unroll
      for (int i = 0; i < 32; i += 2)
        StorePair(staged, p.o_type, at(i) / 2, acc_o[i], acc_o[i + 1]);
      __syncwarp();
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int r = 16 * warp + (lane + 32 * u) / 8, col = 8 * (lane % 8);
        if (r < lc)
          *reinterpret_cast<uint4*>(static_cast<bf16*>(p.o) +
                                    ((bos + t0 + dir * r) * p.heads + h) * p.dv + e0 + col) =
              *reinterpret_cast<const uint4*>(base + Layout::kQ + wgmma::Swizzled(C, r, col));
      }
    } else {
#pragma unroll
      for (int i = 0; i < 32; i += 2) {
        const int r = row0 + 8 * (i / 2 % 2);
        if (r < lc)
          StorePair(p.o, p.o_type, ((bos + t0 + dir * r) * p.heads + h) * p.dv + e0 + s_col(i),
                    acc_o[i], acc_o[i + 1]);
      }
    }
  }

  if (p.s_final.ptr) {
    const int slot = p.s_final.slot ? p.s_final.slot[seq] : seq;
    float* base = p.s_final.ptr + slot * p.s_final.slot_stride + head_off;
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int i = 0; i < 32; ++i)
        base[static_cast<int64_t>(s_row(r, i)) * p.s_final.stride_a +
             static_cast<int64_t>(e0 + s_col(i)) * p.s_final.stride_b] = sacc[r][i];
    if (blockIdx.x == 0) {
      const int64_t at = static_cast<int64_t>(slot) * p.heads + h;
      if constexpr (kNormalizer) {
        if (p.n_final) p.n_final[at * kKeys + tid] = n_reg;
      }
      if (stabilize && p.m_final && tid == 0) p.m_final[at] = m_prev;
    }
  }
#else
  (void)p;  // the host pass: the device code is built for sm_90a alone
#endif
}

// Whether the scan carries mLSTM's normalizer n (a norm, or n in or out).
bool CarriesNormalizer(const ScanParams& p) {
  return p.norm != NormKind::kNone || p.n_init || p.n_final;
}

bool Bf16Aligned(const Operand& op) {
  return op.type == ElemType::kBF16 && reinterpret_cast<uintptr_t>(op.ptr) % 16 == 0;
}

template <Fields kFields>
cudaError_t LaunchInstance(const ScanParams& p, cudaStream_t stream) {
  auto* kernel = ScanWgmmaKernel<kFields>;
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Layout::kBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(p.dv / kTileV, p.heads, p.num_seqs);
  kernel<<<grid, kThreads, Layout::kBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

bool ScanWgmmaSupports(const ScanParams& p) {
  const bool extra_ok = !p.extra_key || !CarriesNormalizer(p);
  const bool dots_ok = p.row_dots == nullptr || (p.extra_key && Bf16Aligned(p.dot_with));
  return Bf16Aligned(p.q) && Bf16Aligned(p.k) && Bf16Aligned(p.v) && p.dk == kKeys && p.dv > 0 &&
         p.dv % kTileV == 0 && !p.left_vector && p.right.ptr == nullptr && extra_ok && dots_ok &&
         p.heads % p.v_head_share == 0;
}

bool WgmmaAvailable() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (major != 9 || minor != 0) return false;
  cudaFuncAttributes attributes;
  if (cudaFuncGetAttributes(&attributes, ScanWgmmaKernel<Fields::kPlain>) != cudaSuccess) {
    cudaGetLastError();  // no image for this device: not an error of the launch to come
    return false;
  }
  return true;
}

cudaError_t LaunchScanWgmma(const ScanParams& p, cudaStream_t stream) {
  const bool gated = p.key_weight.ptr || p.row_weight.ptr || p.stabilize;
  if (p.extra_key) return LaunchInstance<Fields::kExtraKey>(p, stream);
  if (CarriesNormalizer(p)) return LaunchInstance<Fields::kNormalizer>(p, stream);
  if (gated) return LaunchInstance<Fields::kGated>(p, stream);
  return LaunchInstance<Fields::kPlain>(p, stream);
}

}  // namespace lair::kernels::cuda
