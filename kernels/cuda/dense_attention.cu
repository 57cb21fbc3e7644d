// Causal softmax attention with a per-slot KV cache and grouped-query heads
// (kernels/dense.h AttentionArgs), and its backward over uncached sequences.
//
// Forward: the new k, v rows are appended to the cache, then one block per
// (token, head) reads the cache rows [0, pos]. Each of its kWarps warps runs
// an online softmax over every kWarps-th group of kKeys keys, lanes splitting
// head_dim (kVec floats per lane per step, 16-byte loads when aligned):
//   s_j = scale · q·k_j,  m' = max(m, s_j),  l = l·e^{m−m'} + e^{s_j−m'},
//   acc = acc·e^{m−m'} + e^{s_j−m'} v_j;
// the warps' (m, l, acc) are merged through shared memory, o = acc / l.
//
// Backward (every start 0; keys are the sequence's own tokens):
//   query pass, one block per (token i, head): lse_i = log Σ_j e^{s_ij},
//     Δ_i = Σ_j p_ij dp_ij with dp_ij = dO_i·v_j, then
//     dq_i = scale Σ_j p_ij (dp_ij − Δ_i) k_j;
//   key pass, one block per (token j, kv head), over the later queries i of
//     the sequence and the heads of the group: p_ij = e^{s_ij − lse_i},
//     dk_j = scale Σ p_ij (dp_ij − Δ_i) q_i,  dv_j = Σ p_ij dO_i.
// No atomics: every output element is written by one block.
#include "kernels/cuda/dense_common.cuh"
#include "kernels/cuda/dense_launch.h"

namespace lair::kernels::cuda::dense {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kKeys = 4;  // keys per warp step (independent dot products in flight)
constexpr int kMaxD = CudaDenseOps::kMaxHeadDim;
constexpr int kRegs = kMaxD / 32;  // floats of a head row per lane

// Lane `lane` holds elements (c·32 + lane)·kVec + e of a row, c < kRegs/kVec.
template <int kVec>
__device__ __forceinline__ void LoadRow(const float* row, int lane, int d, float (&r)[kRegs]) {
#pragma unroll
  for (int c = 0; c < kRegs / kVec; ++c) {
    const int e = (c * 32 + lane) * kVec;
    if constexpr (kVec == 4) {
      float4 t = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (e < d) t = *reinterpret_cast<const float4*>(row + e);
      r[c * 4 + 0] = t.x, r[c * 4 + 1] = t.y, r[c * 4 + 2] = t.z, r[c * 4 + 3] = t.w;
    } else {
      r[c] = e < d ? row[e] : 0.0f;
    }
  }
}

template <int kVec>
__device__ __forceinline__ void StoreRow(float* row, int lane, int d, const float (&r)[kRegs]) {
#pragma unroll
  for (int c = 0; c < kRegs / kVec; ++c) {
    const int e = (c * 32 + lane) * kVec;
    if (e >= d) continue;
    if constexpr (kVec == 4) {
      *reinterpret_cast<float4*>(row + e) =
          make_float4(r[c * 4 + 0], r[c * 4 + 1], r[c * 4 + 2], r[c * 4 + 3]);
    } else {
      row[e] = r[c];
    }
  }
}

// a·row over the warp (every lane gets it).
template <int kVec>
__device__ __forceinline__ float WarpDot(const float (&a)[kRegs], const float* row, int lane,
                                         int d) {
  float r[kRegs];
  LoadRow<kVec>(row, lane, d, r);
  float part = 0.0f;
#pragma unroll
  for (int i = 0; i < kRegs; ++i) part = fmaf(a[i], r[i], part);
  return WarpSum(part);
}

// Element offset of a shared [kWarps][kMaxD] buffer for this lane's slot i.
template <int kVec>
__device__ __forceinline__ int LaneElement(int lane, int i) {
  return ((i / kVec) * 32 + lane) * kVec + i % kVec;
}

// r ← Σ_w weight_w · r_w over the block's warps, element by element (each
// warp passes its own weight); every warp gets the sum. `shared` holds
// kWarps rows of kMaxD.
template <int kVec>
__device__ __forceinline__ void SumAcrossWarps(float (&r)[kRegs], float weight, float* shared,
                                               int warp, int lane) {
#pragma unroll
  for (int i = 0; i < kRegs; ++i) shared[warp * kMaxD + LaneElement<kVec>(lane, i)] = r[i] * weight;
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kRegs; ++i) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += shared[w * kMaxD + LaneElement<kVec>(lane, i)];
    r[i] = sum;
  }
  __syncthreads();
}

