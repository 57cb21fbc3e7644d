// The kernels of mixer_backward.h: the GSA softmax Jacobian, an fp32 add, and
// the mLSTM backward.
//
// mLSTM backward, chunkwise (chunks of 64 tokens), exact in the math of
// kernels/cpu/mlstm.cc but reorganised. With q' = q/√K, F_t = Σ_{j≤t} log σ(f_j),
// li the log input weight (i, or log σ(i)) and the unstabilized state
// C̃_t = Σ_{τ≤t} e^{F_t − F_τ + li_τ} k_τ v_τᵀ (+ e^{F_t + m_0} C_0), the output is
//   h_t = C̃_tᵀq' / (max(|q'·ñ_t|, 1) + eps·e^{m_t})  (sig: h = C̃ᵀq'; sig-norm: eps alone),
// so the stabilizer m enters only through eps·e^{m} and the stored final
// states C_T = e^{−m_T} C̃_T: its cotangent is explicit (no difference of the
// large terms that the step-by-step chain rule cancels). Every exponential
// below is taken relative to m, so no exponent is positive. Kernels, in order:
//   gates        b_t (log-forget sum within the chunk), m_t, m entering chunks;
//   state scan   C̃ entering every chunk (one CTA per 32 state columns);
//   scalars      den_t, dqn_t, explicit dm_t (one CTA per chunk);
//   state scan   G at every chunk end: the reverse state of q' dnumᵀ (reversed);
//   chunk grads  dq, dk, dv and q'·dq', k·dk (one CTA per chunk);
//   gate grads   df, di: reversed cumsum of q'·dq' − k·dk plus the m chain.
#include <initializer_list>
#include <utility>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/mixer_backward.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace lair::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// Whether the row kernels may walk rows of `width` elements 4 a lane (kN =
// 4): every row starts on a multiple of 4 and each array is aligned for
// the vector accesses.
bool RowsInFours(int width, std::initializer_list<std::pair<const void*, ElemType>> arrays) {
  if (width % 4 != 0) return false;
  for (const auto& [array, type] : arrays) {
    if (!Elem4Aligned(array, type)) return false;
  }
  return true;
}

// One warp per row.
__global__ void SoftmaxBackwardKernel(const float* p, float* dp, int64_t rows, int width) {
  const int lane = threadIdx.x % 32;
  for (int64_t r = WarpRow(); r < rows; r += WarpRowStride()) {
    const float* pr = p + r * width;
    float* dr = dp + r * width;
    float dot = 0.0f;
    for (int c = lane; c < width; c += 32) dot += pr[c] * dr[c];
    dot = WarpSum(dot);
    for (int c = lane; c < width; c += 32) dr[c] = pr[c] * (dr[c] - dot);
  }
}

__global__ void AddKernel(const float* a, const float* b, void* out, ElemType type, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    StoreElem(out, type, i, a[i] + b[i]);
  }
}

// --- mLSTM sigmoid kinds through the decay scans (one warp per row) -------------

// The row kernels below walk a row kN elements a lane at a time (4 where
// RowsInFours says so, else 1).
template <int kN>
__global__ void MlstmSigKeysKernel(Operand k, const float* i, const float* f, int64_t rows, int K,
                                   void* k_scaled, ElemType type, float* lf) {
  const int lane = threadIdx.x % 32;
  for (int64_t r = WarpRow(); r < rows; r += WarpRowStride()) {
    const float w = expf(LogSigmoid(i[r]));
    for (int a = kN * lane; a < K; a += 32 * kN) {
      float x[kN];
      LoadElems(k.ptr, k.type, r * K + a, x);
#pragma unroll
      for (int e = 0; e < kN; ++e) x[e] *= w;
      StoreElems(k_scaled, type, r * K + a, x);
    }
    if (lane == 0) lf[r] = LogSigmoid(f[r]);
  }
}

template <int kN>
__global__ void MlstmSigGateGradsKernel(Operand k_scaled, const float* dk_scaled, const float* i,
                                        const float* f, const float* dg, int64_t rows, int K,
                                        void* dk, ElemType dk_type, float* di, float* df) {
  const int lane = threadIdx.x % 32;
  for (int64_t r = WarpRow(); r < rows; r += WarpRowStride()) {
    const float w = expf(LogSigmoid(i[r]));
    float dot = 0.0f;
    for (int a = kN * lane; a < K; a += 32 * kN) {
      float g[kN], x[kN];
      LoadElems(dk_scaled, ElemType::kF32, r * K + a, g);
      LoadElems(k_scaled.ptr, k_scaled.type, r * K + a, x);
#pragma unroll
      for (int e = 0; e < kN; ++e) {
        dot += x[e] * g[e];
        g[e] *= w;
      }
      StoreElems(dk, dk_type, r * K + a, g);
    }
    dot = WarpSum(dot);
    if (lane == 0) {
      di[r] = dot * expf(LogSigmoid(-i[r]));
      df[r] = dg[r] * expf(LogSigmoid(-f[r]));
    }
  }
}

// --- mLSTM backward ------------------------------------------------------------

constexpr int kChunk = 64;                 // tokens per chunk
constexpr int kCols = 32;                  // state columns per CTA of the state scans
constexpr int kRowGroups = kThreads / 32;  // 8 warps
constexpr int kRowsPerThread = kMlstmBackwardMaxDim / kRowGroups;
constexpr int kColsPerThread = kMlstmBackwardMaxDim / 32;
constexpr int kTileRows = kChunk / kRowGroups;  // rows of a [kChunk, dim] tile per thread

__host__ __device__ inline int MaxChunks(const MlstmBackwardParams& p) {
  return (p.max_len + kChunk - 1) / kChunk;
}

// Scratch, carved from p.scratch. Token arrays use the padded index
// (seq·max_len + t)·H + h, chunk arrays (seq·max_chunks + c)·H + h; states are
// [K][V+1] with the normalizer (n, or its cotangent) as column V. Everything
// before fwd is the token scratch (MlstmTokenScratchFloats).
struct Scratch {
  float *b, *m, *den, *dqn, *dm, *qdq, *kdk;  // per token
  float* m_in;                                // per chunk: m entering it
  float* dt;                                  // per (seq, head, column tile): <dC_T, C_T> parts
  float *fwd, *rev;                           // per chunk: C̃ entering it, G at its end
  int64_t width;                              // K·(V+1)
  int tiles;                                  // column tiles of the state scans
};

