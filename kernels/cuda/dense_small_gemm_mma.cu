// Decode products of 3 to kWideRows activation rows on tensor cores, with
// the weights streamed straight into registers (sm_90).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cuda/dense_small_gemm_common.cuh"
#include "kernels/cuda/dependent_launch.cuh"

namespace lair::kernels::cuda::dense::small_product {
namespace {

// Tensor-core product for 3 to 8 activation rows: mma.sync.m16n8k16 with the
// weights as the 16×16 A operand (16 output features of a member, a "tile")
// and the activation rows as the 16×8 B operand, fp32 accumulators.
//
// Within a step of 32 k, lane (g = lane / 4, t = lane % 4) takes 8
// consecutive weights of tile rows g and g + 8 and 8 consecutive activations
// of row g, all at k = 8t ... 8t + 7: one 16-byte load each. The step's two
// mmas read them as the k-slots {2t, 2t + 1, 2t + 8, 2t + 9} of their
// operands (A regs: row g, row g + 8, row g, row g + 8; B regs in the same
// k order). A dot product does not care in which order its k terms come as
// long as both operands agree, so this permutation of k needs no shuffles.
//
// A CTA of kMmaWarps warps covers kMmaWarps tiles over one split of the k
// range. It copies its split of the activations into shared memory
// (cp.async, every copy in flight at once), rounds them to T once for every
// warp, and streams its weights straight into registers, two groups of
// kMmaUnroll steps in flight in turn. The CTAs of one tile column form a
// cluster: each sums a share of the outputs over every split's partial,
// read from the others' shared memory in split order (deterministic), and
// applies the epilogue.
//
// On an H100 (GLA 1.3B decode, A/B in one call) this beat bf16 cuBLASLt by
// 12% at 4 rows and 10% at 8, and lost from 16 rows on (−10% at 16, −24% at
// 32, −33% at 64) with more activation tiles: WideMmaKernel below takes 9 to
// 16 rows.
constexpr int kMmaCtaOutputs = kMmaWarps * kTileRows;
// Steps per register group: 2 × 2 rows × 16 bytes per lane, and two groups,
// so 2–4 KB per warp stay in flight while the other group's products run.
// (4 steps per group, with four CTAs per SM, measured slower.)
constexpr int kMmaUnroll = 2;
// Shared memory for a split's staged activations; it bounds k per split
// (and so k to kMmaMaxSplits times that).
constexpr int kMmaMaxSharedBytes = 96 << 10;
// Partial outputs [row][output] padded so the fragment stores of a warp hit
// 32 distinct banks (row stride 132 ≡ 4 mod 32, rows 2t apart).
[[maybe_unused]] constexpr int kPartialStride = kMmaCtaOutputs + 4;

// Row strides of the staged activations, copied as fp32 and then rounded to
// T: at least `columns`, the rounded rows ≡ 64 bytes mod 128 so that the
// 16-byte loads of lanes (g, t) and (g + 1, t) fall in different banks.
struct Staging {
  int64_t wide = 0, narrow = 0;  // floats, T elements
  explicit Staging(int64_t columns) : wide(columns) {
    const int64_t bytes = columns * 2;
    narrow = (bytes + (64 - bytes % 128 + 128) % 128) / 2;
  }
  size_t Bytes() const { return static_cast<size_t>(kMmaRows * (wide * 4 + narrow * 2)); }
};

// f(row, column) for the 4-wide column groups ("quads") of `rows` rows of
// `quads` each: thread i takes quads i, i + kMmaThreads, ... of the rows laid
// end to end, advancing (row, column) by additions: the divisions happen
// once (and fold away when `quads` is a constant).
template <typename F>
__device__ __forceinline__ void ForEachQuad(int64_t rows, int quads, F f) {
  const int row_step = kMmaThreads / quads, quad_step = kMmaThreads % quads;
  int r = static_cast<int>(threadIdx.x) / quads, q = static_cast<int>(threadIdx.x) % quads;
  for (; r < rows; r += row_step, q += quad_step) {
    if (q >= quads) q -= quads, ++r;
    if (r >= rows) break;
    f(r, 4 * q);
  }
}

// A lane's weights of kMmaUnroll consecutive steps (one 128-byte line of
// each row): rows gid (h = 0) and gid + 8 (h = 1) of each of its warp's
// kTiles tiles.
template <int kTiles>
using GroupWeights = uint4[kMmaUnroll][kTiles][2];

// Null rows (TileRows) and steps at or past `end` (the split's) or past k
// load zeros.
template <typename T, int kTiles>
__device__ __forceinline__ void LoadGroup(GroupWeights<kTiles>& w,
                                          const T* const (&rows)[kTiles][2], int64_t first,
                                          int64_t end, int64_t vectors, int tig) {
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int u = 0; u < kMmaUnroll; ++u) {
        const int64_t v = (first + u) * kMmaStepVectors + tig;
        w[u][t][h] = first + u < end && v < vectors && rows[t][h] != nullptr
                         ? LoadStreaming(rows[t][h] + v * 8)
                         : make_uint4(0, 0, 0, 0);
      }
    }
  }
}

