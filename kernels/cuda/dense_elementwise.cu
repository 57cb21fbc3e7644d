// Elementwise and data-movement kernels of CudaDenseOps: Unary (+backward),
// Binary with broadcasting, ReduceSum, CopyColumns, Embedding (+backward) and
// Rotary, plus the column-sum finisher shared with norm and conv. Memory-bound
// loops over a flat index; same-shape operands go 16 bytes per thread when
// sizes and pointers allow it.
#include <algorithm>

#include "kernels/cuda/dense_common.cuh"
#include "kernels/cuda/dense_launch.h"
#include "kernels/cuda/dependent_launch.cuh"

namespace lair::kernels::cuda::dense {
namespace {

constexpr int kThreads = 256;
// Grid-stride loops cap the grid here (≥ 8 resident blocks on every SM).
constexpr int64_t kMaxBlocks = 1 << 16;

unsigned GridFor(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? (blocks > 0 ? blocks : 1) : kMaxBlocks);
}

__device__ __forceinline__ int64_t GlobalThread() {
  return blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
}
__device__ __forceinline__ int64_t GridThreads() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// Offsets of output element i in operands a and b.
__device__ __forceinline__ void BroadcastOffsets(const BroadcastIndex& ix, int64_t i, int64_t* oa,
                                                 int64_t* ob) {
  int64_t a = 0, b = 0;
#pragma unroll
  for (int d = kMaxRank - 1; d >= 0; --d) {
    if (d < ix.rank) {
      const int64_t c = i % ix.shape[d];
      i /= ix.shape[d];
      a += c * ix.stride_a[d];
      b += c * ix.stride_b[d];
    }
  }
  *oa = a;
  *ob = b;
}

// y = α·f(s·x) + β, kVec elements per step (same shapes when kVec == 4).
template <int kVec>
__global__ void __launch_bounds__(kThreads) UnaryKernel(const UnaryParams p) {
  AllowDependents();
  WaitForPrerequisites();
  for (int64_t i = GlobalThread() * kVec; i < p.count; i += GridThreads() * kVec) {
    float v[kVec];
    if constexpr (kVec == 1) {
      int64_t ox = i, unused;
      if (p.broadcast) BroadcastOffsets(p.index, i, &ox, &unused);
      v[0] = p.x[ox];
    } else {
      LoadVec<kVec>(p.x + i, v);
    }
#pragma unroll
    for (int e = 0; e < kVec; ++e) v[e] = p.alpha * ApplyUnary(p.op, p.in_scale * v[e]) + p.beta;
    StoreVec<kVec>(p.y + i, v);
  }
}

// dx = d_y · α · s · f'(s·x).
template <int kVec>
__global__ void __launch_bounds__(kThreads) UnaryBackwardKernel(const UnaryBackwardParams p) {
  const float scale = p.alpha * p.in_scale;
  for (int64_t i = GlobalThread() * kVec; i < p.count; i += GridThreads() * kVec) {
    float x[kVec], dy[kVec];
    LoadVec<kVec>(p.x + i, x);
    LoadVec<kVec>(p.d_y + i, dy);
#pragma unroll
    for (int e = 0; e < kVec; ++e) x[e] = dy[e] * scale * UnaryDerivative(p.op, p.in_scale * x[e]);
    StoreVec<kVec>(p.dx + i, x);
  }
}

// y = a ∘ b.
template <int kVec>
__global__ void __launch_bounds__(kThreads) BinaryKernel(const BinaryParams p) {
  AllowDependents();
  WaitForPrerequisites();
  for (int64_t i = GlobalThread() * kVec; i < p.count; i += GridThreads() * kVec) {
    float a[kVec], b[kVec];
    if constexpr (kVec == 1) {
      int64_t oa = i, ob = i;
      if (p.broadcast) BroadcastOffsets(p.index, i, &oa, &ob);
      a[0] = p.a[oa];
      b[0] = p.b[ob];
    } else {
      LoadVec<kVec>(p.a + i, a);
      LoadVec<kVec>(p.b + i, b);
    }
#pragma unroll
    for (int e = 0; e < kVec; ++e) a[e] = ApplyBinary(p.op, a[e], b[e]);
    StoreVec<kVec>(p.y + i, a);
  }
}

__device__ __forceinline__ int64_t Offset(int rank, const int64_t* shape, const int64_t* stride,
                                          int64_t i) {
  int64_t off = 0;
#pragma unroll
  for (int d = kMaxRank - 1; d >= 0; --d) {
    if (d < rank) {
      off += (i % shape[d]) * stride[d];
      i /= shape[d];
    }
  }
  return off;
}

// One thread per (output o, split): Σ over its chunk of the reduced range, in
// double. The innermost reduced dim is walked without division.
__global__ void __launch_bounds__(kThreads) ReduceSumKernel(const ReduceSumParams p) {
  const int64_t o = GlobalThread();
  if (o >= p.outputs) return;
  const int split = blockIdx.y;
  const int64_t chunk = (p.reduce_count + p.splits - 1) / p.splits;
  const int64_t lo = split * chunk;
  const int64_t hi = lo + chunk < p.reduce_count ? lo + chunk : p.reduce_count;
  const float* x = p.x + Offset(p.kept_rank, p.kept_shape, p.kept_stride, o);
  double sum = 0.0;
  int64_t r = lo;
  while (r < hi) {
    const int64_t outer = r / p.inner_count;
    const int64_t stop = (outer + 1) * p.inner_count < hi ? (outer + 1) * p.inner_count : hi;
    const float* row = x + Offset(p.outer_rank, p.outer_shape, p.outer_stride, outer) +
                       (r - outer * p.inner_count) * p.inner_stride;
    for (; r < stop; ++r, row += p.inner_stride) sum += *row;
  }
  if (p.splits == 1) {
    p.y[o] = static_cast<float>(sum);
  } else {
    p.partial[split * p.outputs + o] = sum;
  }
}

__global__ void __launch_bounds__(kThreads)
    FinishColumnSumsKernel(const double* partial, int splits, int64_t count, float* out,
                           int64_t split_at, float* out_b, bool accumulate) {
  const int64_t o = GlobalThread();
  if (o >= count) return;
  double sum = 0.0;
  for (int s = 0; s < splits; ++s) sum += partial[s * count + o];
  StoreColumnSum(sum, o, out, split_at, out_b, accumulate);
}

// dst[r, dst_col + j] (+)= src[r, src_col + j], kVec columns per step; rows
// along grid y, columns along grid x (no index division).
template <int kVec>
__global__ void __launch_bounds__(kThreads) CopyColumnsKernel(const CopyColumnsParams p) {
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const float* src = p.src + r * p.src_cols + p.src_col;
    float* dst = p.dst + r * p.dst_cols + p.dst_col;
    for (int64_t j = GlobalThread() * kVec; j < p.width; j += GridThreads() * kVec) {
      float v[kVec];
      LoadVec<kVec>(src + j, v);
      if (p.accumulate) {
        float d[kVec];
        LoadVec<kVec>(dst + j, d);
#pragma unroll
        for (int e = 0; e < kVec; ++e) v[e] += d[e];
      }
      StoreVec<kVec>(dst + j, v);
    }
  }
}

