// Decode products of kWideRows + 1 to kPipeRows activation rows on tensor
// cores, with weights and activations streamed through shared memory (sm_90).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cuda/dense_small_gemm_common.cuh"
#include "kernels/cuda/dependent_launch.cuh"

namespace lair::kernels::cuda::dense::small_product {
namespace {

// Tensor-core product for 17 to kPipeRows activation rows: the same mma and
// k permutation, with weights and activations streamed through a ring of
// kPipeStages shared-memory stages by cp.async, so each SM keeps tens of KB
// in flight without holding them in registers (the register-fed kernels of
// dense_small_gemm_mma.cu lost to cuBLASLt from 32 rows on for want of bytes
// in flight).
//
// A stage is kStageK columns of the CTA's kPipeCtaOutputs weight rows and
// of the activation rows: the weights and the rounded activations in
// 128-byte rows, the fp32 activations as copied. A lane reads 16 bytes of
// rows gid and gid + 8 at chunk 4·s + tig of a row (s the 32-k step):
// XOR-ing the chunk with 4 on odd rows puts the eight lanes of each quarter
// warp (rows 2q and 2q + 1) on 32 distinct banks.
//
// In stage i each thread waits for its own copies of stage i, rounds the
// activation quads it copied, and one barrier publishes the stage (and
// frees the slot of stage i − 1, which the copies of stage i + kPipeStages
// − 1 take).
//
// On an H100 (decode, A/B in one call against bf16 cuBLASLt after a
// rounding pass) this gained 4–9% at 24 rows and 1–5% at 32 (GLA and GSA
// 1.3B). It is still far from the copy bandwidth: under Nsight Compute a
// GLA 1.3B step's 121 products at 32 rows took 2,320 µs, about 1.2 TB/s
// (the gate/up product about 1.6 TB/s). Loading the fp32 activations
// through registers a stage ahead measured the same (2,368 µs), and with
// eight activation tiles that version lost 11% to cuBLASLt at 64 rows; the
// fp32 staging here leaves two CTAs per SM room for four tiles only.
constexpr int kPipeWarps = 8;
constexpr int kPipeThreads = kPipeWarps * 32;
static_assert(kPipeThreads == kMmaThreads, "FinishCta deals outputs to kMmaThreads threads");
constexpr int kPipeCtaOutputs = kPipeWarps * kTileRows;
constexpr int kPipePartialStride = kPipeCtaOutputs + 4;     // as kPartialStride
constexpr int kStageK = 2 * kMmaStepK;                      // 128-byte rows of 16-bit elements
[[maybe_unused]] constexpr int kStageChunks = kStageK / 8;  // 16-byte chunks per row
[[maybe_unused]] constexpr int kStageQuads = kStageK / 4;   // 16-byte fp32 copies per row
constexpr int kPipeStages = 4;

// A ring slot: weights [kPipeCtaOutputs][kStageK] and rounded activations
// [kActRows][kStageK] (16-bit), then the fp32 activations [kActRows][kStageK].
__host__ __device__ constexpr int PipeSlotBytes(int act_tiles) {
  return kStageK * ((kPipeCtaOutputs + act_tiles * 8) * 2 + act_tiles * 8 * 4);
}

// The ring and, after the last stage, the partial outputs.
template <int kActTiles>
constexpr size_t PipeSharedBytes() {
  return std::max<size_t>(kPipeStages * PipeSlotBytes(kActTiles),
                          sizeof(float) * kActTiles * 8 * kPipePartialStride);
}

// Element offset of 16-byte chunk `chunk` of row `row` in a stage's 16-bit
// rows.
[[maybe_unused]] __device__ __forceinline__ int Swizzled(int row, int chunk) {
  return row * kStageK + ((chunk ^ ((row & 1) << 2)) * 8);
}

// Launched as MmaKernel is (clusters of (1, splits, 1), blockIdx.y the
// split), with PipeSharedBytes<kActTiles>() of dynamic shared memory;
// m ≤ kActTiles · 8.
template <typename T, int kActTiles>
__global__ void __launch_bounds__(kPipeThreads, 2)
    PipeMmaKernel(const SmallGroup<T> g, int64_t stages_per_split) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kActRows = kActTiles * 8;
  constexpr int kSlotBytes = PipeSlotBytes(kActTiles);
  // A thread's copies per stage: weight chunks, activation quads.
  constexpr int kWeightCopies = kPipeCtaOutputs * kStageChunks / kPipeThreads;
  constexpr int kActCopies = (kActRows * kStageQuads + kPipeThreads - 1) / kPipeThreads;
  extern __shared__ uint4 shared[];
  const auto weights_of = [&](int slot) {
    return reinterpret_cast<T*>(reinterpret_cast<char*>(shared) + slot * kSlotBytes);
  };
  const auto rounded_of = [&](int slot) { return weights_of(slot) + kPipeCtaOutputs * kStageK; };
  const auto staged_of = [&](int slot) {
    return reinterpret_cast<float*>(rounded_of(slot) + kActRows * kStageK);
  };
  AllowDependents();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gid = lane / 4, tig = lane % 4;
  const int64_t k = g.k;

