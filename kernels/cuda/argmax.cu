// Row argmax: each thread scans a strided share of the row, then the block
// reduces (value, index) pairs, larger value first, smaller index on ties,
// which is std::max_element's answer.
#include <cfloat>

#include "kernels/cuda/argmax.h"

namespace lair::kernels::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

// Whether (v, i) beats (best, best_i).
__device__ __forceinline__ bool Beats(float v, int64_t i, float best, int64_t best_i) {
  return v > best || (v == best && i < best_i);
}

__global__ void __launch_bounds__(kThreads)
    ArgmaxRowsKernel(const float* logits, int64_t vocab, int32_t* ids) {
  const float* row = logits + blockIdx.x * vocab;
  float best = -FLT_MAX;
  int64_t best_i = vocab;  // no candidate yet: loses every tie
  for (int64_t j = threadIdx.x; j < vocab; j += kThreads) {
    const float v = row[j];
    if (Beats(v, j, best, best_i)) {
      best = v;
      best_i = j;
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const float v = __shfl_down_sync(0xffffffffu, best, offset);
    const int64_t i = __shfl_down_sync(0xffffffffu, best_i, offset);
    if (Beats(v, i, best, best_i)) {
      best = v;
      best_i = i;
    }
  }
  __shared__ float warp_best[kWarps];
  __shared__ int64_t warp_index[kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    warp_best[warp] = best;
    warp_index[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWarps; ++w) {
      if (Beats(warp_best[w], warp_index[w], best, best_i)) {
        best = warp_best[w];
        best_i = warp_index[w];
      }
    }
    // A row of NaN and -inf only: index 0, as max_element would return.
    ids[blockIdx.x] = static_cast<int32_t>(best_i < vocab ? best_i : 0);
  }
}

}  // namespace

cudaError_t LaunchArgmaxRows(const float* logits, int64_t rows, int64_t vocab, int32_t* ids,
                             cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  ArgmaxRowsKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, vocab, ids);
  return cudaGetLastError();
}

}  // namespace lair::kernels::cuda