__host__ __device__ inline Scratch ScratchOf(const MlstmBackwardParams& p) {
  Scratch s;
  const int64_t tok = static_cast<int64_t>(p.num_seqs) * p.max_len * p.heads;
  const int64_t chunks = static_cast<int64_t>(p.num_seqs) * MaxChunks(p) * p.heads;
  s.width = static_cast<int64_t>(p.dk) * (p.dv + 1);
  s.tiles = (p.dv + 1 + kCols - 1) / kCols;
  s.b = p.scratch;
  s.m = s.b + tok;
  s.den = s.m + tok;
  s.dqn = s.den + tok;
  s.dm = s.dqn + tok;
  s.qdq = s.dm + tok;
  s.kdk = s.qdq + tok;
  s.m_in = s.kdk + tok;
  s.dt = s.m_in + chunks;
  s.fwd = s.dt + static_cast<int64_t>(p.num_seqs) * p.heads * s.tiles;
  s.rev = s.fwd + chunks * s.width;
  return s;
}

int64_t TokenScratchFloatsOf(const MlstmBackwardParams& p) {
  const int64_t tok = static_cast<int64_t>(p.num_seqs) * p.max_len * p.heads;
  const int64_t chunks = static_cast<int64_t>(p.num_seqs) * MaxChunks(p) * p.heads;
  const int tiles = (p.dv + 1 + kCols - 1) / kCols;
  return 7 * tok + chunks + static_cast<int64_t>(p.num_seqs) * p.heads * tiles;
}

int64_t ScratchFloatsOf(const MlstmBackwardParams& p) {
  const int64_t chunks = static_cast<int64_t>(p.num_seqs) * MaxChunks(p) * p.heads;
  const int64_t width = static_cast<int64_t>(p.dk) * (p.dv + 1);
  return TokenScratchFloatsOf(p) + 2 * chunks * width;
}

__device__ __forceinline__ int64_t TokenAt(const MlstmBackwardParams& p, int seq, int t, int h) {
  return (static_cast<int64_t>(seq) * p.max_len + t) * p.heads + h;
}

__device__ __forceinline__ int64_t ChunkAt(const MlstmBackwardParams& p, int seq, int c, int h) {
  return (static_cast<int64_t>(seq) * MaxChunks(p) + c) * p.heads + h;
}

__device__ __forceinline__ float Sigmoid(float x) { return expf(LogSigmoid(x)); }

// log of the input gate's key weight: i (exp gate) or log σ(i).
__device__ __forceinline__ float LogInput(MlstmGate kind, float i) {
  return kind == MlstmGate::kExp ? i : LogSigmoid(i);
}

__device__ __forceinline__ int64_t SlotHead(const MlstmBackwardParams& p, int seq, int h) {
  return (p.slot ? static_cast<int64_t>(p.slot[seq]) : seq) * p.heads + h;
}

// Steps of 32 tokens whose inputs the per-task walks below load at once: a
// walk of 4,096 tokens then waits on memory 16 times instead of 128.
constexpr int kStepsAhead = 8;

// One warp per (sequence, head), 32 tokens per step (a chunk is two steps):
// b_t = Σ log σ(f) from the chunk start through t, the stabilizer m_t (0 for
// the sigmoid kinds) and m entering every chunk. The recurrence
// m_t = max(lf_t + m_{t−1}, i_t) unrolls over a step that starts from m to
//   m_t = β_t + max(m, max_{τ≤t} (i_τ − β_τ)),  β = Σ lf from the step start,
// a prefix sum and a prefix max across the warp.
__global__ void MlstmGatesKernel(const MlstmBackwardParams p) {
  const int task = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (task >= p.num_seqs * p.heads) return;  // the whole warp
  const int seq = task / p.heads, h = task % p.heads;
  const Scratch s = ScratchOf(p);
  const int64_t bos = p.cu_seqlens[seq];
  const int len = p.cu_seqlens[seq + 1] - static_cast<int>(bos);
  const bool exp_gate = p.gate == MlstmGate::kExp;
  float m = exp_gate && p.m_init ? p.m_init[SlotHead(p, seq, h)] : 0.0f;
  float chunk_b = 0.0f;  // b at the end of the previous step of this chunk
  for (int block = 0; block < len; block += 32 * kStepsAhead) {
    // The block's gates, every load in flight before the first step needs one.
    float f_in[kStepsAhead], i_in[kStepsAhead];
#pragma unroll
    for (int j = 0; j < kStepsAhead; ++j) {
      const int t = block + 32 * j + lane;
      const int64_t tok = (bos + t) * p.heads + h;
      f_in[j] = t < len ? p.f[tok] : 0.0f;
      i_in[j] = t < len && exp_gate ? p.i[tok] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kStepsAhead; ++j) {
      const int t0 = block + 32 * j;
      if (t0 >= len) break;
      if (t0 % kChunk == 0) {
        if (lane == 0) s.m_in[ChunkAt(p, seq, t0 / kChunk, h)] = m;
        chunk_b = 0.0f;
      }
      const int t = t0 + lane;
      const bool live = t < len;
      float beta = live ? LogSigmoid(f_in[j]) : 0.0f;
      float u = live && exp_gate ? i_in[j] : -INFINITY;
      for (int o = 1; o < 32; o <<= 1) {
        const float y = __shfl_up_sync(0xffffffffu, beta, o);
        if (lane >= o) beta += y;
      }
      u -= beta;
      for (int o = 1; o < 32; o <<= 1) {
        const float y = __shfl_up_sync(0xffffffffu, u, o);
        if (lane >= o) u = fmaxf(u, y);
      }
      const float mt = exp_gate ? beta + fmaxf(m, u) : 0.0f;
      if (live) {
        s.b[TokenAt(p, seq, t, h)] = chunk_b + beta;
        s.m[TokenAt(p, seq, t, h)] = mt;
      }
      chunk_b += __shfl_sync(0xffffffffu, beta, 31);
      m = __shfl_sync(0xffffffffu, mt, 31);  // lanes past the end repeat the last live value
    }
  }
}

// Sum over the CTA of kThreads; every thread gets it. red holds kRowGroups floats.
__device__ __forceinline__ float CtaSum(float x, float* red) {
  x = WarpSum(x);
  __syncthreads();
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = x;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kRowGroups; ++w) total += red[w];
  return total;
}

