// Sums and maxima over a warp's 32 lanes by the xor butterfly (offsets 16 to
// 1): every lane gets the result, and every kernel that reduces a warp takes
// the same order of additions, so their results agree bit for bit. All 32
// lanes must call them together.
#pragma once

#include <cuda_runtime.h>

namespace lair::kernels::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

}  // namespace lair::kernels::cuda
