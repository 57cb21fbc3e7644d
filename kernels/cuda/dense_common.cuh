// Device helpers shared by the dense kernels (dense_*.cu): block reductions
// (over warp_reduce.cuh's), the sequence of a packed token, 16-byte vector access, packing
// four floats into 16 bits each, and the column-sum finisher; the elementwise functions come from
// kernels/elementwise_math.h, shared with the CPU reference.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/warp_reduce.cuh"
#include "kernels/elementwise_math.h"

namespace lair::kernels::cuda::dense {

// Σ over a team of kTeam threads: one warp (32) or the whole block (a multiple
// of 32, kTeam/32 floats of `shared`). Every thread of the team gets the sum.
template <int kTeam>
__device__ __forceinline__ float TeamSum(float v, float* shared) {
  v = WarpSum(v);
  if constexpr (kTeam > 32) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // earlier readers of `shared` are done
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = 0.0f;
#pragma unroll
    for (int w = 0; w < kTeam / 32; ++w) v += shared[w];
  }
  return v;
}

// The sequence s with cu_seqlens[s] ≤ token < cu_seqlens[s + 1] (empty
// sequences are skipped: the last offset not above `token`).
__device__ __forceinline__ int SequenceOf(const int32_t* cu_seqlens, int num_seqs, int64_t token) {
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu_seqlens[mid] <= token) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// kVec consecutive floats at p (16-byte aligned when kVec == 4).
template <int kVec>
__device__ __forceinline__ void LoadVec(const float* p, float (&v)[kVec]) {
  if constexpr (kVec == 4) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = p[i];
  }
}

template <int kVec>
__device__ __forceinline__ void StoreVec(float* p, const float (&v)[kVec]) {
  if constexpr (kVec == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) p[i] = v[i];
  }
}

// Four floats as four T (__nv_bfloat16 or __half), rounded to nearest, in
// one 8-byte word; and back.
template <typename T>
__device__ __forceinline__ uint2 PackFour(float4 v) {
  using Pair = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  Pair pairs[2];
  if constexpr (std::is_same_v<T, __half>) {
    pairs[0] = __floats2half2_rn(v.x, v.y);
    pairs[1] = __floats2half2_rn(v.z, v.w);
  } else {
    pairs[0] = __floats2bfloat162_rn(v.x, v.y);
    pairs[1] = __floats2bfloat162_rn(v.z, v.w);
  }
  return *reinterpret_cast<const uint2*>(pairs);
}
template <typename T>
__device__ __forceinline__ float4 UnpackFour(uint2 word) {
  float2 lo, hi;
  if constexpr (std::is_same_v<T, __half>) {
    lo = __half22float2(*reinterpret_cast<const __half2*>(&word.x));
    hi = __half22float2(*reinterpret_cast<const __half2*>(&word.y));
  } else {
    lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&word.x));
    hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&word.y));
  }
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline unsigned BlocksFor(int64_t work, int threads) {
  return static_cast<unsigned>((work + threads - 1) / threads);
}

// out[o] (+)= Σ_s partial[s·count + o] for o < count, summed in double in
// split order: the second stage of the deterministic column sums. Entries
// o ≥ split_at go to out_b[o − split_at] (conv: d_bias after d_weight).
// Defined in dense_elementwise.cu.
cudaError_t LaunchFinishColumnSums(const double* partial, int splits, int64_t count, float* out,
                                   int64_t split_at, float* out_b, bool accumulate,
                                   cudaStream_t stream);

// Where a column sum's value goes when the sum is not split: out[o] or
// out_b[o − split_at], added or stored.
__device__ __forceinline__ void StoreColumnSum(double sum, int64_t o, float* out, int64_t split_at,
                                               float* out_b, bool accumulate) {
  float* dst = o < split_at ? out + o : out_b + (o - split_at);
  *dst = accumulate ? *dst + static_cast<float>(sum) : static_cast<float>(sum);
}

}  // namespace lair::kernels::cuda::dense