  // Weight copy u of this thread moves chunk threadIdx.x % 8 of CTA row
  // (threadIdx.x + u·kPipeThreads) / 8, whose weight row is fixed.
  const int copy_chunk = static_cast<int>(threadIdx.x) % kStageChunks;
  const T* weight_rows[kWeightCopies][1];
#pragma unroll
  for (int u = 0; u < kWeightCopies; ++u) {
    const int row = (static_cast<int>(threadIdx.x) + u * kPipeThreads) / kStageChunks;
    TileRows(g, blockIdx.x * static_cast<int64_t>(kPipeWarps) + row / kTileRows, {row % kTileRows},
             weight_rows[u]);
  }
  const auto copy_weights = [&](int slot, int64_t k0) {
#pragma unroll
    for (int u = 0; u < kWeightCopies; ++u) {
      const int row = (static_cast<int>(threadIdx.x) + u * kPipeThreads) / kStageChunks;
      const int64_t col = k0 + copy_chunk * 8;
      const bool inside = weight_rows[u][0] != nullptr && col < k;
      CpAsync16(weights_of(slot) + Swizzled(row, copy_chunk),
                inside ? weight_rows[u][0] + col : g.w[0], inside);
    }
  };
  // Activation copy u of this thread: quad i % kStageQuads of row
  // i / kStageQuads, i = threadIdx.x + u·kPipeThreads, for rows < m (rows
  // ≥ m only feed outputs that are dropped); zeros past k.
  const auto for_each_act = [&](auto f) {
#pragma unroll
    for (int u = 0; u < kActCopies; ++u) {
      const int i = static_cast<int>(threadIdx.x) + u * kPipeThreads;
      if (i / kStageQuads < g.m) f(i / kStageQuads, i % kStageQuads);
    }
  };
  const auto copy_activations = [&](int slot, int64_t k0) {
    for_each_act([&](int row, int quad) {
      const int64_t col = k0 + 4 * quad;
      CpAsync16(staged_of(slot) + row * kStageK + 4 * quad, col < k ? g.a + row * k + col : g.a,
                col < k);
    });
  };
  const auto round_activations = [&](int slot) {
    for_each_act([&](int row, int quad) {
      const float4 x = *reinterpret_cast<const float4*>(staged_of(slot) + row * kStageK + 4 * quad);
      *reinterpret_cast<uint2*>(rounded_of(slot) + Swizzled(row, quad / 2) + 4 * (quad % 2)) =
          make_uint2(PackPair<T>(x.x, x.y), PackPair<T>(x.z, x.w));
    });
  };

  const int64_t stages = (k + kStageK - 1) / kStageK;
  const int64_t begin = blockIdx.y * stages_per_split;
  const int n = static_cast<int>(min(begin + stages_per_split, stages) - begin);
  // The weights of the first stages are in flight before the wait; one
  // commit group per stage after it, so the wait in stage i covers stage i.
#pragma unroll
  for (int s = 0; s < kPipeStages - 1; ++s) {
    if (s < n) copy_weights(s, (begin + s) * kStageK);
  }
  WaitForPrerequisites();  // a (and c when beta ≠ 0) come from earlier kernels
#pragma unroll
  for (int s = 0; s < kPipeStages - 1; ++s) {
    if (s < n) copy_activations(s, (begin + s) * kStageK);
    asm volatile("cp.async.commit_group;" ::: "memory");
  }

