// The generic chunked scan of scan.h: one CTA per (sequence, head, dv tile),
// chunks of C = 32 tokens in iteration order, fp32 state tile in shared memory.
//
// Per chunk, with b = inclusive cumsum of the left log-decay, c = of the right,
// and reference points b_r, c_r at the middle row (keeps the rescaled operands
// within fp32 range for per-step log-decays down to about −5):
//   vector left:  q̂_i = q_i ⊙ e^{b_i − b_r},  k̂_j = k_j ⊙ e^{b_r − b_j},  A_ij = q̂_i·k̂_j
//   scalar left:  A_ij = (q_i·k_j) · e^{b_i − b_j + lw_j − m_i}     (exact, ≤ 1 factors)
//   v̂_j = v_j ⊙ e^{c_r − c_j}
//   o_i = e^{c_i − c_r} ⊙ Σ_{j≤i} A_ij v̂_j  +  e^{c_i} ⊙ (q_i ⊙ e^{b_i})ᵀ S      (intra + inter)
//   S  ← diag(e^{b_C}) S diag(e^{c_C}) + Σ_j (k_j ⊙ e^{b_C − b_j})(v_j ⊙ e^{c_C − c_j})ᵀ
// The mLSTM stabilizer m_i = b_i + max(m_prev, max_{j≤i}(lw_j − b_j)) keeps every
// scalar-mode exponent ≤ 0; the state is stored divided by e^{m}.
#include <algorithm>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/scan.h"
#include "kernels/cuda/scan_mma.h"

namespace lair::kernels::cuda {
namespace {

// Tile sizes and the shared-memory plan of one CTA.
struct ScanTraits {
  static constexpr int kChunk = 32;  // C, tokens per chunk
  static constexpr int kTileV = 64;  // dv columns per CTA
  static constexpr int kThreads = 256;
  static constexpr int kMaxDk = 256;
  static constexpr int kTileVP = kTileV + 1;  // padded row (bank conflicts)
  static constexpr int kChunkP = kChunk + 1;
  static constexpr int kRowsA = kChunk * kChunk / kThreads;  // A entries per thread
  static constexpr int kRowsO = kChunk * kTileV / kThreads;  // o entries per thread
  static constexpr int kRowsS = kMaxDk * kTileV / kThreads;  // S entries per thread (max)
  static_assert(kThreads == 8 * kChunk, "A phase maps one warp lane per column j");
  static_assert(kThreads % kTileV == 0, "o and S phases map threads to dv columns");