// Merges the warps' online-softmax states: returns M = max m_w and sets
// *weight = e^{m_w − M} for this warp and *total = Σ_w l_w e^{m_w − M}.
__device__ __forceinline__ float MergeMax(float m, float l, float* shared_m, float* shared_l,
                                          int warp, int lane, float* weight, float* total) {
  if (lane == 0) {
    shared_m[warp] = m;
    shared_l[warp] = l;
  }
  __syncthreads();
  float big = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) big = fmaxf(big, shared_m[w]);
  float sum = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) sum += shared_l[w] * expf(shared_m[w] - big);
  __syncthreads();
  *weight = expf(m - big);
  *total = sum;
  return big;
}

// k_cache[slot, start + t] = k[bos + t] (and v), kVec floats per thread.
template <int kVec>
__global__ void __launch_bounds__(kThreads) AppendKernel(const AttentionParams p) {
  const int64_t row_len = static_cast<int64_t>(p.kv_heads) * p.head_dim;
  const int64_t i = (blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x) * kVec;
  if (i >= p.tokens * row_len) return;
  const int64_t t = i / row_len, e = i - t * row_len;
  const int s = SequenceOf(p.cu_seqlens, p.num_seqs, t);
  const int64_t pos = p.starts[s] + (t - p.cu_seqlens[s]);
  const int64_t at = (p.slots[s] * p.max_context + pos) * row_len + e;
  float v[kVec];
  LoadVec<kVec>(p.k + i, v);
  StoreVec<kVec>(p.k_cache + at, v);
  LoadVec<kVec>(p.v + i, v);
  StoreVec<kVec>(p.v_cache + at, v);
}

// Two blocks per SM: up to 128 registers for kKeys key rows in flight.
template <int kVec>
__global__ void __launch_bounds__(kThreads, 2) AttentionKernel(const AttentionParams p) {
  __shared__ float shared_acc[kWarps * kMaxD];
  __shared__ float shared_m[kWarps], shared_l[kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = blockIdx.x / p.heads;
  const int h = static_cast<int>(blockIdx.x - t * p.heads);
  const int s = SequenceOf(p.cu_seqlens, p.num_seqs, t);
  const int64_t visible = p.starts[s] + (t - p.cu_seqlens[s]) + 1;
  const int64_t row_len = static_cast<int64_t>(p.kv_heads) * p.head_dim;
  const int kvh = h / (p.heads / p.kv_heads);
  const float* k_rows = p.k_cache + p.slots[s] * p.max_context * row_len + kvh * p.head_dim;
  const float* v_rows = p.v_cache + p.slots[s] * p.max_context * row_len + kvh * p.head_dim;
  const int64_t q_at = (t * p.heads + h) * p.head_dim;

  float q[kRegs], acc[kRegs];
  LoadRow<kVec>(p.q + q_at, lane, p.head_dim, q);
#pragma unroll
  for (int i = 0; i < kRegs; ++i) acc[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int64_t j0 = static_cast<int64_t>(warp) * kKeys; j0 < visible; j0 += kWarps * kKeys) {
    float score[kKeys];
    float m_new = m;
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
      score[u] = j0 + u < visible
                     ? p.scale * WarpDot<kVec>(q, k_rows + (j0 + u) * row_len, lane, p.head_dim)
                     : -INFINITY;
      m_new = fmaxf(m_new, score[u]);
    }
    const float correction = expf(m - m_new);
    l *= correction;
#pragma unroll
    for (int i = 0; i < kRegs; ++i) acc[i] *= correction;
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
      if (j0 + u >= visible) break;
      const float weight = expf(score[u] - m_new);
      l += weight;
      float v[kRegs];
      LoadRow<kVec>(v_rows + (j0 + u) * row_len, lane, p.head_dim, v);
#pragma unroll
      for (int i = 0; i < kRegs; ++i) acc[i] = fmaf(weight, v[i], acc[i]);
    }
    m = m_new;
  }

  float weight, total;
  MergeMax(m, l, shared_m, shared_l, warp, lane, &weight, &total);
  SumAcrossWarps<kVec>(acc, weight, shared_acc, warp, lane);
  if (warp != 0) return;