// The chunk-boundary states, one CTA per (sequence, head, tile of 32 state
// columns), sequential over chunks; thread (row group ty, column tx) keeps
// rows 16ty … 16ty + 15 of its column in registers. With e = the chunk's last token:
//   forward:  C̃_{c+1} = e^{b_e + m_c − m_e} C̃_c + Σ_τ e^{b_e − b_τ + li_τ − m_e} k_τ [v_τ; 1]ᵀ,
//             stored as the state entering each chunk; at the end the tile's
//             part of D_T = <dC_T, C_T> + <dn_T, n_T>;
//   reverse:  G_c = e^{b_e + m_c − m_e} G_{c+1} + Σ_s e^{b_s + m_c − m_s} q'_s [dnum_s; dqn_s]ᵀ
//             from G = [dC_T; dn_T], stored as the state at each chunk's end;
//             what is left at the start is (dC_0, dn_0).
// Every exponent is ≤ 0: m is the running max of exactly these log weights.
template <bool kReverse>
__global__ void __launch_bounds__(kThreads, 1) MlstmStateScanKernel(const MlstmBackwardParams p) {
  extern __shared__ float smem[];
  const int K = p.dk, V = p.dv, H = p.heads;
  // [kChunk][lda]: k (forward) or q' (reverse), rows padded to float4s and
  // sized for the widest K so that a thread's 16 rows are in bounds.
  float* a_s = smem;
  float* b_s = a_s + kChunk * kMlstmBackwardMaxDim;  // [kChunk][kCols]: [v; 1] or [dnum; dqn]
  float* w_s = b_s + kChunk * kCols;                 // [kChunk] token weights
  float* red = w_s + kChunk;
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  const int tile = blockIdx.x, h = blockIdx.y, seq = blockIdx.z;
  const int col = tile * kCols + tx;
  const Scratch sc = ScratchOf(p);
  const int64_t bos = p.cu_seqlens[seq];
  const int len = p.cu_seqlens[seq + 1] - static_cast<int>(bos);
  const int chunks = (len + kChunk - 1) / kChunk;
  const int64_t kv = static_cast<int64_t>(K) * V, dense = static_cast<int64_t>(seq) * H + h;
  const float scale = 1.0f / sqrtf(static_cast<float>(K));
  const int lda = (K + 3) / 4 * 4, row0 = ty * kRowsPerThread;
  for (int i = threadIdx.x; i < kChunk * kMlstmBackwardMaxDim; i += kThreads) a_s[i] = 0.0f;

  // The boundary state: initial state (forward) or final cotangent (reverse).
  const float* mat = kReverse ? p.d_ct : p.c_init;
  const float* vec = kReverse ? p.d_nt : p.n_init;
  const int64_t base = kReverse ? dense : (p.c_init ? SlotHead(p, seq, h) : 0);
  float st[kRowsPerThread];
#pragma unroll
  for (int j = 0; j < kRowsPerThread; ++j) {
    const int r = row0 + j;
    float x = 0.0f;
    if (r < K && col < V && mat) x = mat[base * kv + static_cast<int64_t>(r) * V + col];
    if (r < K && col == V && vec) x = vec[base * K + r];
    st[j] = x;
  }

  for (int step = 0; step < chunks; ++step) {
    const int c = kReverse ? chunks - 1 - step : step;
    const int t0 = c * kChunk, n = min(kChunk, len - t0);
    const int64_t ci = ChunkAt(p, seq, c, h);
    const int64_t e = TokenAt(p, seq, t0 + n - 1, h);
    const float mc = sc.m_in[ci], me = sc.m[e], be = sc.b[e];
    float* out = (kReverse ? sc.rev : sc.fwd) + ci * sc.width;
#pragma unroll
    for (int j = 0; j < kRowsPerThread; ++j) {
      const int r = row0 + j;
      if (r < K && col <= V) out[static_cast<int64_t>(r) * (V + 1) + col] = st[j];
    }
    __syncthreads();  // the previous chunk's tiles are consumed
    for (int i = threadIdx.x; i < n * K; i += kThreads) {
      const int j = i / K, r = i % K;
      const int64_t at = ((bos + t0 + j) * H + h) * K + r;
      a_s[j * lda + r] =
          kReverse ? scale * LoadElem(p.q.ptr, p.q.type, at) : LoadElem(p.k.ptr, p.k.type, at);
    }
    for (int i = threadIdx.x; i < n * kCols; i += kThreads) {
      const int j = i / kCols, cc = tile * kCols + i % kCols;
      const int64_t tok = (bos + t0 + j) * H + h;
      float x = 0.0f;
      if (kReverse) {
        const int64_t pt = TokenAt(p, seq, t0 + j, h);
        if (cc < V) x = LoadElem(p.dh.ptr, p.dh.type, tok * V + cc) / sc.den[pt];
        if (cc == V) x = sc.dqn[pt];
      } else {
        if (cc < V) x = LoadElem(p.v.ptr, p.v.type, tok * V + cc);
        if (cc == V) x = 1.0f;
      }
      b_s[i] = x;
    }
    for (int j = threadIdx.x; j < n; j += kThreads) {
      const int64_t pt = TokenAt(p, seq, t0 + j, h);
      w_s[j] = kReverse ? expf(sc.b[pt] + mc - sc.m[pt])
                        : expf(be - sc.b[pt] + LogInput(p.gate, p.i[(bos + t0 + j) * H + h]) - me);
    }
    __syncthreads();
    const float carry = expf(be + mc - me);
#pragma unroll
    for (int j = 0; j < kRowsPerThread; ++j) st[j] *= carry;
    for (int j = 0; j < n; ++j) {
      const float bw = b_s[j * kCols + tx] * w_s[j];
      const float4* a = reinterpret_cast<const float4*>(a_s + j * lda + row0);
#pragma unroll
      for (int q = 0; q < kRowsPerThread / 4; ++q) {
        const float4 x = a[q];
        st[4 * q] += x.x * bw;
        st[4 * q + 1] += x.y * bw;
        st[4 * q + 2] += x.z * bw;
        st[4 * q + 3] += x.w * bw;
      }
    }
  }

  if (kReverse) {
#pragma unroll
    for (int j = 0; j < kRowsPerThread; ++j) {
      const int r = row0 + j;
      if (r >= K) continue;
      if (col < V && p.d_c0) p.d_c0[dense * kv + static_cast<int64_t>(r) * V + col] = st[j];
      if (col == V && p.d_n0) p.d_n0[dense * K + r] = st[j];
    }
  } else {
    float part = 0.0f;
#pragma unroll
    for (int j = 0; j < kRowsPerThread; ++j) {
      const int r = row0 + j;
      if (r >= K) continue;
      if (col < V && p.d_ct) part += st[j] * p.d_ct[dense * kv + static_cast<int64_t>(r) * V + col];
      if (col == V && p.d_nt) part += st[j] * p.d_nt[dense * K + r];
    }
    const float total = CtaSum(part, red);
    if (threadIdx.x == 0) sc.dt[dense * sc.tiles + tile] = total;
  }
}

