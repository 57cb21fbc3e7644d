// Softmax cross-entropy per row (kernels/dense.h CrossEntropyArgs), one block
// per row:
//   pass 1, online over the row: m = max, l = Σ e^{x−m} (per thread, then
//           merged across the block), lse = m + log l;
//   loss = lse − x[target];
//   pass 2: d_logits[j] = grad_scale · (e^{x_j − lse} − [j = target]).
// 16-byte loads when the vocabulary and pointers allow. A target outside
// [0, V) gives NaN in its loss and gradient row and sets the fault bit.
#include "kernels/cuda/dense_common.cuh"
#include "kernels/cuda/dense_launch.h"

namespace lair::kernels::cuda::dense {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// (m, l) ← the merge of two online-softmax partials; empty ones have m = −∞.
__device__ __forceinline__ void MergeSoftmax(float* m, float* l, float m2, float l2) {
  const float big = fmaxf(*m, m2);
  if (big == -INFINITY) return;
  *l = *l * expf(*m - big) + l2 * expf(m2 - big);
  *m = big;
}

template <int kVec>
__global__ void __launch_bounds__(kThreads) CrossEntropyKernel(const CrossEntropyParams p) {
  __shared__ float shared_m[kWarps], shared_l[kWarps];
  const int64_t row = blockIdx.x;
  const float* x = p.logits + row * p.vocab;
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = threadIdx.x * kVec; j < p.vocab; j += kThreads * kVec) {
    float v[kVec];
    LoadVec<kVec>(x + j, v);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      if (v[e] > m) {
        l = l * expf(m - v[e]) + 1.0f;
        m = v[e];
      } else {
        l += expf(v[e] - m);
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    MergeSoftmax(&m, &l, __shfl_xor_sync(kFullMask, m, o), __shfl_xor_sync(kFullMask, l, o));
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    shared_m[warp] = m;
    shared_l[warp] = l;
  }
  __syncthreads();
  m = shared_m[0];
  l = shared_l[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) MergeSoftmax(&m, &l, shared_m[w], shared_l[w]);
  const float lse = m + logf(l);

  const int32_t target = p.targets[row];
  const bool valid = target >= 0 && target < p.vocab;
  if (threadIdx.x == 0) {
    p.losses[row] = valid ? lse - x[target] : NAN;
    if (!valid) atomicOr(p.fault, kFaultCrossEntropyTargets);
  }
  if (p.d_logits == nullptr) return;
  float* d = p.d_logits + row * p.vocab;
  for (int64_t j = threadIdx.x * kVec; j < p.vocab; j += kThreads * kVec) {
    float v[kVec];
    LoadVec<kVec>(x + j, v);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const float onehot = j + e == target ? 1.0f : 0.0f;
      v[e] = valid ? p.grad_scale * (expf(v[e] - lse) - onehot) : NAN;
    }
    StoreVec<kVec>(d + j, v);
  }
}

}  // namespace

cudaError_t LaunchCrossEntropy(const CrossEntropyParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  const unsigned rows = static_cast<unsigned>(p.rows);
  if (p.vocab % 4 == 0 && Aligned16(p.logits) && (p.d_logits == nullptr || Aligned16(p.d_logits))) {
    CrossEntropyKernel<4><<<rows, kThreads, 0, stream>>>(p);
  } else {
    CrossEntropyKernel<1><<<rows, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace lair::kernels::cuda::dense