// acc[t][j] += weight tile t · activation tile j over the group's steps, the
// first at step `step` of the rounded activations `staged` (`stride`
// elements per row); steps at or past `end` are skipped.
template <typename T, int kTiles, int kActTiles>
__device__ __forceinline__ void MultiplyGroup(float (&acc)[kTiles][kActTiles][4],
                                              const GroupWeights<kTiles>& w, const T* staged,
                                              int64_t stride, int64_t step, int64_t first,
                                              int64_t end, int gid, int tig) {
#pragma unroll
  for (int u = 0; u < kMmaUnroll; ++u) {
    if (first + u >= end) break;
#pragma unroll
    for (int j = 0; j < kActTiles; ++j) {
      const uint4 b = *reinterpret_cast<const uint4*>(staged + (j * 8 + gid) * stride +
                                                      (step + u) * kMmaStepK + 8 * tig);
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
        Mma<T>(acc[t][j], w[u][t][0].x, w[u][t][1].x, w[u][t][0].y, w[u][t][1].y, b.x, b.y);
        Mma<T>(acc[t][j], w[u][t][0].z, w[u][t][1].z, w[u][t][0].w, w[u][t][1].w, b.z, b.w);
      }
    }
  }
}

// Issues the copies of rows < m of `a` ([m, k]), columns [k0, k0 + 4·quads),
// into `dst` (`stride` floats per row); zeros at or past `k_end` (the
// weights there are zeros too, but 0 · garbage may be NaN).
[[maybe_unused]] __device__ __forceinline__ void CopyQuads(float* dst, int64_t stride,
                                                           const float* a, int64_t m, int64_t k,
                                                           int64_t k0, int64_t k_end, int quads) {
  ForEachQuad(m, quads, [&](int r, int col) {
    const bool inside = k0 + col < k_end;
    CpAsync16(dst + r * stride + col, inside ? a + r * k + k0 + col : a, inside);
  });
}

// The quads CopyQuads gave this thread, landed in `src`, rounded to T into
// `dst` (`src_stride` floats and `dst_stride` elements per row).
template <typename T>
__device__ __forceinline__ void RoundQuads(const float* src, int64_t src_stride, T* dst,
                                           int64_t dst_stride, int64_t m, int quads) {
  ForEachQuad(m, quads, [&](int r, int col) {
    const float4 x = *reinterpret_cast<const float4*>(src + r * src_stride + col);
    *reinterpret_cast<uint2*>(dst + r * dst_stride + col) =
        make_uint2(PackPair<T>(x.x, x.y), PackPair<T>(x.z, x.w));
  });
}