#pragma unroll
  for (int i = 0; i < kRegs; ++i) acc[i] /= total;
  StoreRow<kVec>(p.o + q_at, lane, p.head_dim, acc);
}

template <int kVec>
__global__ void __launch_bounds__(kThreads)
    AttentionQueryGradKernel(const AttentionBackwardParams p) {
  __shared__ float shared_acc[kWarps * kMaxD];
  __shared__ float shared_m[kWarps], shared_l[kWarps], shared_delta[kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t i = blockIdx.x / p.heads;
  const int h = static_cast<int>(blockIdx.x - i * p.heads);
  const int64_t bos = p.cu_seqlens[SequenceOf(p.cu_seqlens, p.num_seqs, i)];
  const int64_t row_len = static_cast<int64_t>(p.kv_heads) * p.head_dim;
  const int kvh = h / (p.heads / p.kv_heads);
  const float* k_rows = p.k + bos * row_len + kvh * p.head_dim;
  const float* v_rows = p.v + bos * row_len + kvh * p.head_dim;
  const int64_t visible = i - bos + 1;
  const int64_t q_at = (i * p.heads + h) * p.head_dim;

  float q[kRegs], d_o[kRegs];
  LoadRow<kVec>(p.q + q_at, lane, p.head_dim, q);
  LoadRow<kVec>(p.d_o + q_at, lane, p.head_dim, d_o);

  // Pass 1: m, l and Σ e^{s−m} dp, online.
  float m = -INFINITY, l = 0.0f, delta = 0.0f;
  for (int64_t j = warp; j < visible; j += kWarps) {
    const float score = p.scale * WarpDot<kVec>(q, k_rows + j * row_len, lane, p.head_dim);
    const float dp = WarpDot<kVec>(d_o, v_rows + j * row_len, lane, p.head_dim);
    const float m_new = fmaxf(m, score);
    const float correction = expf(m - m_new), e = expf(score - m_new);
    l = l * correction + e;
    delta = delta * correction + e * dp;
    m = m_new;
  }
  float weight, total;
  const float big = MergeMax(m, l, shared_m, shared_l, warp, lane, &weight, &total);
  // Δ = Σ_w δ_w e^{m_w − M} / L.
  if (lane == 0) shared_delta[warp] = delta * weight;
  __syncthreads();
  float delta_total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) delta_total += shared_delta[w];
  const float mean_dp = delta_total / total;
  if (threadIdx.x == 0) {
    p.lse[i * p.heads + h] = big + logf(total);
    p.delta[i * p.heads + h] = mean_dp;
  }

  // Pass 2: dq = scale Σ_j p_j (dp_j − Δ) k_j.
  float dq[kRegs];
#pragma unroll
  for (int r = 0; r < kRegs; ++r) dq[r] = 0.0f;
  for (int64_t j = warp; j < visible; j += kWarps) {
    const float* k_row = k_rows + j * row_len;
    const float score = p.scale * WarpDot<kVec>(q, k_row, lane, p.head_dim);
    const float dp = WarpDot<kVec>(d_o, v_rows + j * row_len, lane, p.head_dim);
    const float ds = expf(score - big) / total * (dp - mean_dp) * p.scale;
    float k[kRegs];
    LoadRow<kVec>(k_row, lane, p.head_dim, k);
#pragma unroll
    for (int r = 0; r < kRegs; ++r) dq[r] = fmaf(ds, k[r], dq[r]);
  }
  SumAcrossWarps<kVec>(dq, 1.0f, shared_acc, warp, lane);
  if (warp == 0) StoreRow<kVec>(p.dq + q_at, lane, p.head_dim, dq);
}