// Loads a chunk's rows of an [N,H,dim] operand into a [kChunk][ld] tile
// (times `mul`), zero past the sequence end.
__device__ __forceinline__ void LoadTile(float* dst, int ld, Operand src, int dim, int64_t tok0,
                                         int heads, int h, int n, float mul) {
  for (int i = threadIdx.x; i < kChunk * dim; i += kThreads) {
    const int j = i / dim, x = i % dim;
    dst[j * ld + x] =
        j < n ? mul * LoadElem(src.ptr, src.type, ((tok0 + j) * heads + h) * dim + x) : 0.0f;
  }
}

// The gates of a chunk's tokens into shared memory: b, m, li; zero past the end.
__device__ __forceinline__ void LoadChunkGates(const MlstmBackwardParams& p, const Scratch& sc,
                                               int seq, int h, int64_t bos, int t0, int n,
                                               float* gb, float* gm, float* gli) {
  for (int j = threadIdx.x; j < kChunk; j += kThreads) {
    const int64_t pt = TokenAt(p, seq, t0 + min(j, n - 1), h);
    gb[j] = sc.b[pt];
    gm[j] = sc.m[pt];
    gli[j] = j < n ? LogInput(p.gate, p.i[(bos + t0 + j) * p.heads + h]) : 0.0f;
  }
}

// D[s][τ] = e^{b_s − b_τ + li_τ − m_s}·(x_s·y_τ + add_s) for τ ≤ s < n, else 0.
// Thread (ty, tx) computes rows ty + 8a and columns tx + 32b.
__device__ __forceinline__ void DecayedScores(float* out, const float* x, const float* y, int ld,
                                              int dim, const float* add, int n, const float* gb,
                                              const float* gm, const float* gli) {
  constexpr int kScoreCols = kChunk / 32;
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  float acc[kTileRows][kScoreCols] = {};
  for (int l = 0; l < dim; ++l) {
    float yv[kScoreCols];
#pragma unroll
    for (int b = 0; b < kScoreCols; ++b) yv[b] = y[(tx + 32 * b) * ld + l];
#pragma unroll
    for (int a = 0; a < kTileRows; ++a) {
      const float xv = x[(ty + kRowGroups * a) * ld + l];
#pragma unroll
      for (int b = 0; b < kScoreCols; ++b) acc[a][b] += xv * yv[b];
    }
  }
#pragma unroll
  for (int a = 0; a < kTileRows; ++a) {
    const int s = ty + kRowGroups * a;
#pragma unroll
    for (int b = 0; b < kScoreCols; ++b) {
      const int tau = tx + 32 * b;
      float d = 0.0f;
      if (tau <= s && s < n)
        d = (acc[a][b] + (add ? add[s] : 0.0f)) * expf(gb[s] - gb[tau] + gli[tau] - gm[s]);
      out[s * (kChunk + 1) + tau] = d;
    }
  }
}

// The register tile of a chunk product: this thread's rows ty + kRowGroups·a
// and columns tx + 32·b. acc[a][b] += Σ_{i<n} weight(row, i)·x[i·ldx + col],
// columns at or past `cols` reading 0.
template <typename Weight>
__device__ __forceinline__ void AccumulateTile(float (&acc)[kTileRows][kColsPerThread], int n,
                                               const float* x, int ldx, int cols, Weight weight) {
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  for (int i = 0; i < n; ++i) {
    float xv[kColsPerThread];
#pragma unroll
    for (int b = 0; b < kColsPerThread; ++b) {
      const int col = tx + 32 * b;
      xv[b] = col < cols ? x[i * ldx + col] : 0.0f;
    }
#pragma unroll
    for (int a = 0; a < kTileRows; ++a) {
      const float w = weight(ty + kRowGroups * a, i);
#pragma unroll
      for (int b = 0; b < kColsPerThread; ++b) acc[a][b] += w * xv[b];
    }
  }
}

// acc[a][b] *= scale[row] for this thread's rows.
__device__ __forceinline__ void ScaleTileRows(float (&acc)[kTileRows][kColsPerThread],
                                              const float* scale) {
  const int ty = threadIdx.x / 32;
#pragma unroll
  for (int a = 0; a < kTileRows; ++a)
#pragma unroll
    for (int b = 0; b < kColsPerThread; ++b) acc[a][b] *= scale[ty + kRowGroups * a];
}

