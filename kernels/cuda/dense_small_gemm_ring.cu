// Decode products of kGemvFastMaxRows + 1 to kPipeRows activation rows on
// tensor cores, with weights and activations streamed through shared memory (sm_90).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cuda/dense_small_gemm_common.cuh"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/mma_fragments.cuh"

namespace lair::kernels::cuda::dense::small_product {
namespace {

// Tensor-core product for 2 to kPipeRows activation rows: mma.sync with the
// k range split over a cluster, weights and activations streamed through a
// ring of kPipeStages shared-memory stages by cp.async, so each SM keeps tens
// of KB in flight without holding them in registers.
//
// A stage is kStageK columns of the CTA's kPipeCtaOutputs weight rows and of
// the activation rows, in 128-byte rows of 16-bit elements (swizzled, see
// Swizzled). The activations come rounded to T (SmallGroup::a16, formed so
// by the pass before: RunGroup) and are copied as they are; otherwise the
// stage also holds them as fp32 copies, which each thread rounds once they
// land. Warps read their mma fragments by ldmatrix, in the mma's own k order.
// SwiGLU's gate and up products may come as a pair (SmallGroup::silu_pair):
// a CTA then takes 64 gate rows and the up rows of the same outputs, and
// writes silu(gate) ∘ up rounded for the down product (FinishSiluPairCta).
//
// In stage i each thread waits for its own copies of stage i (and rounds the
// fp32 activations it copied), and one barrier publishes the stage (and
// frees the slot of stage i − 1, which the copies of stage i + kPipeStages
// − 1 take).
//
// History, on an H100 unless said: the first form (fp32 activations staged
// and rounded in every CTA, fragments read 16 bytes a lane in a permuted k
// order) gained 4–9% over bf16 cuBLASLt after a rounding pass at 24 rows
// and 1–5% at 32. Under Nsight Compute it was bound by its instruction
// stream: about 227 instructions a warp per stage for 16 mmas, 40 of them
// moves that put each lane's 16-byte fragments in the mma's register order
// (H200: 2 CTAs of 8 warps per SM, 7 cycles between a warp's instructions).
// Rounded activations and ldmatrix fragments bring a stage to about 120.
// Loading the fp32 activations through registers a stage ahead measured the
// same as staging them (2,368 µs against 2,320 for a GLA 1.3B step's 121
// products at 32 rows), and with eight activation tiles lost 11% to
// cuBLASLt at 64 rows. Kernels that streamed the weights straight into
// registers took 3 to 8 and 9 to 16 rows, and the GEMV 2, until the
// twenty-second session; this one, at one and two activation tiles, ran GLA
// 1.3B's decode step 12% faster at 2 rows, 27% at 4 and 8, and 56% at 16
// (H200: 1.35 against 1.52 ms at 2, 1.39 against 1.78 at 4, 1.80 against
// 2.82 at 16).
constexpr int kPipeWarps = 8;
constexpr int kPipeThreads = kPipeWarps * 32;
static_assert(kPipeThreads == kMmaThreads, "FinishCta deals outputs to kMmaThreads threads");
constexpr int kPipeCtaOutputs = kPipeWarps * kTileRows;
// Partial outputs [row][output] padded so that the fragment stores of a warp
// hit 32 distinct banks (row stride 132 ≡ 4 mod 32, rows 2t apart).
constexpr int kPipePartialStride = kPipeCtaOutputs + 4;
constexpr int kStageK = 2 * kMmaStepK;                      // 128-byte rows of 16-bit elements
[[maybe_unused]] constexpr int kStageChunks = kStageK / 8;  // 16-byte chunks per row
[[maybe_unused]] constexpr int kStageQuads = kStageK / 4;   // 16-byte fp32 copies per row
// Ring stages: the fp32 activations' staging leaves two CTAs per SM room for
// four; activations already rounded (SmallGroup::a16) for five.
template <bool kRounded>
constexpr int kPipeStages = kRounded ? 5 : 4;

// A ring slot: weights [kPipeCtaOutputs][kStageK] and rounded activations
// [kActRows][kStageK] (16-bit), then, unless they come rounded, the fp32
// activations [kActRows][kStageK] as copied.
__host__ __device__ constexpr int PipeSlotBytes(int act_tiles, bool rounded) {
  return kStageK * ((kPipeCtaOutputs + act_tiles * 8) * 2 + (rounded ? 0 : act_tiles * 8 * 4));
}

// The ring and, after the last stage, the partial outputs.
template <int kActTiles, bool kRounded>
constexpr size_t PipeSharedBytes() {
  return std::max<size_t>(kPipeStages<kRounded> * PipeSlotBytes(kActTiles, kRounded),
                          sizeof(float) * kActTiles * 8 * kPipePartialStride);
}

// Element offset of 16-byte chunk `chunk` of row `row` in a stage's 16-bit
// rows: the chunk XOR-ed with the row's low three bits, so that the eight
// rows of an ldmatrix matrix (same chunk) fall on distinct banks.
[[maybe_unused]] __device__ __forceinline__ int Swizzled(int row, int chunk) {
  return row * kStageK + ((chunk ^ (row & 7)) * 8);
}

// Outputs of a CTA under SmallGroup::silu_pair: gate rows j and the up rows
// of the same j, kPairOutputs each.
constexpr int kPairOutputs = kPipeCtaOutputs / 2;

// The weight tile of the CTA's warp w: its w-th, or under silu_pair a gate
// tile for the first half of the warps and the up tile of the same rows for
// the second. (A gate tile past the gate's own lands on up rows whose
// outputs the epilogue drops.)
template <typename T>
__device__ __forceinline__ int64_t CtaTile(const SmallGroup<T>& g, int w) {
  constexpr int kHalf = kPipeWarps / 2;
  if (!g.silu_pair) return blockIdx.x * static_cast<int64_t>(kPipeWarps) + w;
  return (w < kHalf ? 0 : g.first_tile[1]) + blockIdx.x * static_cast<int64_t>(kHalf) + w % kHalf;
}

// The epilogue under silu_pair: CTA output o < kPairOutputs is gate row j =
// kPairOutputs·blockIdx.x + o and output o + kPairOutputs the up row j, each
// summed over the cluster's splits (ClusterSum, as FinishCta sums them;
// alpha 1, beta 0, no bias), then silu(gate) ∘ up rounded to T: the bits
// the separate products and a rounding pass give.
template <typename T>
__device__ __forceinline__ void FinishSiluPairCta(const SmallGroup<T>& g,
                                                  float (*partial)[kPipePartialStride]) {
  constexpr int kShares = kPipeThreads / kPairOutputs;
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every split's partial is in its CTA's shared memory
  const int o = static_cast<int>(threadIdx.x) % kPairOutputs;
  const int splits = static_cast<int>(cluster.num_blocks());
  const int64_t n = g.first_row[1];
  const int64_t j = blockIdx.x * static_cast<int64_t>(kPairOutputs) + o;
  if (j < n) {
    for (int64_t row = cluster.block_rank() * kShares + threadIdx.x / kPairOutputs; row < g.m;
         row += static_cast<int64_t>(splits) * kShares) {
      const float gate = ClusterSum(cluster, &partial[row][o]);
      const float up = ClusterSum(cluster, &partial[row][o + kPairOutputs]);
      g.silu_pair16[row * n + j] = T(Silu(gate) * up);
    }
  }
  ClusterBarrierBeforeExit();
}

// Launched by LaunchCut (clusters of (1, splits, 1), blockIdx.y the
// split), with PipeSharedBytes<kActTiles, kRounded>() of dynamic shared
// memory; m ≤ kActTiles · 8. kRounded: the activations are g.a16, copied
// into the ring as they are; else g.a, copied as fp32 and rounded there.
template <typename T, int kActTiles, bool kRounded>
__global__ void __launch_bounds__(kPipeThreads, 2)
    PipeMmaKernel(const SmallGroup<T> g, int64_t stages_per_split) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kStages = kPipeStages<kRounded>;
  constexpr int kActRows = kActTiles * 8;
  constexpr int kSlotBytes = PipeSlotBytes(kActTiles, kRounded);
  // A thread's copies per stage: weight chunks, then activation chunks (16
  // bits) or quads (fp32).
  constexpr int kWeightCopies = kPipeCtaOutputs * kStageChunks / kPipeThreads;
  constexpr int kActUnits = kActRows * (kRounded ? kStageChunks : kStageQuads);
  constexpr int kActCopies = (kActUnits + kPipeThreads - 1) / kPipeThreads;
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
  // (threadIdx.x + u·kPipeThreads) / 8, whose weight row is fixed: its
  // source (null past the last row) and its place in a slot are found once.
  const int copy_chunk = static_cast<int>(threadIdx.x) % kStageChunks;
  const T* weight_src[kWeightCopies][1];
  int weight_dst[kWeightCopies];
#pragma unroll
  for (int u = 0; u < kWeightCopies; ++u) {
    const int row = (static_cast<int>(threadIdx.x) + u * kPipeThreads) / kStageChunks;
    TileRows(g, CtaTile(g, row / kTileRows), {row % kTileRows}, weight_src[u]);
    if (weight_src[u][0] != nullptr) weight_src[u][0] += copy_chunk * 8;
    weight_dst[u] = Swizzled(row, copy_chunk);
  }
  // The weights are read once a step: evicted from L2 first (EvictFirstPolicy).
  const uint64_t read_once = EvictFirstPolicy();
  const auto copy_weights = [&](int slot, int64_t k0) {
    const bool in_k = k0 + copy_chunk * 8 < k;
#pragma unroll
    for (int u = 0; u < kWeightCopies; ++u) {
      const bool inside = weight_src[u][0] != nullptr && in_k;
      CpAsync16(weights_of(slot) + weight_dst[u], inside ? weight_src[u][0] + k0 : g.w[0], inside,
                read_once);
    }
  };
  // Activation copy u of this thread: unit i % per_row of row i / per_row,
  // i = threadIdx.x + u·kPipeThreads, for rows < m (rows ≥ m only feed
  // outputs that are dropped); zeros past k.
  const auto for_each_act = [&](auto f) {
    constexpr int kPerRow = kRounded ? kStageChunks : kStageQuads;
#pragma unroll
    for (int u = 0; u < kActCopies; ++u) {
      const int i = static_cast<int>(threadIdx.x) + u * kPipeThreads;
      if (i < kActUnits && i / kPerRow < g.m) f(i / kPerRow, i % kPerRow);
    }
  };
  const auto copy_activations = [&](int slot, int64_t k0) {
    if constexpr (kRounded) {
      for_each_act([&](int row, int chunk) {
        const int64_t col = k0 + 8 * chunk;
        CpAsync16(rounded_of(slot) + Swizzled(row, chunk), col < k ? g.a16 + row * k + col : g.a16,
                  col < k);
      });
    } else {
      for_each_act([&](int row, int quad) {
        const int64_t col = k0 + 4 * quad;
        CpAsync16(staged_of(slot) + row * kStageK + 4 * quad, col < k ? g.a + row * k + col : g.a,
                  col < k);
      });
    }
  };
  const auto round_activations = [&](int slot) {
    if constexpr (!kRounded) {
      for_each_act([&](int row, int quad) {
        const float4 x =
            *reinterpret_cast<const float4*>(staged_of(slot) + row * kStageK + 4 * quad);
        *reinterpret_cast<uint2*>(rounded_of(slot) + Swizzled(row, quad / 2) + 4 * (quad % 2)) =
            make_uint2(PackPair<T>(x.x, x.y), PackPair<T>(x.z, x.w));
      });
    }
  };

