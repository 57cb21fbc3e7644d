// Decode products of 1 to kGemvMaxRows activation rows in fp32 arithmetic
// (exact, so both precisions take it; the fast path up to kGemvFastMaxRows).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/dense_small_gemm_common.cuh"
#include "kernels/cuda/dependent_launch.cuh"

namespace lair::kernels::cuda::dense::small_product {
namespace {

// GEMV: kSplits warps (1, 2 or 4) stream one weight row, each a run of
// whole chunks of it, in 16-byte loads (kGemvUnroll in flight per lane)
// against fp32 activations read through the cache, keeping one fp32 sum per
// activation row; split rows add their warps' sums in a fixed order. A
// block norm without weight (SmallGroup::row_rms) costs no pass of its own:
// the CTA sums each row's squares after its weight loop and scales its
// outputs.

constexpr int kGemvWarps = 8;
// 8 (a whole 2048-wide row per round trip) measured slower on an H100: GLA
// 1.3B decode at batch 1 went from 2.13 to 2.28 ms per step.
constexpr int kGemvUnroll = 4;
constexpr int64_t kGemvChunk = 32 * kGemvUnroll;  // 16-byte vectors a warp loads at once
// Rows are split across warps until a launch has this many warps per SM:
// a product of few rows (GLA 1.3B's o_proj and down, 2048 of them) had 16
// warps per SM, each streaming a whole row, and moved 1.2 TB/s (o_proj)
// where the wider products moved 2.1. Splitting took GLA 1.3B's decode step
// on an H200 from 1.511 to 1.466 ms at batch 1 and 1.775 to 1.730 at 2.
constexpr int64_t kGemvWarpsPerSm = 24;
constexpr int kGemvMaxSplits = 4;

// A lane's kGemvUnroll 16-byte loads of a weight row from vector `base` on
// (zeros from vector `vectors` on: the row's or the warp's share's end),
// under L2 evict-first as the ring's weights: a step reads them once. On an
// H200 this took GSA 1.3B's batch-1 step from 1.400–1.403 to 1.388–1.399 ms
// and GLA 1.3B's without the persistent kernel from 1.205–1.209 to
// 1.191–1.199 (docs/benchmarks.md).
__device__ __forceinline__ void LoadWeightChunk(const uint4* row, int64_t vectors, int64_t base,
                                                int lane, uint4 (&chunk)[kGemvUnroll]) {
  const uint64_t read_once = EvictFirstPolicy();
#pragma unroll
  for (int u = 0; u < kGemvUnroll; ++u) {
    const int64_t v = base + u * 32 + lane;
    uint4 w = make_uint4(0, 0, 0, 0);
    if (v < vectors) {
      asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
          : "=r"(w.x), "=r"(w.y), "=r"(w.z), "=r"(w.w)
          : "l"(row + v), "l"(read_once));
    }
    chunk[u] = w;
  }
}

// sum[r] += the chunk's weights (vectors before `vectors`) · the matching
// activations of row r.
template <typename T, int kRows>
__device__ __forceinline__ void AccumulateChunk(const uint4 (&chunk)[kGemvUnroll], const float* a,
                                                int64_t k, int64_t vectors, int64_t base, int lane,
                                                float (&sum)[kRows]) {
#pragma unroll
  for (int u = 0; u < kGemvUnroll; ++u) {
    const int64_t v = base + u * 32 + lane;
    if (v >= vectors) break;
    float2 wf[4];
    Widen8<T>(chunk[u], wf);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float4* x = reinterpret_cast<const float4*>(a + r * k + v * 8);
      sum[r] += Dot8(wf, __ldg(x), __ldg(x + 1));
    }
  }
}

// A CTA's rows: kGemvWarps / kSplits of them, consecutive; with kPair
// (SmallGroup::silu_pair) the first half gate rows j, the second the up rows
// of the same j, so that one CTA holds both factors of its outputs.
template <int kSplits, bool kPair>
struct GemvRows {
  static constexpr int kPerCta = kGemvWarps / kSplits;
  static constexpr int kOutputsPerCta = kPair ? kPerCta / 2 : kPerCta;
  static_assert(!kPair || kPerCta % 2 == 0, "a paired CTA holds gate and up rows alike");
};

// scale[r] ← 1/√(mean(a[r]²) + eps) over the k activations of each row
// (SmallGroup::row_rms), summed by the whole CTA in a fixed order. Called
// after the weight loop, whose warps have just read every activation, so
// the loads hit L1; `squares` is the CTA's shared scratch.
template <int kRows>
__device__ __forceinline__ void RowRmsScales(const float* a, int64_t k, float eps,
                                             float (&squares)[kGemvWarps][kRows],
                                             float (&scale)[kRows]) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t vectors = k / 4;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float4* row = reinterpret_cast<const float4*>(a + r * k);
    float sum = 0.0f;
    for (int64_t v = threadIdx.x; v < vectors; v += kGemvWarps * 32) {
      const float4 x = __ldg(row + v);
      sum += x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w;
    }
    sum = WarpSum(sum);
    if (lane == 0) squares[warp][r] = sum;
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kGemvWarps; ++w) sum += squares[w][r];
    scale[r] = rsqrtf(sum / static_cast<float>(k) + eps);
  }
}