template <int kVec>
__global__ void __launch_bounds__(kThreads)
    AttentionKeyGradKernel(const AttentionBackwardParams p) {
  __shared__ float shared_acc[kWarps * kMaxD];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t j = blockIdx.x / p.kv_heads;
  const int kvh = static_cast<int>(blockIdx.x - j * p.kv_heads);
  const int group = p.heads / p.kv_heads;
  const int64_t eos = p.cu_seqlens[SequenceOf(p.cu_seqlens, p.num_seqs, j) + 1];
  const int64_t kv_at = (j * p.kv_heads + kvh) * p.head_dim;

  float k[kRegs], v[kRegs], dk[kRegs], dv[kRegs];
  LoadRow<kVec>(p.k + kv_at, lane, p.head_dim, k);
  LoadRow<kVec>(p.v + kv_at, lane, p.head_dim, v);
#pragma unroll
  for (int r = 0; r < kRegs; ++r) dk[r] = dv[r] = 0.0f;
  const int64_t pairs = (eos - j) * group;
  for (int64_t pair = warp; pair < pairs; pair += kWarps) {
    const int64_t i = j + pair / group;
    const int h = kvh * group + static_cast<int>(pair % group);
    const int64_t q_at = (i * p.heads + h) * p.head_dim;
    float q[kRegs], d_o[kRegs];
    LoadRow<kVec>(p.q + q_at, lane, p.head_dim, q);
    LoadRow<kVec>(p.d_o + q_at, lane, p.head_dim, d_o);
    float score = 0.0f, dp = 0.0f;
#pragma unroll
    for (int r = 0; r < kRegs; ++r) {
      score = fmaf(q[r], k[r], score);
      dp = fmaf(d_o[r], v[r], dp);
    }
    score = p.scale * WarpSum(score);
    dp = WarpSum(dp);
    const float prob = expf(score - p.lse[i * p.heads + h]);
    const float ds = prob * (dp - p.delta[i * p.heads + h]) * p.scale;
#pragma unroll
    for (int r = 0; r < kRegs; ++r) {
      dk[r] = fmaf(ds, q[r], dk[r]);
      dv[r] = fmaf(prob, d_o[r], dv[r]);
    }
  }
  SumAcrossWarps<kVec>(dk, 1.0f, shared_acc, warp, lane);
  SumAcrossWarps<kVec>(dv, 1.0f, shared_acc, warp, lane);
  if (warp != 0) return;
  StoreRow<kVec>(p.dk + kv_at, lane, p.head_dim, dk);
  StoreRow<kVec>(p.dv + kv_at, lane, p.head_dim, dv);
}

}  // namespace

cudaError_t LaunchAttention(const AttentionParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return cudaSuccess;
  const int64_t row_len = static_cast<int64_t>(p.kv_heads) * p.head_dim;
  const bool vec = p.head_dim % 4 == 0 && Aligned16(p.q) && Aligned16(p.k) && Aligned16(p.v) &&
                   Aligned16(p.o) && Aligned16(p.k_cache) && Aligned16(p.v_cache);
  const unsigned rows = static_cast<unsigned>(p.tokens * p.heads);
  if (vec) {
    AppendKernel<4><<<BlocksFor(p.tokens * row_len / 4, kThreads), kThreads, 0, stream>>>(p);
    AttentionKernel<4><<<rows, kThreads, 0, stream>>>(p);
  } else {
    AppendKernel<1><<<BlocksFor(p.tokens * row_len, kThreads), kThreads, 0, stream>>>(p);
    AttentionKernel<1><<<rows, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

cudaError_t LaunchAttentionBackward(const AttentionBackwardParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return cudaSuccess;
  const bool vec = p.head_dim % 4 == 0 && Aligned16(p.q) && Aligned16(p.k) && Aligned16(p.v) &&
                   Aligned16(p.d_o) && Aligned16(p.dq) && Aligned16(p.dk) && Aligned16(p.dv);
  const unsigned q_rows = static_cast<unsigned>(p.tokens * p.heads);
  const unsigned kv_rows = static_cast<unsigned>(p.tokens * p.kv_heads);
  if (vec) {
    AttentionQueryGradKernel<4><<<q_rows, kThreads, 0, stream>>>(p);
    AttentionKeyGradKernel<4><<<kv_rows, kThreads, 0, stream>>>(p);
  } else {
    AttentionQueryGradKernel<1><<<q_rows, kThreads, 0, stream>>>(p);
    AttentionKeyGradKernel<1><<<kv_rows, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace lair::kernels::cuda::dense