  const int64_t stages = (k + kStageK - 1) / kStageK;
  const int64_t begin = blockIdx.y * stages_per_split;
  const int n = static_cast<int>(min(begin + stages_per_split, stages) - begin);
  // The weights of the first stages are in flight before the wait; one
  // commit group per stage after it, so the wait in stage i covers stage i.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n) copy_weights(s, (begin + s) * kStageK);
  }
  WaitForPrerequisites();  // a (and c when beta ≠ 0) come from earlier kernels
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n) copy_activations(s, (begin + s) * kStageK);
    asm volatile("cp.async.commit_group;" ::: "memory");
  }

  // The fragments by ldmatrix, lane l addressing row l % 8 of matrix l / 8:
  // A's four are the tile's rows 0–7 and 8–15 at k and k + 8; B's are an
  // activation tile at k and k + 8, then the next tile's.
  const int a_row = warp * kTileRows + (lane / 8 % 2) * 8 + lane % 8, a_half = lane / 16;
  const int b_row = lane / 16 * 8 + lane % 8, b_half = lane / 8 % 2;
  float acc[kActTiles][4] = {};
  for (int i = 0; i < n; ++i) {
    const int slot = i % kStages;
    asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 2) : "memory");
    round_activations(slot);
    // Publishes stage i; every warp is done with stage i − 1, whose slot
    // the copies of stage `next` take.
    __syncthreads();
    const int next = i + kStages - 1;
    if (next < n) {
      copy_weights(next % kStages, (begin + next) * kStageK);
      copy_activations(next % kStages, (begin + next) * kStageK);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    const T* weights = weights_of(slot);
    const T* acts = rounded_of(slot);
#pragma unroll
    for (int step = 0; step < kStageK / 16; ++step) {
      uint32_t a[4];
      Ldsm4(a, weights + Swizzled(a_row, 2 * step + a_half));
#pragma unroll
      for (int j = 0; j + 1 < kActTiles; j += 2) {
        uint32_t b[4];
        Ldsm4(b, acts + Swizzled(j * 8 + b_row, 2 * step + b_half));
        Mma<T>(acc[j], a[0], a[1], a[2], a[3], b[0], b[1]);
        Mma<T>(acc[j + 1], a[0], a[1], a[2], a[3], b[2], b[3]);
      }
      if constexpr (kActTiles % 2 == 1) {
        uint32_t b[2];
        Ldsm2(b, acts + Swizzled((kActTiles - 1) * 8 + lane % 8, 2 * step + b_half));
        Mma<T>(acc[kActTiles - 1], a[0], a[1], a[2], a[3], b[0], b[1]);
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
  if (g.silu_pair) {
    FinishSiluPairCta(g, partial);
  } else {
    FinishCta<kPipeCtaOutputs>(g, partial);
  }
#endif
}

template <typename T, int kActTiles, bool kRounded>
cudaError_t LaunchPipeMmaTiles(const SmallGroup<T>& g, cudaStream_t stream) {
  constexpr size_t kBytes = PipeSharedBytes<kActTiles, kRounded>();
  // Two CTAs per SM need nearly all of its shared memory (the weights
  // bypass L1, so it gives up nothing it uses).
  static const cudaError_t configured = [] {
    const cudaError_t e = cudaFuncSetAttribute(PipeMmaKernel<T, kActTiles, kRounded>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
    return e != cudaSuccess ? e
                            : cudaFuncSetAttribute(PipeMmaKernel<T, kActTiles, kRounded>,
                                                   cudaFuncAttributePreferredSharedMemoryCarveout,
                                                   cudaSharedmemCarveoutMaxShared);
  }();
  if (configured != cudaSuccess) return configured;
  const MmaShape s =
      ShapeFor(reinterpret_cast<const void*>(PipeMmaKernel<T, kActTiles, kRounded>), kPipeThreads,
               g.silu_pair ? (g.first_row[1] + kPairOutputs - 1) / kPairOutputs
                           : (g.first_tile[g.count] + kPipeWarps - 1) / kPipeWarps,
               (g.k + kStageK - 1) / kStageK, kCtaOverheadSteps * kMmaStepK / kStageK,
               [](int64_t) { return kBytes; });
  return LaunchCut(PipeMmaKernel<T, kActTiles, kRounded>, s, kPipeThreads, kBytes, stream, g,
                   s.steps_per_split);
}

// As many 8-row activation tiles as m needs.
template <typename T, bool kRounded>
cudaError_t LaunchPipeMmaRows(const SmallGroup<T>& g, cudaStream_t stream) {
  if (g.m <= 8) return LaunchPipeMmaTiles<T, 1, kRounded>(g, stream);
  if (g.m <= 16) return LaunchPipeMmaTiles<T, 2, kRounded>(g, stream);
  if (g.m <= 24) return LaunchPipeMmaTiles<T, 3, kRounded>(g, stream);
  return LaunchPipeMmaTiles<T, kPipeRows / 8, kRounded>(g, stream);
}

}  // namespace

template <typename T>
cudaError_t LaunchPipeMma(const SmallGroup<T>& g, cudaStream_t stream) {
  return g.a16 ? LaunchPipeMmaRows<T, true>(g, stream) : LaunchPipeMmaRows<T, false>(g, stream);
}

template cudaError_t LaunchPipeMma<__nv_bfloat16>(const SmallGroup<__nv_bfloat16>& g,
                                                  cudaStream_t stream);
template cudaError_t LaunchPipeMma<__half>(const SmallGroup<__half>& g, cudaStream_t stream);

}  // namespace lair::kernels::cuda::dense::small_product
