// Decode products whose inner dimension is at most kNarrowK (a low-rank
// gate's up-projection: GLA's gk_proj.1 has k = 16), for more rows than the
// GEMV takes, in fp32 arithmetic (exact, so both precisions take it).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/dense_small_gemm_common.cuh"
#include "kernels/cuda/dependent_launch.cuh"

namespace lair::kernels::cuda::dense::small_product {
namespace {

// One thread per output (activation row r, weight row j of the launch's
// concatenated members), j fastest, so a warp reads consecutive weight rows
// and one activation row. The tiled kernels would pad k to their step of 32
// or 64 and keep their pipelines for one step: on an H100 the k = 16
// product of GLA 1.3B cost 7.5 µs of a replayed batch-32 step that way
// (docs/benchmarks.md), against about 1.2 µs for the GEMV at batch 1.
constexpr int kThreads = 256;
constexpr int kVectors = kNarrowK / 8;  // 16-byte weight vectors per row at most

// Launched as a dependent: a thread's weights are loaded before the wait for
// the kernel that writes the activations.
template <typename T>
__global__ void __launch_bounds__(kThreads) NarrowKKernel(const SmallGroup<T> g) {
  AllowDependents();
  const int64_t rows = g.first_row[g.count];
  const int64_t index = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x;
  if (index >= rows * g.m) return;
  const int64_t r = index / rows, row = index - r * rows;
  const int member = MemberOf(g.first_row, g.count, row);
  const int64_t j = row - Select(g.first_row, member);
  const int vectors = static_cast<int>(g.k / 8);
  const uint4* w = reinterpret_cast<const uint4*>(Select(g.w, member) + j * g.k);
  uint4 weights[kVectors];
#pragma unroll
  for (int v = 0; v < kVectors; ++v) weights[v] = v < vectors ? __ldg(w + v) : uint4{};
  WaitForPrerequisites();  // a (and c when beta ≠ 0) come from earlier kernels
  const float4* a = reinterpret_cast<const float4*>(g.a + r * g.k);
  float sum = 0.0f;
#pragma unroll
  for (int v = 0; v < kVectors; ++v) {
    if (v >= vectors) break;
    const float4 x0 = __ldg(a + 2 * v), x1 = __ldg(a + 2 * v + 1);
    float2 wf[4];
    Widen8<T>(weights[v], wf);
    sum += Dot8(wf, x0, x1);
  }
  const Output out = OutputOf(g, member);
  Store(g.alpha, g.beta, out, r, j, sum, PriorOf(g.beta, out, r, j));
}

}  // namespace

template <typename T>
cudaError_t LaunchNarrowK(const SmallGroup<T>& g, cudaStream_t stream) {
  const int64_t outputs = g.first_row[g.count] * g.m;
  return LaunchDependent(NarrowKKernel<T>,
                         dim3(static_cast<unsigned>((outputs + kThreads - 1) / kThreads)),
                         dim3(kThreads), stream, g);
}

template cudaError_t LaunchNarrowK<__nv_bfloat16>(const SmallGroup<__nv_bfloat16>& g,
                                                  cudaStream_t stream);
template cudaError_t LaunchNarrowK<__half>(const SmallGroup<__half>& g, cudaStream_t stream);

}  // namespace lair::kernels::cuda::dense::small_product