// Per chunk: the per-token scalars of the normalized output,
//   qn_s = q'_s·n_s,  den_s,  dnum_s = dh_s/den_s,  dqn_s = −(dh_s·h_s)/den_s·sgn(qn_s)
// where the max of den takes qn, and the explicit stabilizer cotangent
// dm_s = −(dh_s·h_s)·eps/den_s of the exp gate (h = C̃ᵀq'/(max(|q'ñ|,1) + eps·e^m)).
// num_s = e^{b_s + m_c − m_s} C̃_cᵀq'_s + Σ_τ D[s][τ] v_τ with D of q'·k.
__global__ void __launch_bounds__(kThreads, 1)
    MlstmTokenScalarsKernel(const MlstmBackwardParams p) {
  extern __shared__ float smem[];
  const int K = p.dk, V = p.dv, H = p.heads, c = blockIdx.x, h = blockIdx.y, seq = blockIdx.z;
  const int64_t bos = p.cu_seqlens[seq];
  const int len = p.cu_seqlens[seq + 1] - static_cast<int>(bos), t0 = c * kChunk;
  if (t0 >= len) return;
  const int n = min(kChunk, len - t0);
  const Scratch sc = ScratchOf(p);
  if (p.gate == MlstmGate::kSig) {  // unnormalized: den = 1, no dqn or dm
    for (int j = threadIdx.x; j < n; j += kThreads) {
      const int64_t pt = TokenAt(p, seq, t0 + j, h);
      sc.den[pt] = 1.0f;
      sc.dqn[pt] = 0.0f;
      sc.dm[pt] = 0.0f;
    }
    return;
  }
  float* qs = smem;                   // [kChunk][K+1] q'
  float* ks = qs + kChunk * (K + 1);  // [kChunk][K+1]
  float* vs = ks + kChunk * (K + 1);  // [kChunk][V]
  float* sc_p = vs + kChunk * V;      // [kChunk][kChunk+1] D of q'·k
  float* gb = sc_p + kChunk * (kChunk + 1);
  float* gm = gb + kChunk;
  float* gli = gm + kChunk;
  float* den_s = gli + kChunk;
  float* ein = den_s + kChunk;
  float* sgn = ein + kChunk;
  const float scale = 1.0f / sqrtf(static_cast<float>(K));
  const int64_t ci = ChunkAt(p, seq, c, h);
  const float mc = sc.m_in[ci];
  const float* state = sc.fwd + ci * sc.width;  // C̃_c | n_c, [K][V+1]
  LoadTile(qs, K + 1, p.q, K, bos + t0, H, h, n, scale);
  LoadTile(ks, K + 1, p.k, K, bos + t0, H, h, n, 1.0f);
  LoadTile(vs, V, p.v, V, bos + t0, H, h, n, 1.0f);
  LoadChunkGates(p, sc, seq, h, bos, t0, n, gb, gm, gli);
  __syncthreads();
  DecayedScores(sc_p, qs, ks, K + 1, K, nullptr, n, gb, gm, gli);
  for (int s = threadIdx.x; s < kChunk; s += kThreads) ein[s] = expf(gb[s] + mc - gm[s]);
  __syncthreads();
  for (int s = threadIdx.x; s < n; s += kThreads) {
    float inter = 0.0f, intra = 0.0f;
    for (int l = 0; l < K; ++l) inter += qs[s * (K + 1) + l] * state[l * (V + 1) + V];
    for (int tau = 0; tau <= s; ++tau) intra += sc_p[s * (kChunk + 1) + tau];
    const float qn = ein[s] * inter + intra;
    const float lower = p.gate == MlstmGate::kExp ? expf(-gm[s]) : 1.0f;
    const float den = fmaxf(fabsf(qn), lower) + p.eps;
    den_s[s] = den;
    // dqn's sign where the max took |qn|, 0 where it took the lower bound.
    sgn[s] = fabsf(qn) >= lower ? (qn >= 0.0f ? 1.0f : -1.0f) : 0.0f;
  }
  __syncthreads();

  // num for rows ty + 8a and columns tx + 32b, then dh·num per row.
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  float acc[kTileRows][kColsPerThread] = {};
  AccumulateTile(acc, K, state, V + 1, V, [&](int s, int l) { return qs[s * (K + 1) + l]; });
  ScaleTileRows(acc, ein);
  AccumulateTile(acc, kChunk, vs, V, V,
                 [&](int s, int tau) { return sc_p[s * (kChunk + 1) + tau]; });
#pragma unroll
  for (int a = 0; a < kTileRows; ++a) {
    const int s = ty + kRowGroups * a;
    float part = 0.0f;
#pragma unroll
    for (int b = 0; b < kColsPerThread; ++b) {
      const int v = tx + 32 * b;
      if (s < n && v < V)
        part += acc[a][b] * LoadElem(p.dh.ptr, p.dh.type, ((bos + t0 + s) * H + h) * V + v);
    }
    const float dh_num = WarpSum(part);
    if (tx == 0 && s < n) {
      const float den = den_s[s], dh_h = dh_num / den;
      const int64_t pt = TokenAt(p, seq, t0 + s, h);
      sc.den[pt] = den;
      sc.dqn[pt] = -dh_h / den * sgn[s];
      sc.dm[pt] = p.gate == MlstmGate::kExp ? -dh_h * p.eps / den : 0.0f;
    }
  }
}

// acc[a][b] (row ty + 8a, column tx + 32b of a [kChunk, K] result) +=
// Σ_v x[row][v]·M[col][v] + add[row]·M[col][V] (add null: 1), M a [K][V+1]
// state in global memory staged 32 of its columns at a time ([K][33]).
__device__ __forceinline__ void TimesStateRows(float (&acc)[kTileRows][kColsPerThread],
                                               const float* x, int ldx, const float* add,
                                               const float* state, int K, int V, float* stage) {
  constexpr int kLd = 33;
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  for (int v0 = 0; v0 <= V; v0 += 32) {
    const int width = min(32, V + 1 - v0);
    __syncthreads();
    for (int i = threadIdx.x; i < K * 32; i += kThreads) {
      const int r = i / 32, c = i % 32;
      stage[r * kLd + c] = c < width ? state[static_cast<int64_t>(r) * (V + 1) + v0 + c] : 0.0f;
    }
    __syncthreads();
    for (int c = 0; c < width; ++c) {
      const int v = v0 + c;
      float mv[kColsPerThread];
#pragma unroll
      for (int b = 0; b < kColsPerThread; ++b) {
        const int col = tx + 32 * b;
        mv[b] = col < K ? stage[col * kLd + c] : 0.0f;
      }
#pragma unroll
      for (int a = 0; a < kTileRows; ++a) {
        const int s = ty + kRowGroups * a;
        const float xv = v < V ? x[s * ldx + v] : (add ? add[s] : 1.0f);
#pragma unroll
        for (int b = 0; b < kColsPerThread; ++b) acc[a][b] += xv * mv[b];
      }
    }
  }
}