// c[0][r, j] ← silu(gate) ∘ up for the CTA's outputs j, from every warp's
// sums in `sums` (warp w holds local row w / kSplits), with kRowRms each
// row's scaled by scale[r]; split rows add their warps' sums in the
// unpaired kernel's order.
template <typename T, int kRows, int kSplits, bool kRowRms>
__device__ __forceinline__ void StoreSiluPairs(const SmallGroup<T>& g,
                                               const float (&sums)[kGemvWarps][kRows],
                                               const float (&scale)[kRows]) {
  constexpr int kHalf = GemvRows<kSplits, true>::kOutputsPerCta;
  static_assert(kHalf * kRows <= kGemvWarps * 32, "a thread per output");
  const int64_t n = g.first_row[1];
  const int i = threadIdx.x / kRows, r = threadIdx.x % kRows;
  const int64_t j = blockIdx.x * static_cast<int64_t>(kHalf) + i;
  if (i < kHalf && j < n) {
    float gate = 0.0f, up = 0.0f;
#pragma unroll
    for (int p = 0; p < kSplits; ++p) {
      gate += sums[i * kSplits + p][r];
      up += sums[(i + kHalf) * kSplits + p][r];
    }
    if constexpr (kRowRms) {
      float s = scale[0];
#pragma unroll
      for (int q = 1; q < kRows; ++q) s = r == q ? scale[q] : s;
      gate *= s;
      up *= s;
    }
    g.c[0][r * n + j] = Silu(gate) * up;
  }
}

// Launched as a dependent (dependent_launch.cuh): the first weight chunk is
// in flight before the wait for the kernel that writes the activations.
template <typename T, int kRows, int kSplits, bool kPair, bool kRowRms>
__global__ void __launch_bounds__(kGemvWarps * 32) GemvKernel(const SmallGroup<T> g) {
  AllowDependents();
  using Rows = GemvRows<kSplits, kPair>;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int local = warp / kSplits;
  int64_t row = blockIdx.x * static_cast<int64_t>(Rows::kPerCta) + local;
  // Past the last row a warp still meets its CTA at the partial sums.
  bool valid;
  if constexpr (kPair) {
    const int64_t n = g.first_row[1];
    const int64_t j =
        blockIdx.x * static_cast<int64_t>(Rows::kOutputsPerCta) + local % Rows::kOutputsPerCta;
    valid = j < n;
    row = local < Rows::kOutputsPerCta ? j : j + n;
  } else {
    valid = row < g.first_row[g.count];
  }
  // The member and its row, read from the parameters by constant indices
  // here rather than through MemberOf and Select: a reference to `g` makes
  // the compiler pick one parameter address and load through it, which
  // lengthens the prologue before a short-lived warp's first weight loads
  // (the GEMV at 2 rows was 8% slower that way on an H100).
  int member = 0;
#pragma unroll
  for (int i = 1; i < kMembers; ++i) member += i < g.count && row >= g.first_row[i];
  const T* w = g.w[0];
  int64_t j = row;
#pragma unroll
  for (int i = 1; i < kMembers; ++i) {
    if (member == i) {
      w = g.w[i];
      j = row - g.first_row[i];
    }
  }
  const int64_t k = g.k;
  // This warp's vectors [begin, end) of the row: whole chunks.
  const int64_t vectors = k / 8, chunks = (vectors + kGemvChunk - 1) / kGemvChunk;
  const int64_t per_warp = (chunks + kSplits - 1) / kSplits * kGemvChunk;
  const int64_t begin = (warp % kSplits) * per_warp;
  const int64_t end = valid ? min(vectors, begin + per_warp) : 0;
  const uint4* weights = reinterpret_cast<const uint4*>(w + j * k);  // 8 weights per uint4
  float sum[kRows] = {};
  uint4 chunk[kGemvUnroll];
  if (begin < end) LoadWeightChunk(weights, end, begin, lane, chunk);
  WaitForPrerequisites();  // a (and c when beta ≠ 0) come from earlier kernels
  for (int64_t base = begin; base < end; base += kGemvChunk) {
    if (base > begin) LoadWeightChunk(weights, end, base, lane, chunk);
    AccumulateChunk<T, kRows>(chunk, g.a, k, end, base, lane, sum);
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) sum[r] = WarpSum(sum[r]);
  // The row norm's scales (kRowRms), whose barrier also publishes the
  // partial sums in which paired or split rows meet.
  [[maybe_unused]] float scale[kRows];
  [[maybe_unused]] __shared__ float squares[kRowRms ? kGemvWarps : 1][kRows];
  if constexpr (kPair || kSplits > 1) {
    __shared__ float partial[kGemvWarps][kRows];
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) partial[warp][r] = sum[r];
    }
    if constexpr (kRowRms) {
      RowRmsScales<kRows>(g.a, k, g.rms_eps, squares, scale);
    } else {
      __syncthreads();
    }
    if constexpr (kPair) {
      StoreSiluPairs<T, kRows, kSplits, kRowRms>(g, partial, scale);
      return;
    }
    if (warp % kSplits != 0) return;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      sum[r] = 0.0f;
