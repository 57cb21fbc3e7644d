// The decay gradient of scan.h (spec §1.7): a per-token term, then a reversed
// cumulative sum over each sequence seeded with the final-state term.
//
// The reversed cumsum is a chunked two-pass scan, parallel over the sequence:
// a CTA owns (sequence, head, tile of up to 32 feature columns) and splits the
// sequence into `segments` contiguous chunks, one thread per (chunk, column):
//   pass 1: each thread sums its chunk;
//   scan:   the chunk totals are suffix-summed in shared memory, seeded with
//           rowsum(dS ⊙ S) of the column (reduced by the same threads);
//   pass 2: each thread walks its chunk backwards from its suffix total.
// Any feature dimension works: columns are tiled over gridDim.x.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/scan.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace lair::kernels::cuda {
namespace {

constexpr int kTermThreads = 256;
constexpr int kScanThreads = 512;
constexpr int kTileCols = 32;

__device__ __forceinline__ void Store4(void* out, ElemType type, int64_t i, float4 v) {
  for (int c = 0; c < 4; ++c) StoreElem(out, type, i + c, (&v.x)[c]);
}

// term[t,h,a] = x·dx − y·dy, or Σ_a of it (one warp per token-head) when
// reducing; four features per lane (dim is a multiple of 4). dx and dy go to
// dx_out and dy_out where those are set.
__global__ void DecayTermKernel(const DecayGradParams p) {
  const int lane = threadIdx.x % 32;
  for (int64_t r = WarpRow(); r < p.tokens * p.heads; r += WarpRowStride()) {
    float part = 0.0f;
    for (int a = 4 * lane; a < p.dim; a += 4 * 32) {
      const int64_t i = r * p.dim + a;
      const float4 x = LoadElem4(p.x.ptr, p.x.type, i / 4),
                   dx = LoadElem4(p.dx.ptr, p.dx.type, i / 4),
                   y = LoadElem4(p.y.ptr, p.y.type, i / 4),
                   dy = LoadElem4(p.dy.ptr, p.dy.type, i / 4);
      if (p.dx_out) Store4(p.dx_out, p.dx_out_type, i, dx);
      if (p.dy_out) Store4(p.dy_out, p.dy_out_type, i, dy);
      const float4 t = make_float4(x.x * dx.x - y.x * dy.x, x.y * dx.y - y.y * dy.y,
                                   x.z * dx.z - y.z * dy.z, x.w * dx.w - y.w * dy.w);
      if (p.reduce_features) {
        part += (t.x + t.y) + (t.z + t.w);
      } else {
        *reinterpret_cast<float4*>(p.out + i) = t;
      }
    }
    if (p.reduce_features) {
      part = WarpSum(part);
      if (lane == 0) p.out[r] = part;
    }
  }
}

// blockDim = (tile, segments); shared memory: segments × tile floats.
__global__ void ReverseCumsumKernel(const DecayGradParams p) {
  extern __shared__ float totals[];  // [segment][column]
  const int cols = p.reduce_features ? 1 : p.dim;
  const int tile = blockDim.x, segments = blockDim.y;
  const int x = threadIdx.x, seg = threadIdx.y;
  const int c = blockIdx.x * tile + x;
  const int h = blockIdx.y, seq = blockIdx.z;
  const bool live = c < cols;
  const int64_t bos = p.cu_seqlens[seq];
  const int64_t len = p.cu_seqlens[seq + 1] - bos;
  const int64_t per = (len + segments - 1) / segments;
  const int64_t t0 = bos + seg * per, t1 = min(t0 + per, bos + len);
  auto at = [&](int64_t t) -> float& { return p.out[(t * p.heads + h) * cols + c]; };

  // Pass 1: chunk sums.
  float sum = 0.0f;
  if (live)
    for (int64_t t = t0; t < t1; ++t) sum += at(t);
  totals[seg * tile + x] = sum;

  // The final-state seed Σ_b dS[a,b]·S[a,b] of column c (all a when reducing),
  // spread over the segment threads and reduced through shared memory.
  float seed = 0.0f;
  if (p.d_state && live) {
    const int64_t base = (static_cast<int64_t>(seq) * p.heads + h) * p.dim * p.other;
    const int a_begin = p.reduce_features ? 0 : c, a_end = p.reduce_features ? p.dim : c + 1;
    const int64_t n = static_cast<int64_t>(a_end - a_begin) * p.other;
    for (int64_t j = seg; j < n; j += segments) {
      const int a = a_begin + static_cast<int>(j / p.other), b = static_cast<int>(j % p.other);
      const int64_t i = base + (p.transposed ? static_cast<int64_t>(b) * p.dim + a
                                             : static_cast<int64_t>(a) * p.other + b);
      seed += p.d_state[i] * p.state[i];
    }
  }
  __syncthreads();

  // Scan: thread (x, 0) turns the chunk totals into suffix sums, exclusive of
  // the chunk itself, after reducing the seed parts (kept in place of sums).
  float* seeds = totals + segments * tile;
  seeds[seg * tile + x] = seed;
  __syncthreads();
  if (seg == 0) {
    float run = 0.0f;
    for (int s = 0; s < segments; ++s) run += seeds[s * tile + x];
    for (int s = segments - 1; s >= 0; --s) {
      const float chunk = totals[s * tile + x];
      totals[s * tile + x] = run;
      run += chunk;
    }
  }
  __syncthreads();

  // Pass 2: in-chunk reversed cumsum from the suffix total.
  if (!live) return;
  float run = totals[seg * tile + x];
  for (int64_t t = t1 - 1; t >= t0; --t) {
    run += at(t);
    at(t) = run;
  }
}

}  // namespace

cudaError_t LaunchDecayGrad(const DecayGradParams& p, cudaStream_t stream) {
  if (p.num_seqs == 0) return cudaSuccess;
  if (p.dim < 1 || p.dim % 4 != 0 || p.heads < 1 || (p.d_state && p.other < 1))
    return cudaErrorInvalidValue;
  cudaError_t err = cudaSuccess;
  if (p.tokens > 0) {
    DecayTermKernel<<<Blocks(p.tokens * p.heads, kTermThreads / 32), kTermThreads, 0, stream>>>(p);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  const int cols = p.reduce_features ? 1 : p.dim;
  const int tile = cols < kTileCols ? cols : kTileCols;
  const int segments = kScanThreads / tile;
  const size_t smem = 2 * static_cast<size_t>(segments) * tile * sizeof(float);
  ReverseCumsumKernel<<<dim3((cols + tile - 1) / tile, p.heads, p.num_seqs), dim3(tile, segments),
                        smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace lair::kernels::cuda