// Launched in clusters of (1, splits, 1) CTAs, blockIdx.y the split, each
// with Staging::Bytes() of dynamic shared memory, as a dependent: the first
// weights are in flight before the wait.
template <typename T>
__global__ void __launch_bounds__(kMmaThreads)
    MmaKernel(const SmallGroup<T> g, int64_t steps_per_split, Staging stage) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ uint4 shared[];
  float* wide = reinterpret_cast<float*>(shared);                  // [kMmaRows][stage.wide]
  T* narrow = reinterpret_cast<T*>(wide + kMmaRows * stage.wide);  // [kMmaRows][stage.narrow]
  float(*partial)[kPartialStride] = reinterpret_cast<float(*)[kPartialStride]>(shared);
  AllowDependents();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gid = lane / 4, tig = lane % 4;
  const int64_t k = g.k, vectors = k / 8;

  // This lane's weight rows: its tile's rows gid (h = 0) and gid + 8 (h = 1).
  const T* rows[1][2];
  TileRows(g, blockIdx.x * static_cast<int64_t>(kMmaWarps) + warp, {gid, gid + 8}, rows[0]);

  const int64_t steps = (vectors + kMmaStepVectors - 1) / kMmaStepVectors;
  const int64_t begin = blockIdx.y * steps_per_split;
  const int64_t end = min(begin + steps_per_split, steps);
  GroupWeights<1> w0, w1;
  LoadGroup(w0, rows, begin, end, vectors, tig);
  WaitForPrerequisites();  // a (and c when beta ≠ 0) come from earlier kernels

  // The split's activations (rows ≥ m only feed outputs that are dropped),
  // rounded once for every warp.
  const int quads = static_cast<int>(end - begin) * (kMmaStepK / 4);
  CopyQuads(wide, stage.wide, g.a, g.m, k, begin * kMmaStepK, k, quads);
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();
  RoundQuads(wide, stage.wide, narrow, stage.narrow, g.m, quads);
  __syncthreads();

  float acc[1][1][4] = {};
  for (int64_t first = begin; first < end; first += 2 * kMmaUnroll) {
    LoadGroup(w1, rows, first + kMmaUnroll, end, vectors, tig);
    MultiplyGroup<T>(acc, w0, narrow, stage.narrow, first - begin, first, end, gid, tig);
    LoadGroup(w0, rows, first + 2 * kMmaUnroll, end, vectors, tig);
    MultiplyGroup<T>(acc, w1, narrow, stage.narrow, first + kMmaUnroll - begin, first + kMmaUnroll,
                     end, gid, tig);
  }
  __syncthreads();  // the staged activations are read: the partials reuse them

  StoreFragment(partial, acc[0][0], warp * kTileRows + gid, 2 * tig);

  FinishCta<kMmaCtaOutputs>(g, partial);
#endif
}

// ---------------------------------------------------------------------------
// Tensor-core product for 9 to 16 activation rows: the same mma and k
// permutation as above, with two 8-row activation tiles as B operands and
// two weight tiles per warp, so every activation fragment feeds both.
//
// MmaKernel stages its whole split of the activations before its first mma;
// at 16 rows that copy's latency, paid once per CTA, cost more than the
// kernel saved. Here the split streams through chunks of kChunkSteps steps:
// cp.async fills chunk c + 1 while the warps multiply chunk c. Each thread
// rounds the fp32 quads it copied itself into a rounded buffer (two, in
// turn), so one barrier per chunk publishes them.
//
// On an H100 (decode, A/B in one call against bf16 cuBLASLt) this gained
// 10% at 12 rows and 6–7% at 16 on GLA 1.3B, 10% at 16 on GSA 1.3B. With
// four and eight activation tiles it lost at 32 rows (−7%) and 64 (−18%):
// at two CTAs per SM a warp keeps 2–4 KB of weights in flight, too little
// against cuBLASLt's pipelined loads, and more register groups cost the
// second CTA. PipeMmaKernel (dense_small_gemm_ring.cu) takes 17 to 32 rows.
[[maybe_unused]] constexpr int kWideActTiles = kWideRows / 8;
constexpr int kWideWarpTiles = 2;
constexpr int kWideWarps = 8;
constexpr int kWideThreads = kWideWarps * 32;
constexpr int kWideCtaTiles = kWideWarps * kWideWarpTiles;
constexpr int kWideCtaOutputs = kWideCtaTiles * kTileRows;
static_assert(kWideThreads == kMmaThreads, "ForEachQuad deals quads to kMmaThreads threads");
constexpr int kWidePartialStride = kWideCtaOutputs + 4;  // as kPartialStride
constexpr int kChunkSteps = 4;                           // two groups of kMmaUnroll steps
static_assert(kChunkSteps % (2 * kMmaUnroll) == 0);
constexpr int kChunkK = kChunkSteps * kMmaStepK;
[[maybe_unused]] constexpr int kChunkQuads =
    kChunkK / 4;                       // 16-byte copies per staged row and chunk