  // Floats of dynamic shared memory for key dim dk.
  static constexpr int Floats(int dk, bool left_vector) {
    const int dkp = dk + 1;
    return 2 * kChunk * dkp + (left_vector ? kChunk * dkp : kChunk) + 2 * kChunk * kTileVP +
           kChunk * kChunkP + dk * kTileV + 5 * dk + 3 * kTileV + 6 * kChunk;
  }
};
static_assert(ScanTraits::Floats(ScanTraits::kMaxDk, true) * 4 <= 227 * 1024,
              "scan tile exceeds Hopper shared memory");

template <bool kLeftVector>
__global__ void __launch_bounds__(ScanTraits::kThreads) ScanKernel(const ScanParams p) {
  using T = ScanTraits;
  constexpr int C = T::kChunk;
  constexpr int TV = T::kTileV;
  constexpr int TVP = T::kTileVP;
  extern __shared__ float smem[];

  const int tid = threadIdx.x;
  const int h = blockIdx.y, seq = blockIdx.z;
  const int e0 = blockIdx.x * TV;
  const int tv = min(TV, p.dv - e0);
  const int64_t bos = p.cu_seqlens[seq];
  const int len = p.cu_seqlens[seq + 1] - static_cast<int>(bos);
  const int dk = p.dk, dkp = dk + 1;
  const bool has_right = p.right.ptr != nullptr;
  // The normalizer n: carried where a norm reads it or n_final wants it.
  const bool carry_n = p.n_final != nullptr || p.norm != NormKind::kNone;

  float* qs = smem;                              // [C][dkp]  q̂
  float* ks = qs + C * dkp;                      // [C][dkp]  k̂
  float* bl = ks + C * dkp;                      // [C][dkp] vector, [C] scalar: b
  float* vs = bl + (kLeftVector ? C * dkp : C);  // [C][TVP]  v̂
  float* cr = vs + C * TVP;                      // [C][TVP]  c
  float* A = cr + C * TVP;                       // [C][C+1]
  float* S = A + C * T::kChunkP;                 // [dk][TV]
  float* eb = S + dk * TV;                       // [dk] e^{b_r}
  float* kf = eb + dk;                           // [dk] e^{b_C − b_r}
  float* sdec = kf + dk;                         // [dk] e^{b_C}
  float* bref = sdec + dk;                       // [dk] b_r
  float* nn = bref + dk;                         // [dk] normalizer n
  float* cref = nn + dk;                         // [TV] c_r
  float* vf = cref + TV;                         // [TV] e^{c_C − c_r}
  float* ecc = vf + TV;                          // [TV] e^{c_C}
  float* lws = ecc + TV;                         // [C] lw (scalar mode)
  float* ms = lws + C;                           // [C] m_i
  float* coef = ms + C;                          // [C] e^{b_i + m_prev − m_i}
  float* wj = coef + C;                          // [C] e^{b_C − b_j + lw_j − m_C}
  float* den = wj + C;                           // [C] q'ᵀn
  float* bsc = den + C;                          // [C] scalar cumsum b

  // Initial state tile (zero when absent).
  const int64_t head_off = static_cast<int64_t>(h) * dk * p.dv;
  {
    const int slot = p.s_init.slot ? p.s_init.slot[seq] : seq;
    const float* base =
        p.s_init.ptr ? p.s_init.ptr + slot * p.s_init.slot_stride + head_off : nullptr;
    for (int idx = tid; idx < dk * TV; idx += T::kThreads) {
      const int a = idx / TV, e = idx % TV;
      S[idx] = (base && e < tv) ? base[static_cast<int64_t>(a) * p.s_init.stride_a +
                                       static_cast<int64_t>(e0 + e) * p.s_init.stride_b]
                                : 0.0f;
    }
    if (carry_n) {
      for (int a = tid; a < dk; a += T::kThreads)
        nn[a] = p.n_init ? p.n_init[(static_cast<int64_t>(slot) * p.heads + h) * dk + a] : 0.0f;
    }
  }
  float m_prev = 0.0f;
  if (p.stabilize && p.m_init) {
    const int slot = p.s_init.slot ? p.s_init.slot[seq] : seq;
    m_prev = p.m_init[static_cast<int64_t>(slot) * p.heads + h];
  }

  const int num_chunks = (len + C - 1) / C;
  for (int chunk = 0; chunk < num_chunks; ++chunk) {
    const int c0 = chunk * C;
    const int lc = min(C, len - c0);
    auto token = [&](int i) { return p.reverse ? len - 1 - (c0 + i) : c0 + i; };

    // 1. Load q', k' (scaled), v' tile and the gates; rows past lc are zero.
    for (int idx = tid; idx < C * dk; idx += T::kThreads) {
      const int i = idx / dk, a = idx % dk;
      float qv = 0.0f, kv = 0.0f, lg = 0.0f;
      if (i < lc) {
        const int t = token(i);
        const int64_t off = ((bos + t) * p.heads + h) * dk + a;
        qv = LoadElem(p.q.ptr, p.q.type, off) * p.q_scale;
        kv = LoadElem(p.k.ptr, p.k.type, off) * p.k_scale;
        if constexpr (kLeftVector) lg = GateAt(p.left, bos, len, t, h, a);
      }
      qs[i * dkp + a] = qv;
      ks[i * dkp + a] = kv;
      if constexpr (kLeftVector) bl[i * dkp + a] = lg;
    }
    for (int idx = tid; idx < C * TV; idx += T::kThreads) {
      const int i = idx / TV, e = idx % TV;
      float vv = 0.0f, lg = 0.0f;
      if (i < lc && e < tv) {
        const int t = token(i);
        vv =
            LoadElem(p.v.ptr, p.v.type,
                     ((bos + t) * (p.heads / p.v_head_share) + h / p.v_head_share) * p.dv + e0 + e);
        if (has_right) lg = GateAt(p.right, bos, len, t, h / p.v_head_share, e0 + e);
      }
      vs[i * TVP + e] = vv;
      cr[i * TVP + e] = lg;
    }
    if constexpr (!kLeftVector) {
      for (int i = tid; i < C; i += T::kThreads) {
        const bool live = i < lc;
        bl[i] = live ? GateAt(p.left, bos, len, token(i), h, 0) : 0.0f;
        lws[i] = (live && p.key_weight.ptr) ? GateAt(p.key_weight, bos, len, token(i), h, 0) : 0.0f;
      }
    }
    __syncthreads();

    // 2. Chunk-local inclusive cumsums and the per-row / per-column factors.
    const int mid = (lc - 1) / 2, last = lc - 1;
    if constexpr (kLeftVector) {
      for (int a = tid; a < dk; a += T::kThreads) {
        float run = 0.0f;
        for (int i = 0; i < C; ++i) {
          run += bl[i * dkp + a];
          bl[i * dkp + a] = run;
        }
        const float br = bl[mid * dkp + a], bc = bl[last * dkp + a];
        bref[a] = br;
        eb[a] = expf(br);
        kf[a] = expf(bc - br);
        sdec[a] = expf(bc);
      }
    } else if (tid == T::kThreads - 1) {
      // Scalar left decay: b, the stabilizer m and the exact ≤ 1 coefficients.
      float run = 0.0f, mx = m_prev;
      for (int i = 0; i < C; ++i) {
        run += bl[i];
        bsc[i] = run;
        if (p.stabilize) {
          if (i < lc) mx = fmaxf(mx, lws[i] - run);
          ms[i] = run + mx;
        } else {
          ms[i] = 0.0f;
        }
      }
      const float mp = p.stabilize ? m_prev : 0.0f;
      for (int i = 0; i < C; ++i) {
        coef[i] = expf(bsc[i] + mp - ms[i]);
        wj[i] = i < lc ? expf(bsc[last] - bsc[i] + lws[i] - ms[last]) : 0.0f;
      }
    }
    if (has_right) {
      for (int e = tid; e < TV; e += T::kThreads) {
        float run = 0.0f;
        for (int i = 0; i < C; ++i) {
          run += cr[i * TVP + e];
          cr[i * TVP + e] = run;
        }
        const float r = cr[mid * TVP + e], cc = cr[last * TVP + e];
        cref[e] = r;
        vf[e] = expf(cc - r);
        ecc[e] = expf(cc);
      }
    }
    __syncthreads();

    // 3. Rescale about the reference rows.
    if constexpr (kLeftVector) {
      for (int idx = tid; idx < C * dk; idx += T::kThreads) {
        const int i = idx / dk, a = idx % dk;
        const float d = bl[i * dkp + a] - bref[a];
        qs[i * dkp + a] *= expf(d);
        ks[i * dkp + a] *= expf(-d);
      }
    }
    if (has_right) {
      for (int idx = tid; idx < C * TV; idx += T::kThreads) {
        const int i = idx / TV, e = idx % TV;
        vs[i * TVP + e] *= expf(cref[e] - cr[i * TVP + e]);
      }
    }
    __syncthreads();

    // 4. A = (q̂ k̂ᵀ) ⊙ decay ⊙ causal mask. Lane j, rows i = warp + 8r.
    {
      const int j = tid % 32, w = tid / 32;
      float acc[T::kRowsA] = {};
      for (int a = 0; a < dk; ++a) {
        const float kv = ks[j * dkp + a];
#pragma unroll
        for (int r = 0; r < T::kRowsA; ++r) acc[r] += qs[(w + 8 * r) * dkp + a] * kv;
      }
#pragma unroll
      for (int r = 0; r < T::kRowsA; ++r) {
        const int i = w + 8 * r;
        float val = 0.0f;
        if (j <= i) {
          val = acc[r];
          if constexpr (!kLeftVector) val *= expf(bsc[i] - bsc[j] + lws[j] - ms[i]);
        }
        A[i * T::kChunkP + j] = val;
      }
    }
    __syncthreads();

    // 4b. Normalizer q'ᵀn_i = Σ_{j≤i} A_ij + coef_i · q_iᵀ n_prev (scalar mode).
    if constexpr (!kLeftVector) {
      if (p.norm != NormKind::kNone && tid < C) {
        const int i = tid;
        float intra = 0.0f, inter = 0.0f;
        for (int j = 0; j <= i; ++j) intra += A[i * T::kChunkP + j];
        for (int a = 0; a < dk; ++a) inter += qs[i * dkp + a] * nn[a];
        den[i] = intra + coef[i] * inter;
        if (p.norm_dot && blockIdx.x == 0 && i < lc)
          p.norm_dot[(bos + token(i)) * p.heads + h] = den[i];
      }
      __syncthreads();
    }

    // 5. Output rows i = tid/TV + 4r, column e = tid % TV.
    {
      const int e = tid % TV, i0 = tid / TV;
      constexpr int kStep = T::kThreads / TV;
      float intra[T::kRowsO] = {}, inter[T::kRowsO] = {};
      for (int j = 0; j < lc; ++j) {
        const float vv = vs[j * TVP + e];
#pragma unroll
        for (int r = 0; r < T::kRowsO; ++r) intra[r] += A[(i0 + kStep * r) * T::kChunkP + j] * vv;
      }
      for (int a = 0; a < dk; ++a) {
        float sv = S[a * TV + e];
        if constexpr (kLeftVector) sv *= eb[a];
#pragma unroll
        for (int r = 0; r < T::kRowsO; ++r) inter[r] += qs[(i0 + kStep * r) * dkp + a] * sv;
      }
#pragma unroll
      for (int r = 0; r < T::kRowsO; ++r) {
        const int i = i0 + kStep * r;
        if (i >= lc || e >= tv) continue;
        float x = intra[r], y = inter[r];
        if constexpr (!kLeftVector) y *= coef[i];
        if (has_right) {
          x *= expf(cr[i * TVP + e] - cref[e]);
          y *= expf(cr[i * TVP + e]);
        }
        float o = x + y;
        if constexpr (!kLeftVector) {
          if (p.norm == NormKind::kMlstmExp) {
            o /= fmaxf(fabsf(den[i]), expf(-ms[i])) + p.eps;
          } else if (p.norm == NormKind::kSigNorm) {
            o /= fmaxf(fabsf(den[i]), 1.0f) + p.eps;
          }
        }
        const int64_t at = ((bos + token(i)) * p.heads + h) * p.dv + e0 + e;
        StoreElem(p.o, p.o_type, at, o);
      }
    }
    __syncthreads();

    // 6. State update: column e, rows a = tid/TV + 4r.
    {
      const int e = tid % TV, a0 = tid / TV;
      constexpr int kStep = T::kThreads / TV;
      const int rows = dk / kStep;
      float acc[T::kRowsS] = {};
      for (int j = 0; j < lc; ++j) {
        float vv = vs[j * TVP + e];
        if constexpr (!kLeftVector) vv *= wj[j];
#pragma unroll
        for (int r = 0; r < T::kRowsS; ++r)
          if (r < rows) acc[r] += ks[j * dkp + a0 + kStep * r] * vv;
      }
      const float col_decay = has_right ? ecc[e] : 1.0f;
      const float col_scale = has_right ? vf[e] : 1.0f;
#pragma unroll
      for (int r = 0; r < T::kRowsS; ++r) {
        if (r >= rows) continue;
        const int a = a0 + kStep * r;
        const float row_decay = kLeftVector ? sdec[a] : coef[last];
        const float row_scale = kLeftVector ? kf[a] : 1.0f;
        S[a * TV + e] = S[a * TV + e] * row_decay * col_decay + acc[r] * row_scale * col_scale;
      }
      if constexpr (!kLeftVector) {
        if (carry_n && tid < dk) {
          float add = 0.0f;
          for (int j = 0; j < lc; ++j) add += ks[j * dkp + tid] * wj[j];
          nn[tid] = nn[tid] * coef[last] + add;
        }
      }
    }
    if (p.stabilize) m_prev = ms[last];
    __syncthreads();
  }

  // Final state tile back to its slot.
  if (p.s_final.ptr) {
    const int slot = p.s_final.slot ? p.s_final.slot[seq] : seq;
    float* base = p.s_final.ptr + slot * p.s_final.slot_stride + head_off;
    for (int idx = tid; idx < dk * TV; idx += T::kThreads) {
      const int a = idx / TV, e = idx % TV;
      if (e < tv)
        base[static_cast<int64_t>(a) * p.s_final.stride_a +
             static_cast<int64_t>(e0 + e) * p.s_final.stride_b] = S[idx];
    }
    if (blockIdx.x == 0) {
      if (p.n_final)
        for (int a = tid; a < dk; a += T::kThreads)
          p.n_final[(static_cast<int64_t>(slot) * p.heads + h) * dk + a] = nn[a];
      if (p.stabilize && p.m_final && tid == 0)
        p.m_final[static_cast<int64_t>(slot) * p.heads + h] = m_prev;
    }
  }
}

template <bool kLeftVector>
cudaError_t LaunchScanInstance(const ScanParams& p, cudaStream_t stream) {
  const size_t bytes = ScanTraits::Floats(p.dk, kLeftVector) * sizeof(float);
  cudaError_t err =
      cudaFuncSetAttribute(ScanKernel<kLeftVector>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes));
  if (err != cudaSuccess) return err;
  const dim3 grid((p.dv + ScanTraits::kTileV - 1) / ScanTraits::kTileV, p.heads, p.num_seqs);
  ScanKernel<kLeftVector><<<grid, ScanTraits::kThreads, bytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchScan(const ScanParams& p, cudaStream_t stream) {
  if (p.dk <= 0 || p.dk > ScanTraits::kMaxDk || p.dk % 4 != 0 || p.dv <= 0 ||
      (p.left_vector && (p.stabilize || p.norm != NormKind::kNone || p.key_weight.ptr))) {
    return cudaErrorInvalidValue;
  }
  if (p.num_seqs == 0) return cudaSuccess;
  if (ScanMmaSupports(p)) return LaunchScanMma(p, stream);
  // the tensor-core path's alone
  if (p.row_weight.ptr || p.extra_key) return cudaErrorInvalidValue;
  return p.left_vector ? LaunchScanInstance<true>(p, stream) : LaunchScanInstance<false>(p, stream);
}

}  // namespace lair::kernels::cuda