// Per chunk, with D[s][τ] = e^{b_s − b_τ + li_τ − m_s} (τ ≤ s), e = the last token:
//   S1 = D ⊙ (dnum Vᵀ + dqn 1ᵀ),  S2 = D ⊙ (Q'Kᵀ),
//   ein_s = e^{b_s + m_c − m_s},  eout_τ = e^{li_τ + b_e − b_τ − m_e},
//   dq'_s = ein_s (C̃_c dnum_s + dqn_s ñ_c) + Σ_τ S1[s][τ] k_τ,
//   dk_τ  = eout_τ (G_e v_τ + g_e) + Σ_s S1[s][τ] q'_s,
//   dv_τ  = eout_τ G_eᵀ k_τ + Σ_s S2[s][τ] dnum_s,
// and the gate-gradient terms q'·dq' and k·dk per token.
__global__ void __launch_bounds__(kThreads, 1) MlstmChunkGradKernel(const MlstmBackwardParams p) {
  extern __shared__ float smem[];
  const int K = p.dk, V = p.dv, H = p.heads, c = blockIdx.x, h = blockIdx.y, seq = blockIdx.z;
  const int64_t bos = p.cu_seqlens[seq];
  const int len = p.cu_seqlens[seq + 1] - static_cast<int>(bos), t0 = c * kChunk;
  if (t0 >= len) return;
  const int n = min(kChunk, len - t0);
  const Scratch sc = ScratchOf(p);
  const int KP = K + 1, VP = V + 1, SP = kChunk + 1;
  float* qs = smem;              // [kChunk][K+1] q'
  float* ks = qs + kChunk * KP;  // [kChunk][K+1]
  float* vs = ks + kChunk * KP;  // [kChunk][V+1]
  float* dn = vs + kChunk * VP;  // [kChunk][V+1] dnum
  float* s1 = dn + kChunk * VP;  // [kChunk][kChunk+1]
  float* s2 = s1 + kChunk * SP;
  float* stage = s2 + kChunk * SP;  // [K][33]
  float* gb = stage + 33 * K;
  float* gm = gb + kChunk;
  float* gli = gm + kChunk;
  float* dqn = gli + kChunk;
  float* ein = dqn + kChunk;
  float* eout = ein + kChunk;
  const float scale = 1.0f / sqrtf(static_cast<float>(K));
  const int64_t ci = ChunkAt(p, seq, c, h);
  const float mc = sc.m_in[ci];
  const int64_t e = TokenAt(p, seq, t0 + n - 1, h);
  const float me = sc.m[e], be = sc.b[e];
  LoadTile(qs, KP, p.q, K, bos + t0, H, h, n, scale);
  LoadTile(ks, KP, p.k, K, bos + t0, H, h, n, 1.0f);
  LoadTile(vs, VP, p.v, V, bos + t0, H, h, n, 1.0f);
  LoadTile(dn, VP, p.dh, V, bos + t0, H, h, n, 1.0f);
  LoadChunkGates(p, sc, seq, h, bos, t0, n, gb, gm, gli);
  __syncthreads();
  for (int i = threadIdx.x; i < n * V; i += kThreads) {
    const int j = i / V;
    dn[j * VP + i % V] /= sc.den[TokenAt(p, seq, t0 + j, h)];
  }
  for (int j = threadIdx.x; j < kChunk; j += kThreads) {
    dqn[j] = j < n ? sc.dqn[TokenAt(p, seq, t0 + j, h)] : 0.0f;
    ein[j] = expf(gb[j] + mc - gm[j]);
    eout[j] = j < n ? expf(gli[j] + be - gb[j] - me) : 0.0f;
  }
  __syncthreads();
  DecayedScores(s1, dn, vs, VP, V, dqn, n, gb, gm, gli);
  DecayedScores(s2, qs, ks, KP, K, nullptr, n, gb, gm, gli);
  __syncthreads();

  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  const float* c_in = sc.fwd + ci * sc.width;
  const float* g_end = sc.rev + ci * sc.width;
  // Stores mul·acc as rows of an [N,H,dim] output; with dot_with, also the
  // per-token dot of acc with that shared tile into dot_out.
  auto store = [&](float(&acc)[kTileRows][kColsPerThread], void* dst, ElemType type, int dim,
                   float mul, const float* dot_with, int ld_dot, float* dot_out) {
#pragma unroll
    for (int a = 0; a < kTileRows; ++a) {
      const int s = ty + kRowGroups * a;
      float part = 0.0f;
#pragma unroll
      for (int b = 0; b < kColsPerThread; ++b) {
        const int x = tx + 32 * b;
        if (x >= dim || s >= n) continue;
        if (dot_with) part += dot_with[s * ld_dot + x] * acc[a][b];
        StoreElem(dst, type, ((bos + t0 + s) * H + h) * dim + x, mul * acc[a][b]);
      }
      if (dot_out) {
        part = WarpSum(part);
        if (tx == 0 && s < n) dot_out[TokenAt(p, seq, t0 + s, h)] = part;
      }
    }
  };

  {  // dq'
    float acc[kTileRows][kColsPerThread] = {};
    TimesStateRows(acc, dn, VP, dqn, c_in, K, V, stage);
    ScaleTileRows(acc, ein);  // S1 is 0 above the diagonal
    AccumulateTile(acc, kChunk, ks, KP, K, [&](int s, int tau) { return s1[s * SP + tau]; });
    store(acc, p.dq, p.dq_type, K, scale, qs, KP, sc.qdq);
  }
  {  // dk
    float acc[kTileRows][kColsPerThread] = {};
    TimesStateRows(acc, vs, VP, nullptr, g_end, K, V, stage);
    ScaleTileRows(acc, eout);  // S1 is 0 above the diagonal
    AccumulateTile(acc, kChunk, qs, KP, K, [&](int tau, int s) { return s1[s * SP + tau]; });
    store(acc, p.dk_out, p.dk_type, K, 1.0f, ks, KP, sc.kdk);
  }
  {  // dv
    float acc[kTileRows][kColsPerThread] = {};
    AccumulateTile(acc, K, g_end, VP, V, [&](int tau, int l) { return ks[tau * KP + l]; });
    ScaleTileRows(acc, eout);  // S2 is 0 above the diagonal
    AccumulateTile(acc, kChunk, dn, VP, V, [&](int tau, int s) { return s2[s * SP + tau]; });
    store(acc, p.dv_out, p.dv_type, V, 1.0f, nullptr, 0, nullptr);
  }
}