// out[i,:] = table[ids[i],:]; an id out of range writes NaN and flags.
template <int kVec>
__global__ void __launch_bounds__(kThreads) EmbeddingKernel(const EmbeddingParams p) {
  const int64_t vecs_per_row = p.width / kVec;
  for (int64_t i = GlobalThread(); i < p.count * vecs_per_row; i += GridThreads()) {
    const int64_t r = i / vecs_per_row, j = (i - r * vecs_per_row) * kVec;
    const int32_t id = p.ids[r];
    float v[kVec];
    if (id >= 0 && id < p.rows) {
      LoadVec<kVec>(p.table + id * p.width + j, v);
    } else {
#pragma unroll
      for (int e = 0; e < kVec; ++e) v[e] = NAN;
      if (j == 0) atomicOr(p.fault, kFaultEmbeddingIds);
    }
    StoreVec<kVec>(p.out + r * p.width + j, v);
  }
}

// d_table[ids[i],:] += d_out[i,:] (atomics: repeated ids add up).
__global__ void __launch_bounds__(kThreads)
    EmbeddingBackwardKernel(const EmbeddingBackwardParams p) {
  for (int64_t i = GlobalThread(); i < p.count * p.width; i += GridThreads()) {
    const int64_t r = i / p.width, j = i - r * p.width;
    const int32_t id = p.ids[r];
    if (id >= 0 && id < p.rows) {
      atomicAdd(p.d_table + id * p.width + j, p.d_out[i]);
    } else if (j == 0) {
      atomicOr(p.fault, kFaultEmbeddingBackwardIds);
    }
  }
}

// Per (token, head): pair i < R/2 rotated by ±θ_i = pos·inv_freq[i]; features
// past rotary_dim copied. Each thread reads its elements before writing them,
// so y may alias x.
__global__ void __launch_bounds__(kThreads) RotaryKernel(const __grid_constant__ RotaryParams p) {
  const int half = p.rotary_dim / 2;
  const int per_head = half + (p.dim - p.rotary_dim);
  const int64_t total = p.tokens * p.heads * per_head;
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int64_t row = i / per_head;
    const int j = static_cast<int>(i - row * per_head);
    const float* x = p.x + row * p.dim;
    float* y = p.y + row * p.dim;
    if (j >= half) {
      const int f = p.rotary_dim + (j - half);
      y[f] = x[f];
      continue;
    }
    const float pos = static_cast<float>(p.positions[row / p.heads]);
    const float angle = pos * p.inv_freq[j];
    const float cos_t = cosf(angle);
    const float sin_t = p.inverse ? -sinf(angle) : sinf(angle);
    const int i0 = p.interleaved ? 2 * j : j;
    const int i1 = p.interleaved ? 2 * j + 1 : j + half;
    const float x0 = x[i0], x1 = x[i1];
    y[i0] = x0 * cos_t - x1 * sin_t;
    y[i1] = x0 * sin_t + x1 * cos_t;
  }
}

}  // namespace