  float acc[kActTiles][4] = {};
  for (int i = 0; i < n; ++i) {
    const int slot = i % kPipeStages;
    asm volatile("cp.async.wait_group %0;" ::"n"(kPipeStages - 2) : "memory");
    round_activations(slot);
    // Publishes stage i; every warp is done with stage i − 1, whose slot
    // the copies of stage `next` take.
    __syncthreads();
    const int next = i + kPipeStages - 1;
    if (next < n) {
      copy_weights(next % kPipeStages, (begin + next) * kStageK);
      copy_activations(next % kPipeStages, (begin + next) * kStageK);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    const T* weights = weights_of(slot);
    const T* acts = rounded_of(slot);
    const int row = warp * kTileRows + gid;
#pragma unroll
    for (int step = 0; step < kStageK / kMmaStepK; ++step) {
      const int chunk = step * kMmaStepVectors + tig;
      const uint4 lo = *reinterpret_cast<const uint4*>(weights + Swizzled(row, chunk));
      const uint4 hi = *reinterpret_cast<const uint4*>(weights + Swizzled(row + 8, chunk));
#pragma unroll
      for (int j = 0; j < kActTiles; ++j) {
        const uint4 b = *reinterpret_cast<const uint4*>(acts + Swizzled(j * 8 + gid, chunk));
        Mma<T>(acc[j], lo.x, hi.x, lo.y, hi.y, b.x, b.y);
        Mma<T>(acc[j], lo.z, hi.z, lo.w, hi.w, b.z, b.w);
      }
    }
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();  // every warp is done with the ring: the partials reuse it

  float(*partial)[kPipePartialStride] = reinterpret_cast<float(*)[kPipePartialStride]>(shared);
#pragma unroll
  for (int j = 0; j < kActTiles; ++j) {
    StoreFragment(partial, acc[j], warp * kTileRows + gid, j * 8 + 2 * tig);
  }
  FinishCta<kPipeCtaOutputs>(g, partial);
#endif
}

template <typename T, int kActTiles>
cudaError_t LaunchPipeMmaTiles(const SmallGroup<T>& g, cudaStream_t stream) {
  constexpr size_t kBytes = PipeSharedBytes<kActTiles>();
  // Two CTAs per SM need nearly all of its shared memory (the weights
  // bypass L1, so it gives up nothing it uses).
  static const cudaError_t configured = [] {
    const cudaError_t e = cudaFuncSetAttribute(PipeMmaKernel<T, kActTiles>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
    return e != cudaSuccess ? e
                            : cudaFuncSetAttribute(PipeMmaKernel<T, kActTiles>,
                                                   cudaFuncAttributePreferredSharedMemoryCarveout,
                                                   cudaSharedmemCarveoutMaxShared);
  }();
  if (configured != cudaSuccess) return configured;
  const MmaShape s =
      ShapeFor(reinterpret_cast<const void*>(PipeMmaKernel<T, kActTiles>), kPipeThreads,
               (g.first_tile[g.count] + kPipeWarps - 1) / kPipeWarps, (g.k + kStageK - 1) / kStageK,
               kCtaOverheadSteps * kMmaStepK / kStageK, [](int64_t) { return kBytes; });
  return LaunchCut(PipeMmaKernel<T, kActTiles>, s, kPipeThreads, kBytes, stream, g,
                   s.steps_per_split);
}

}  // namespace

// Three activation tiles up to 24 rows, four above.
template <typename T>
cudaError_t LaunchPipeMma(const SmallGroup<T>& g, cudaStream_t stream) {
  if (g.m <= 24) return LaunchPipeMmaTiles<T, 3>(g, stream);
  return LaunchPipeMmaTiles<T, kPipeRows / 8>(g, stream);
}

template cudaError_t LaunchPipeMma<__nv_bfloat16>(const SmallGroup<__nv_bfloat16>& g,
                                                  cudaStream_t stream);
template cudaError_t LaunchPipeMma<__half>(const SmallGroup<__half>& g, cudaStream_t stream);

}  // namespace lair::kernels::cuda::dense::small_product