// One warp per (sequence, head), 32 tokens per step, last step first:
//   dlf_t = D_T + Σ_{s≥t} (q'_s·dq'_s − k_s·dk_s)  (+ the stabilizer chain),
//   di_t  = k_t·dk_t (exp gate; × σ(−i_t) for the sigmoid gate),
// and for the exp gate the cotangent of m_t = max(lf_t + m_{t−1}, i_t):
//   dm_t = dm_t(explicit) + [forget won at t+1]·dm_{t+1}, dm_T(explicit) −= D_T
// (the stored final states are C̃_T e^{−m_T}), added to lf_t where the forget
// branch won and to i_t where the input branch did. df = dlf·σ(−f). The sum is
// a suffix scan across the warp and the dm chain an affine one,
// dm_t = E_t + A_t·dm_{t+1}, composed as (A, E)·(A', E') = (A A', E + A E').
__global__ void MlstmGateGradKernel(const MlstmBackwardParams p) {
  const int task = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (task >= p.num_seqs * p.heads) return;  // the whole warp
  const int seq = task / p.heads, h = task % p.heads;
  const Scratch sc = ScratchOf(p);
  const int64_t bos = p.cu_seqlens[seq];
  const int len = p.cu_seqlens[seq + 1] - static_cast<int>(bos);
  if (len == 0) return;
  const bool exp_gate = p.gate == MlstmGate::kExp;
  float d_final = 0.0f;
  for (int tile = 0; tile < sc.tiles; ++tile)
    d_final += sc.dt[static_cast<int64_t>(task) * sc.tiles + tile];
  // Carries from the later step: the running sum, dm and "forget won" of its first token.
  float run = d_final, dm_next = -d_final, wins_next = 1.0f;
  const float m0 = sc.m_in[ChunkAt(p, seq, 0, h)];
  for (int block = (len - 1) / 32 * 32; block >= 0; block -= 32 * kStepsAhead) {
    // The block's per-token inputs (steps block, block − 32, ...), every load
    // in flight before the first step needs one.
    float kdk_in[kStepsAhead], qdq_in[kStepsAhead], f_in[kStepsAhead], i_in[kStepsAhead],
        m_prev_in[kStepsAhead], dm_in[kStepsAhead];
#pragma unroll
    for (int j = 0; j < kStepsAhead; ++j) {
      const int t = block - 32 * j + lane;
      const bool live = t >= 0 && t < len;
      const int64_t pt = TokenAt(p, seq, live ? t : 0, h), tok = (bos + t) * p.heads + h;
      kdk_in[j] = live ? sc.kdk[pt] : 0.0f;
      qdq_in[j] = live ? sc.qdq[pt] : 0.0f;
      f_in[j] = live ? p.f[tok] : 0.0f;
      i_in[j] = live ? p.i[tok] : 0.0f;
      m_prev_in[j] = live && exp_gate ? (t > 0 ? sc.m[pt - p.heads] : m0) : 0.0f;
      dm_in[j] = live && exp_gate ? sc.dm[pt] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kStepsAhead; ++j) {
      const int t0 = block - 32 * j;
      if (t0 < 0) break;
      const int t = t0 + lane;
      const bool live = t < len;
      const int64_t tok = (bos + t) * p.heads + h;
      const float kdk = kdk_in[j];
      float sum = live ? qdq_in[j] - kdk : 0.0f;
      for (int o = 1; o < 32; o <<= 1) {
        const float y = __shfl_down_sync(0xffffffffu, sum, o);
        if (lane + o < 32) sum += y;
      }
      const float dlf_sum = run + sum;
      run = __shfl_sync(0xffffffffu, dlf_sum, 0);
      float dlf = dlf_sum, di = kdk;
      if (exp_gate) {
        // Past the end: no explicit term, and the chain passes through (A = 1).
        float wins = 1.0f, e = 0.0f;
        if (live) {
          wins = LogSigmoid(f_in[j]) + m_prev_in[j] >= i_in[j] ? 1.0f : 0.0f;
          e = dm_in[j];
        }
        float a = __shfl_down_sync(0xffffffffu, wins, 1);
        if (lane == 31) a = wins_next;
        for (int o = 1; o < 32; o <<= 1) {
          const float a2 = __shfl_down_sync(0xffffffffu, a, o);
          const float e2 = __shfl_down_sync(0xffffffffu, e, o);
          if (lane + o < 32) {
            e += a * e2;
            a *= a2;
          }
        }
        const float dm = e + a * dm_next;
        dlf += wins * dm;
        di += (1.0f - wins) * dm;
        dm_next = __shfl_sync(0xffffffffu, dm, 0);
        wins_next = __shfl_sync(0xffffffffu, wins, 0);
      } else if (live) {
        di *= Sigmoid(-i_in[j]);
      }
      if (live) {
        p.df[tok] = dlf * Sigmoid(-f_in[j]);
        p.di[tok] = di;
      }
    }
  }
}

// --- The normalized kinds on the scans: per-token pieces (one warp per token,
// grid (⌈max_len / 8⌉, H, num_seqs), the token scratch's padded layout) -------

constexpr int kTokenWarps = kThreads / 32;

// The normalized kinds' output cotangents, one warp a token: with h = num/den,
// den = max(|q'·n|, lower) + eps (lower = e^{−m}, or 1 for the sigmoid kind),
// dh/den into d_num and x = −(dh·h)/den·sign(q'·n) (0 where the max took
// `lower`), q'·n's cotangent, into x_out; for the exponential kind, −m into
// neg_m (the reverse scans' key weight) and the explicit dm = −(dh·h)·eps/den.
template <int kN>
__global__ void MlstmNormCotangentKernel(const MlstmBackwardParams p, Operand h_out,
                                         const float* norm_dot, void* d_num, ElemType type,
                                         float* x_out, float* neg_m) {
  const int seq = blockIdx.z, h = blockIdx.y, lane = threadIdx.x % 32;
  const int t = blockIdx.x * kTokenWarps + threadIdx.x / 32;
  const int64_t bos = p.cu_seqlens[seq];
  if (t >= p.cu_seqlens[seq + 1] - bos) return;
  const Scratch sc = ScratchOf(p);
  const int64_t row = (bos + t) * p.heads + h, pt = TokenAt(p, seq, t, h);
  const bool exp_gate = p.gate == MlstmGate::kExp;
  const float m = sc.m[pt], qn = norm_dot[row], lower = exp_gate ? expf(-m) : 1.0f;
  const float den = fmaxf(fabsf(qn), lower) + p.eps;
  float dh_h = 0.0f;
  for (int c = kN * lane; c < p.dv; c += 32 * kN) {
    float g[kN], x[kN];
    LoadElems(p.dh.ptr, p.dh.type, row * p.dv + c, g);
    LoadElems(h_out.ptr, h_out.type, row * p.dv + c, x);
#pragma unroll
    for (int e = 0; e < kN; ++e) {
      dh_h += g[e] * x[e];
      g[e] /= den;
    }
    StoreElems(d_num, type, row * p.dv + c, g);
  }
  dh_h = WarpSum(dh_h);
  if (lane == 0) {
    const float sign = fabsf(qn) >= lower ? (qn >= 0.0f ? 1.0f : -1.0f) : 0.0f;
    x_out[row] = -dh_h / den * sign;
    if (exp_gate) {
      neg_m[row] = -m;
      sc.dm[pt] = -dh_h * p.eps / den;
    }
  }
}

size_t StateScanSmem(const MlstmBackwardParams& p) {
  return sizeof(float) * (static_cast<size_t>(kChunk) * kMlstmBackwardMaxDim + kChunk * kCols +
                          kChunk + kRowGroups);
}

size_t TokenScalarsSmem(const MlstmBackwardParams& p) {
  // q', k, v; the decayed scores; six per-token arrays.
  return sizeof(float) * (static_cast<size_t>(kChunk) * (2 * (p.dk + 1) + p.dv) +
                          kChunk * (kChunk + 1) + 6 * kChunk);
}

size_t ChunkGradSmem(const MlstmBackwardParams& p) {
  // q', k; v, dnum; the [K][33] stage; S1, S2; six per-token arrays.
  return sizeof(float) * (static_cast<size_t>(kChunk) * 2 * (p.dk + 1) +
                          static_cast<size_t>(2 * kChunk) * (p.dv + 1) + 33 * p.dk +
                          2 * kChunk * (kChunk + 1) + 6 * kChunk);
}