cudaError_t LaunchFinishColumnSums(const double* partial, int splits, int64_t count, float* out,
                                   int64_t split_at, float* out_b, bool accumulate,
                                   cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  FinishColumnSumsKernel<<<BlocksFor(count, kThreads), kThreads, 0, stream>>>(
      partial, splits, count, out, split_at, out_b, accumulate);
  return cudaGetLastError();
}

cudaError_t LaunchUnary(const UnaryParams& p, cudaStream_t stream) {
  if (p.count == 0) return cudaSuccess;
  if (!p.broadcast && p.count % 4 == 0 && Aligned16(p.x) && Aligned16(p.y)) {
    return LaunchDependent(UnaryKernel<4>, GridFor(p.count / 4), kThreads, stream, p);
  }
  return LaunchDependent(UnaryKernel<1>, GridFor(p.count), kThreads, stream, p);
}

cudaError_t LaunchUnaryBackward(const UnaryBackwardParams& p, cudaStream_t stream) {
  if (p.count == 0) return cudaSuccess;
  if (p.count % 4 == 0 && Aligned16(p.x) && Aligned16(p.d_y) && Aligned16(p.dx)) {
    UnaryBackwardKernel<4><<<GridFor(p.count / 4), kThreads, 0, stream>>>(p);
  } else {
    UnaryBackwardKernel<1><<<GridFor(p.count), kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

cudaError_t LaunchBinary(const BinaryParams& p, cudaStream_t stream) {
  if (p.count == 0) return cudaSuccess;
  if (!p.broadcast && p.count % 4 == 0 && Aligned16(p.a) && Aligned16(p.b) && Aligned16(p.y)) {
    return LaunchDependent(BinaryKernel<4>, GridFor(p.count / 4), kThreads, stream, p);
  }
  return LaunchDependent(BinaryKernel<1>, GridFor(p.count), kThreads, stream, p);
}

cudaError_t LaunchReduceSum(const ReduceSumParams& p, cudaStream_t stream) {
  if (p.outputs == 0) return cudaSuccess;
  const dim3 grid(BlocksFor(p.outputs, kThreads), static_cast<unsigned>(p.splits));
  ReduceSumKernel<<<grid, kThreads, 0, stream>>>(p);
  if (p.splits == 1) return cudaGetLastError();
  return LaunchFinishColumnSums(p.partial, p.splits, p.outputs, p.y, p.outputs, nullptr, false,
                                stream);
}

cudaError_t LaunchCopyColumns(const CopyColumnsParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.width == 0) return cudaSuccess;
  const bool vec = p.width % 4 == 0 && p.src_cols % 4 == 0 && p.dst_cols % 4 == 0 &&
                   p.src_col % 4 == 0 && p.dst_col % 4 == 0 && Aligned16(p.src) && Aligned16(p.dst);
  const int kvec = vec ? 4 : 1;
  const dim3 grid(GridFor(p.width / kvec), static_cast<unsigned>(std::min<int64_t>(p.rows, 65535)));
  if (vec) {
    CopyColumnsKernel<4><<<grid, kThreads, 0, stream>>>(p);
  } else {
    CopyColumnsKernel<1><<<grid, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

cudaError_t LaunchEmbedding(const EmbeddingParams& p, cudaStream_t stream) {
  if (p.count == 0 || p.width == 0) return cudaSuccess;
  if (p.width % 4 == 0 && Aligned16(p.table) && Aligned16(p.out)) {
    EmbeddingKernel<4><<<GridFor(p.count * p.width / 4), kThreads, 0, stream>>>(p);
  } else {
    EmbeddingKernel<1><<<GridFor(p.count * p.width), kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingBackward(const EmbeddingBackwardParams& p, cudaStream_t stream) {
  if (p.count == 0 || p.width == 0) return cudaSuccess;
  EmbeddingBackwardKernel<<<GridFor(p.count * p.width), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchRotary(const RotaryParams& p, cudaStream_t stream) {
  const int64_t total = p.tokens * p.heads * (p.dim - p.rotary_dim / 2);
  if (total == 0) return cudaSuccess;
  RotaryKernel<<<GridFor(total), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace lair::kernels::cuda::dense