constexpr int kChunkStride = kChunkK;  // floats per staged row (each thread reads its own)
// Elements per rounded row: ≡ 64 bytes mod 128, so the 16-byte loads of
// lanes (g, t) and (g + 1, t) fall in different banks.
constexpr int kRoundedStride = kChunkK + 32;
// Two fp32 chunks and two rounded ones, then the partial outputs.
constexpr size_t kWideSharedBytes =
    kWideRows * std::max(2 * (sizeof(float) * kChunkStride + 2 * kRoundedStride),
                         sizeof(float) * kWidePartialStride);

// Launched as MmaKernel is (clusters of (1, splits, 1), blockIdx.y the
// split), with kWideSharedBytes of dynamic shared memory.
template <typename T>
__global__ void __launch_bounds__(kWideThreads, 2)
    WideMmaKernel(const SmallGroup<T> g, int64_t steps_per_split) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ uint4 shared[];
  float* staged = reinterpret_cast<float*>(shared);  // [2][kWideRows][kChunkStride]
  T* rounded = reinterpret_cast<T*>(staged + 2 * kWideRows * kChunkStride);
  AllowDependents();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gid = lane / 4, tig = lane % 4;
  const int64_t k = g.k, vectors = k / 8;

  const T* rows[kWideWarpTiles][2];