// The per-token kernels: a warp per token. The gate kernels: a warp per
// (sequence, head), kTaskWarps to a CTA.
constexpr int kTaskWarps = 4;
dim3 TokenGrid(const MlstmBackwardParams& p) {
  return dim3((p.max_len + kTokenWarps - 1) / kTokenWarps, p.heads, p.num_seqs);
}
dim3 TaskGrid(const MlstmBackwardParams& p) {
  return dim3((p.num_seqs * p.heads + kTaskWarps - 1) / kTaskWarps);
}

template <typename Kernel>
cudaError_t Launch(Kernel kernel, dim3 grid, int threads, size_t smem, cudaStream_t stream,
                   const MlstmBackwardParams& p) {
  if (smem > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  kernel<<<grid, threads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchSoftmaxBackward(const float* p, float* dp, int64_t rows, int width,
                                  cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  SoftmaxBackwardKernel<<<Blocks(rows, kThreads / 32), kThreads, 0, stream>>>(p, dp, rows, width);
  return cudaGetLastError();
}

cudaError_t LaunchAdd(const float* a, const float* b, void* out, ElemType out_type, int64_t count,
                      cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  AddKernel<<<Blocks(count, kThreads), kThreads, 0, stream>>>(a, b, out, out_type, count);
  return cudaGetLastError();
}

cudaError_t LaunchMlstmSigKeys(Operand k, const float* i, const float* f, int64_t rows, int K,
                               void* k_scaled, ElemType k_scaled_type, float* lf,
                               cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const auto kernel = RowsInFours(K, {{k.ptr, k.type}, {k_scaled, k_scaled_type}})
                          ? MlstmSigKeysKernel<4>
                          : MlstmSigKeysKernel<1>;
  kernel<<<Blocks(rows, kThreads / 32), kThreads, 0, stream>>>(k, i, f, rows, K, k_scaled,
                                                               k_scaled_type, lf);
  return cudaGetLastError();
}

cudaError_t LaunchMlstmSigGateGrads(Operand k_scaled, const float* dk_scaled, const float* i,
                                    const float* f, const float* dg, int64_t rows, int K, void* dk,
                                    ElemType dk_type, float* di, float* df, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const auto kernel =
      RowsInFours(K, {{k_scaled.ptr, k_scaled.type}, {dk_scaled, ElemType::kF32}, {dk, dk_type}})
          ? MlstmSigGateGradsKernel<4>
          : MlstmSigGateGradsKernel<1>;
  kernel<<<Blocks(rows, kThreads / 32), kThreads, 0, stream>>>(k_scaled, dk_scaled, i, f, dg, rows,
                                                               K, dk, dk_type, di, df);
  return cudaGetLastError();
}

int64_t MlstmBackwardScratchFloats(const MlstmBackwardParams& p) { return ScratchFloatsOf(p); }
int64_t MlstmTokenScratchFloats(const MlstmBackwardParams& p) { return TokenScratchFloatsOf(p); }

cudaError_t LaunchMlstmStabilizers(const MlstmBackwardParams& p, cudaStream_t stream) {
  if (p.num_seqs * p.heads == 0) return cudaSuccess;
  return Launch(MlstmGatesKernel, TaskGrid(p), 32 * kTaskWarps, 0, stream, p);
}

cudaError_t LaunchMlstmNormCotangent(const MlstmBackwardParams& p, Operand h_out,
                                     const float* norm_dot, void* d_num, ElemType type,
                                     float* x_out, float* neg_m, cudaStream_t stream) {
  if (p.num_seqs * p.heads == 0 || p.max_len == 0) return cudaSuccess;
  const auto kernel =
      RowsInFours(p.dv, {{h_out.ptr, h_out.type}, {p.dh.ptr, p.dh.type}, {d_num, type}})
          ? MlstmNormCotangentKernel<4>
          : MlstmNormCotangentKernel<1>;
  kernel<<<TokenGrid(p), kThreads, 0, stream>>>(p, h_out, norm_dot, d_num, type, x_out, neg_m);
  return cudaGetLastError();
}

MlstmRowDots MlstmTokenRowDots(const MlstmBackwardParams& p) {
  const Scratch sc = ScratchOf(p);
  return {sc.qdq, sc.kdk, static_cast<int64_t>(p.max_len) * p.heads};
}

cudaError_t LaunchMlstmNormGateGrads(const MlstmBackwardParams& p, cudaStream_t stream) {
  if (p.num_seqs * p.heads == 0) return cudaSuccess;
  const Scratch sc = ScratchOf(p);
  const cudaError_t err = cudaMemsetAsync(
      sc.dt, 0, sizeof(float) * static_cast<size_t>(p.num_seqs) * p.heads * sc.tiles, stream);
  if (err != cudaSuccess) return err;
  return Launch(MlstmGateGradKernel, TaskGrid(p), 32 * kTaskWarps, 0, stream, p);
}

cudaError_t LaunchMlstmBackward(const MlstmBackwardParams& p, cudaStream_t stream) {
  const int tasks = p.num_seqs * p.heads;
  if (tasks == 0) return cudaSuccess;
  if (p.dk < 1 || p.dv < 1 || p.dk > kMlstmBackwardMaxDim || p.dv > kMlstmBackwardMaxDim ||
      p.max_len < 0)
    return cudaErrorInvalidValue;
  const dim3 chunk_grid(MaxChunks(p) > 0 ? MaxChunks(p) : 1, p.heads, p.num_seqs);
  const dim3 tile_grid(ScratchOf(p).tiles, p.heads, p.num_seqs);
  cudaError_t err;
  if ((err = Launch(MlstmGatesKernel, TaskGrid(p), 32 * kTaskWarps, 0, stream, p)) != cudaSuccess)
    return err;
  if ((err = Launch(MlstmStateScanKernel<false>, tile_grid, kThreads, StateScanSmem(p), stream,
                    p)) != cudaSuccess)
    return err;
  if ((err = Launch(MlstmTokenScalarsKernel, chunk_grid, kThreads, TokenScalarsSmem(p), stream,
                    p)) != cudaSuccess)
    return err;
  if ((err = Launch(MlstmStateScanKernel<true>, tile_grid, kThreads, StateScanSmem(p), stream,
                    p)) != cudaSuccess)
    return err;
  if ((err = Launch(MlstmChunkGradKernel, chunk_grid, kThreads, ChunkGradSmem(p), stream, p)) !=
      cudaSuccess)
    return err;
  return Launch(MlstmGateGradKernel, TaskGrid(p), 32 * kTaskWarps, 0, stream, p);
}

}  // namespace lair::kernels::cuda
