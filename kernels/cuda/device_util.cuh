// Device helpers shared by the CUDA mixer kernels: the walk of a copy
// loop's pieces, typed element access and the per-token gate reader of
// scan.h's LogGate.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstring>

#include "kernels/cuda/scan.h"

namespace lair::kernels::cuda {

// The pieces idx = start + n·step (n = 0, 1, ...) of a grid `width` pieces
// wide, as (row, col): a chunk's copy loops walk them with the CTA's
// threads. Advancing adds, where idx / width and idx % width would cost
// an integer division per piece (widths like dk are not compile-time constants).
struct GridWalk {
  int row, col;
  int width, row_step, col_step;
  __device__ GridWalk(int start, int width, int step)
      : row(start / width),
        col(start % width),
        width(width),
        row_step(step / width),
        col_step(step % width) {}
  __device__ void Next() {
    row += row_step;
    col += col_step;
    if (col >= width) col -= width, ++row;
  }
};

__device__ __forceinline__ float LoadElem(const void* p, ElemType t, int64_t i) {
  switch (t) {
    case ElemType::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case ElemType::kF16:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void StoreElem(void* p, ElemType t, int64_t i, float x) {
  switch (t) {
    case ElemType::kBF16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x);
      break;
    case ElemType::kF16:
      static_cast<__half*>(p)[i] = __float2half_rn(x);
      break;
    default:
      static_cast<float*>(p)[i] = x;
  }
}

// Elements 4q .. 4q + 3 of p ← v (p 16-byte aligned for fp32, 8 for 16-bit
// types): one vector store.
__device__ __forceinline__ void StoreElem4(void* p, ElemType t, int64_t q, float4 v) {
  switch (t) {
    case ElemType::kBF16: {
      const __nv_bfloat162 pairs[2] = {__floats2bfloat162_rn(v.x, v.y),
                                       __floats2bfloat162_rn(v.z, v.w)};
      static_cast<uint2*>(p)[q] = *reinterpret_cast<const uint2*>(pairs);
      break;
    }
    case ElemType::kF16: {
      const __half2 pairs[2] = {__floats2half2_rn(v.x, v.y), __floats2half2_rn(v.z, v.w)};
      static_cast<uint2*>(p)[q] = *reinterpret_cast<const uint2*>(pairs);
      break;
    }
    default:
      static_cast<float4*>(p)[q] = v;
  }
}

// CTAs of per_block items for n items: at least one, and at most 65535·16.
inline int Blocks(int64_t n, int per_block) {
  const int64_t b = (n + per_block - 1) / per_block;
  return static_cast<int>(b < 65535 * 16 ? (b > 0 ? b : 1) : 65535 * 16);
}

// The rows of a one-warp-per-row kernel: a warp takes rows WarpRow(),
// WarpRow() + WarpRowStride(), ..., since Blocks caps the grid and a launch
// may hold fewer warps than rows. Uniform across a warp, so its shuffles
// stay whole.
__device__ __forceinline__ int64_t WarpRow() {
  return blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
}
__device__ __forceinline__ int64_t WarpRowStride() {
  return static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
}

// Whether StoreElem4 may store to p.
inline bool Elem4Aligned(const void* p, ElemType t) {
  return reinterpret_cast<uintptr_t>(p) % (t == ElemType::kF32 ? 16 : 8) == 0;
}

__device__ __forceinline__ float2 PairToFloat2(__nv_bfloat162 pair) {
  return __bfloat1622float2(pair);
}
__device__ __forceinline__ float2 PairToFloat2(__half2 pair) { return __half22float2(pair); }

// The four 16-bit values (two Pairs) of raw as floats.
template <typename Pair>
__device__ __forceinline__ float4 QuadToFloat4(uint2 raw) {
  Pair pairs[2];
  memcpy(pairs, &raw, 8);
  const float2 a = PairToFloat2(pairs[0]), b = PairToFloat2(pairs[1]);
  return make_float4(a.x, a.y, b.x, b.y);
}

// The four 16-bit values of raw (t bf16, else f16) as floats.
__device__ __forceinline__ float4 SixteenBitQuad(uint2 raw, ElemType t) {
  return t == ElemType::kBF16 ? QuadToFloat4<__nv_bfloat162>(raw) : QuadToFloat4<__half2>(raw);
}

// Elements 4q .. 4q + 3 of p as floats (p aligned as Elem4Aligned says):
// one vector load.
__device__ __forceinline__ float4 LoadElem4(const void* p, ElemType t, int64_t q) {
  if (t == ElemType::kF32) return static_cast<const float4*>(p)[q];
  return SixteenBitQuad(static_cast<const uint2*>(p)[q], t);
}

// kN (1 or 4) consecutive elements i .. i + kN − 1 of p as floats; at kN = 4
// one vector access (i a multiple of 4, p aligned as Elem4Aligned says), so
// that a warp walking a row kN elements a lane moves 128 or 256 bytes an
// instruction.
template <int kN>
__device__ __forceinline__ void LoadElems(const void* p, ElemType t, int64_t i, float (&x)[kN]) {
  static_assert(kN == 1 || kN == 4);
  if constexpr (kN == 1) {
    x[0] = LoadElem(p, t, i);
  } else {
    const float4 v = LoadElem4(p, t, i / 4);
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
  }
}
template <int kN>
__device__ __forceinline__ void StoreElems(void* p, ElemType t, int64_t i, const float (&x)[kN]) {
  static_assert(kN == 1 || kN == 4);
  if constexpr (kN == 1) {
    StoreElem(p, t, i, x[0]);
  } else {
    StoreElem4(p, t, i / 4, make_float4(x[0], x[1], x[2], x[3]));
  }
}

// log σ(x) without overflow on either side.
__device__ __forceinline__ float LogSigmoid(float x) {
  return x >= 0.0f ? -log1pf(expf(-x)) : x - log1pf(expf(x));
}

// The gate of local token t (original time order) of a sequence starting at
// token bos with len tokens; `feature` indexes vector gates (0 otherwise).
__device__ __forceinline__ float GateAt(const LogGate& g, int64_t bos, int len, int t, int h,
                                        int feature) {
  if (g.ptr == nullptr) return 0.0f;
  if (g.shift) {
    if (t + 1 >= len) return 0.0f;  // L+[n] = 1: log-decay 0 past the end
    ++t;
  }
  const float x = g.ptr[(bos + t) * static_cast<int64_t>(g.token_stride) +
                        static_cast<int64_t>(h) * g.head_stride + feature];
  return g.fn == GateFn::kLogSigmoid ? LogSigmoid(x) : x;
}

}  // namespace lair::kernels::cuda