#pragma unroll
  for (int t = 0; t < kWideWarpTiles; ++t) {
    TileRows(g, blockIdx.x * static_cast<int64_t>(kWideCtaTiles) + warp * kWideWarpTiles + t,
             {gid, gid + 8}, rows[t]);
  }

  const int64_t steps = (vectors + kMmaStepVectors - 1) / kMmaStepVectors;
  const int64_t begin = blockIdx.y * steps_per_split;
  const int64_t end = min(begin + steps_per_split, steps);
  const int64_t k_end = min(end * kMmaStepK, k);
  const int chunks = static_cast<int>((end - begin + kChunkSteps - 1) / kChunkSteps);
  GroupWeights<kWideWarpTiles> w0, w1;
  LoadGroup(w0, rows, begin, end, vectors, tig);
  WaitForPrerequisites();  // a (and c when beta ≠ 0) come from earlier kernels

  // Rows ≥ m of the rounded chunks hold stale data: they only feed outputs
  // that are dropped (each column of an mma's B meets only its own column
  // of C).
  const auto chunk_k = [&](int c) { return (begin + c * kChunkSteps) * kMmaStepK; };
  if (chunks > 0) CopyQuads(staged, kChunkStride, g.a, g.m, k, chunk_k(0), k_end, kChunkQuads);
  asm volatile("cp.async.commit_group;" ::: "memory");
  float acc[kWideWarpTiles][kWideActTiles][4] = {};
  for (int c = 0; c < chunks; ++c) {
    // Chunk c + 1's slot held chunk c - 1, which this thread rounded before
    // the last barrier.
    if (c + 1 < chunks) {
      CopyQuads(staged + ((c + 1) % 2) * kWideRows * kChunkStride, kChunkStride, g.a, g.m, k,
                chunk_k(c + 1), k_end, kChunkQuads);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_group 1;" ::: "memory");  // this thread's copies of chunk c
    T* chunk = rounded + (c % 2) * kWideRows * kRoundedStride;
    RoundQuads(staged + (c % 2) * kWideRows * kChunkStride, kChunkStride, chunk, kRoundedStride,
               g.m, kChunkQuads);
    // Publishes chunk c; every warp is past chunk c - 1, whose rounded
    // buffer the next iteration fills.
    __syncthreads();
    const int64_t first = begin + c * kChunkSteps;
#pragma unroll
    for (int s = 0; s < kChunkSteps; s += 2 * kMmaUnroll) {
      LoadGroup(w1, rows, first + s + kMmaUnroll, end, vectors, tig);
      MultiplyGroup<T>(acc, w0, chunk, kRoundedStride, s, first + s, end, gid, tig);
      LoadGroup(w0, rows, first + s + 2 * kMmaUnroll, end, vectors, tig);
      MultiplyGroup<T>(acc, w1, chunk, kRoundedStride, s + kMmaUnroll, first + s + kMmaUnroll, end,
                       gid, tig);
    }
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();  // every warp is done with the chunks: the partials reuse them

  float(*partial)[kWidePartialStride] = reinterpret_cast<float(*)[kWidePartialStride]>(shared);
#pragma unroll
  for (int t = 0; t < kWideWarpTiles; ++t) {
#pragma unroll
    for (int j = 0; j < kWideActTiles; ++j) {
      StoreFragment(partial, acc[t][j], (warp * kWideWarpTiles + t) * kTileRows + gid,
                    j * 8 + 2 * tig);
    }
  }

  FinishCta<kWideCtaOutputs>(g, partial);
#endif
}

// MmaKernel's shared memory for splits of `per_split` steps; 0 when the
// staged activations do not fit.
size_t MmaSharedBytes(int64_t per_split) {
  const size_t staged = Staging(per_split * kMmaStepK).Bytes();
  if (staged > kMmaMaxSharedBytes) return 0;
  return std::max(staged, sizeof(float) * kMmaRows * static_cast<size_t>(kPartialStride));
}

template <typename T>
cudaError_t LaunchWideMma(const SmallGroup<T>& g, cudaStream_t stream) {
  static const cudaError_t configured = cudaFuncSetAttribute(
      WideMmaKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, kWideSharedBytes);
  if (configured != cudaSuccess) return configured;
  const MmaShape s =
      ShapeFor(reinterpret_cast<const void*>(WideMmaKernel<T>), kWideThreads,
               (g.first_tile[g.count] + kWideCtaTiles - 1) / kWideCtaTiles, StepsOf(g.k),
               kCtaOverheadSteps, [](int64_t) { return kWideSharedBytes; });
  return LaunchCut(WideMmaKernel<T>, s, kWideThreads, kWideSharedBytes, stream, g,
                   s.steps_per_split);
}

}  // namespace

bool MmaStagesK(int64_t k) {
  return MmaSharedBytes((StepsOf(k) + kMmaMaxSplits - 1) / kMmaMaxSplits) > 0;
}

template <typename T>
cudaError_t LaunchMma(const SmallGroup<T>& g, cudaStream_t stream) {
  if (g.m > kMmaRows) return LaunchWideMma(g, stream);
  static const cudaError_t configured = cudaFuncSetAttribute(
      MmaKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMmaMaxSharedBytes);
  if (configured != cudaSuccess) return configured;
  const MmaShape s = ShapeFor(reinterpret_cast<const void*>(MmaKernel<T>), kMmaThreads,
                              (g.first_tile[g.count] + kMmaWarps - 1) / kMmaWarps, StepsOf(g.k),
                              kCtaOverheadSteps, MmaSharedBytes);
  // (No splits fit only when MmaStagesK is false, which SmallProductFor
  // rules out.)
  return LaunchCut(MmaKernel<T>, s, kMmaThreads, MmaSharedBytes(s.steps_per_split), stream, g,
                   s.steps_per_split, Staging(s.steps_per_split * kMmaStepK));
}

template cudaError_t LaunchMma<__nv_bfloat16>(const SmallGroup<__nv_bfloat16>& g,
                                              cudaStream_t stream);
template cudaError_t LaunchMma<__half>(const SmallGroup<__half>& g, cudaStream_t stream);

}  // namespace lair::kernels::cuda::dense::small_product