#pragma unroll
      for (int p = 0; p < kSplits; ++p) sum[r] += partial[warp + p][r];
    }
  } else if constexpr (kRowRms) {
    RowRmsScales<kRows>(g.a, k, g.rms_eps, squares, scale);
  }
  if constexpr (kRowRms) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) sum[r] *= scale[r];
  }
  if (!valid || lane != 0) return;
  Output out = {g.c[0], g.first_row[1], g.bias[0], g.act[0], g.residual[0]};
#pragma unroll
  for (int i = 1; i < kMembers; ++i) {
    if (member == i) {
      out = {g.c[i], g.first_row[i + 1] - g.first_row[i], g.bias[i], g.act[i], g.residual[i]};
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    Store(g.alpha, g.beta, out, r, j, sum[r], PriorOf(g.beta, out, r, j));
  }
}

// Warps per row: doubled, up to the chunks of a row and kGemvMaxSplits,
// while the launch has fewer than kGemvWarpsPerSm warps per SM.
int SplitsFor(int64_t rows, int64_t k) {
  const int sms = CurrentDeviceSms();
  if (sms == 0) {
    (void)cudaGetLastError();
    return 1;
  }
  const int64_t chunks = (k / 8 + kGemvChunk - 1) / kGemvChunk;
  int splits = 1;
  while (splits < kGemvMaxSplits && 2 * splits <= chunks && rows * splits < sms * kGemvWarpsPerSm) {
    splits *= 2;
  }
  return splits;
}

template <typename T, int kRows, int kSplits, bool kPair, bool kRowRms>
cudaError_t LaunchGemvShape(const SmallGroup<T>& g, cudaStream_t stream) {
  using Rows = GemvRows<kSplits, kPair>;
  const int64_t outputs = kPair ? g.first_row[1] : g.first_row[g.count];
  const int64_t ctas = (outputs + Rows::kOutputsPerCta - 1) / Rows::kOutputsPerCta;
  return LaunchDependent(GemvKernel<T, kRows, kSplits, kPair, kRowRms>,
                         dim3(static_cast<unsigned>(ctas)), dim3(kGemvWarps * 32), stream, g);
}

template <typename T, int kRows, int kSplits, bool kRowRms>
cudaError_t LaunchGemvPaired(const SmallGroup<T>& g, cudaStream_t stream) {
  return g.silu_pair ? LaunchGemvShape<T, kRows, kSplits, true, kRowRms>(g, stream)
                     : LaunchGemvShape<T, kRows, kSplits, false, kRowRms>(g, stream);
}

// The row norm has instances up to kGemvNormMaxRows rows.
template <typename T, int kRows, int kSplits>
cudaError_t LaunchGemvSplits(const SmallGroup<T>& g, cudaStream_t stream) {
  if constexpr (kRows <= kGemvNormMaxRows) {
    if (g.row_rms) return LaunchGemvPaired<T, kRows, kSplits, true>(g, stream);
  } else {
    if (g.row_rms) return cudaErrorInvalidValue;
  }
  return LaunchGemvPaired<T, kRows, kSplits, false>(g, stream);
}

// Rows are split at up to kGemvSplitMaxRows activation rows (more rows need
// the registers for their sums).
constexpr int kGemvSplitMaxRows = 2;

template <typename T, int kRows>
cudaError_t LaunchGemvRows(const SmallGroup<T>& g, cudaStream_t stream) {
  if constexpr (kRows > kGemvSplitMaxRows) {
    return LaunchGemvSplits<T, kRows, 1>(g, stream);
  } else {
    switch (SplitsFor(g.first_row[g.count], g.k)) {
      case 1:
        return LaunchGemvSplits<T, kRows, 1>(g, stream);
      case 2:
        return LaunchGemvSplits<T, kRows, 2>(g, stream);
      default:
        return LaunchGemvSplits<T, kRows, kGemvMaxSplits>(g, stream);
    }
  }
}

}  // namespace

template <typename T>
cudaError_t LaunchGemv(const SmallGroup<T>& g, cudaStream_t stream) {
  switch (g.m) {
    case 1:
      return LaunchGemvRows<T, 1>(g, stream);
    case 2:
      return LaunchGemvRows<T, 2>(g, stream);
    case 3:
      return LaunchGemvRows<T, 3>(g, stream);
    case 4:
      return LaunchGemvRows<T, 4>(g, stream);
    case 5:
      return LaunchGemvRows<T, 5>(g, stream);
    case 6:
      return LaunchGemvRows<T, 6>(g, stream);
    case 7:
      return LaunchGemvRows<T, 7>(g, stream);
    default:
      return LaunchGemvRows<T, 8>(g, stream);
  }
}

template cudaError_t LaunchGemv<__nv_bfloat16>(const SmallGroup<__nv_bfloat16>& g,
                                               cudaStream_t stream);
template cudaError_t LaunchGemv<__half>(const SmallGroup<__half>& g, cudaStream_t stream);

}  // namespace lair::kernels::cuda::dense::small_product
