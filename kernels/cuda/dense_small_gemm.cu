// Decode-sized products: c[i, j] = act(alpha·Σ_k a[i, k]·w[j, k] + beta·c[i, j]
// + bias[j]) + residual[i, j] for a handful of activation rows i, fp32
// activations and 16-bit weights w [n, k]. Memory-bound on w: both kernels
// keep many 16-byte weight loads in flight and read each weight once.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "kernels/cuda/dense_common.cuh"
#include "kernels/cuda/dense_small_gemm.h"
#include "kernels/cuda/dependent_launch.cuh"

namespace lair::kernels::cuda::dense {
namespace {

constexpr int kMembers = kSmallProductMembers;

// Output features per tensor-core tile (the m of mma.m16n8k16).
constexpr int kTileRows = 16;

inline int64_t TilesOf(int64_t n) { return (n + kTileRows - 1) / kTileRows; }

// One launch's products: member i owns weight rows [first_row[i],
// first_row[i + 1]) of the launch's concatenated outputs, in its own c; for
// the tensor-core kernel also the kTileRows-row tiles [first_tile[i],
// first_tile[i + 1]). All members share a, m, k, alpha and beta.
template <typename T>
struct SmallGroup {
  const float* a = nullptr;  // [m, k]
  int64_t m = 0, k = 0;
  float alpha = 1.0f, beta = 0.0f;
  int count = 0;
  int64_t first_row[kMembers + 1] = {};
  int64_t first_tile[kMembers + 1] = {};
  const T* w[kMembers] = {};             // [n_i, k]
  const float* bias[kMembers] = {};      // [n_i] or null
  float* c[kMembers] = {};               // [m, n_i]
  Activation act[kMembers] = {};         // applied to each output
  const float* residual[kMembers] = {};  // [m, n_i] or null, added last
};

// values[index] by constant indices: a dynamic index into a kernel parameter
// would copy the parameter to local memory.
template <typename V, int kCount>
__device__ __forceinline__ V Select(const V (&values)[kCount], int index) {
  V v = values[0];
#pragma unroll
  for (int i = 1; i < kCount; ++i) {
    if (index == i) v = values[i];
  }
  return v;
}

// The member whose range in `first` (first_row or first_tile) holds `index`.
[[maybe_unused]] __device__ __forceinline__ int MemberOf(const int64_t (&first)[kMembers + 1],
                                                         int count, int64_t index) {
  int member = 0;
#pragma unroll
  for (int i = 1; i < kMembers; ++i) member += i < count && index >= first[i];
  return member;
}

// Rows within[i] (0 ≤ within[i] < kTileRows) of weight tile `tile`
// (kTileRows rows of one member); null past the member's rows or past the
// last tile. One member lookup serves them all: each lookup reads kernel
// parameters before the first weight load can issue.
template <typename T, int kCount>
__device__ __forceinline__ void TileRows(const SmallGroup<T>& g, int64_t tile,
                                         const int (&within)[kCount], const T* (&rows)[kCount]) {
  const int member = MemberOf(g.first_tile, g.count, tile);
  const int64_t n = Select(g.first_row, member + 1) - Select(g.first_row, member);
  const int64_t j = (tile - Select(g.first_tile, member)) * kTileRows;
  const T* w = Select(g.w, member);
#pragma unroll
  for (int i = 0; i < kCount; ++i) {
    rows[i] =
        tile < g.first_tile[g.count] && j + within[i] < n ? w + (j + within[i]) * g.k : nullptr;
  }
}

// Where a member's outputs go, and its epilogue.
struct Output {
  float* c;
  int64_t n;
  const float* bias;
  Activation act;
  const float* residual;
};

template <typename T>
__device__ __forceinline__ Output OutputOf(const SmallGroup<T>& g, int member) {
  return {Select(g.c, member), Select(g.first_row, member + 1) - Select(g.first_row, member),
          Select(g.bias, member), Select(g.act, member), Select(g.residual, member)};
}

// What an output's epilogue reads besides the product's sum: c[r, j] (when
// beta ≠ 0) and the residual. Read before any store, since c may alias the
// residual and the compiler cannot tell which outputs alias.
struct Prior {
  float c = 0.0f, residual = 0.0f, bias = 0.0f;
};

__device__ __forceinline__ Prior PriorOf(float beta, const Output& o, int64_t r, int64_t j) {
  Prior p;
  if (beta != 0.0f) p.c = o.c[r * o.n + j];
  if (o.residual) p.residual = o.residual[r * o.n + j];
  if (o.bias) p.bias = o.bias[j];
  return p;
}

// c[r, j] ← act(alpha·sum + beta·c[r, j] + bias[j]) + residual[r, j] (act is
// the identity unless set).
__device__ __forceinline__ void Store(float alpha, float beta, const Output& o, int64_t r,
                                      int64_t j, float sum, const Prior& p) {
  const float y = alpha * sum + beta * p.c + p.bias;
  o.c[r * o.n + j] =
      o.act.alpha * ApplyUnary(o.act.op, o.act.in_scale * y) + o.act.beta + p.residual;
}

// A 16-byte weight load that skips L1: each weight is read once.
[[maybe_unused]] __device__ __forceinline__ uint4 LoadStreaming(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// ---------------------------------------------------------------------------
// GEMV: one warp streams one weight row in 16-byte loads (kGemvUnroll in
// flight per lane) against fp32 activations read through the cache, keeping
// one fp32 sum per activation row.

constexpr int kGemvMaxRows = 8;
// The fast path's limit. Every row rereads the fp32 activations through L1,
// so the GEMV's cost grows with rows: on an H100 (GLA 1.3B decode) it beat
// bf16 cuBLASLt at 2 rows (2.09 against 2.47 ms per step) and lost at 4
// (2.87 against 2.55) and 8 (4.39 against 2.73). Against the tensor-core
// kernel it wins at 1 row (573 against 479 tokens/s) and ties at 2.
constexpr int kGemvFastMaxRows = 2;
constexpr int kGemvWarps = 8;
// 8 (a whole 2048-wide row per round trip) measured slower on an H100: GLA
// 1.3B decode at batch 1 went from 2.13 to 2.28 ms per step.
constexpr int kGemvUnroll = 4;

__device__ __forceinline__ float2 Pair(const __nv_bfloat162& v) { return __bfloat1622float2(v); }
__device__ __forceinline__ float2 Pair(const __half2& v) { return __half22float2(v); }

// A lane's kGemvUnroll 16-byte loads of a weight row from vector `base` on
// (zeros past the row's end).
__device__ __forceinline__ void LoadWeightChunk(const uint4* row, int64_t vectors, int64_t base,
                                                int lane, uint4 (&chunk)[kGemvUnroll]) {
#pragma unroll
  for (int u = 0; u < kGemvUnroll; ++u) {
    const int64_t v = base + u * 32 + lane;
    chunk[u] = v < vectors ? __ldg(row + v) : make_uint4(0, 0, 0, 0);
  }
}

// sum[r] += the chunk's weights · the matching activations of row r.
template <typename T, int kRows>
__device__ __forceinline__ void AccumulateChunk(const uint4 (&chunk)[kGemvUnroll], const float* a,
                                                int64_t k, int64_t vectors, int64_t base, int lane,
                                                float (&sum)[kRows]) {
  using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
#pragma unroll
  for (int u = 0; u < kGemvUnroll; ++u) {
    const int64_t v = base + u * 32 + lane;
    if (v >= vectors) break;
    const T2* pairs = reinterpret_cast<const T2*>(&chunk[u]);
    float2 wf[4];
#pragma unroll
    for (int p = 0; p < 4; ++p) wf[p] = Pair(pairs[p]);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float4* x = reinterpret_cast<const float4*>(a + r * k + v * 8);
      const float4 x0 = __ldg(x), x1 = __ldg(x + 1);
      sum[r] += x0.x * wf[0].x + x0.y * wf[0].y + x0.z * wf[1].x + x0.w * wf[1].y + x1.x * wf[2].x +
                x1.y * wf[2].y + x1.z * wf[3].x + x1.w * wf[3].y;
    }
  }
}

// Launched as a dependent (dependent_launch.cuh): the first weight chunk is
// in flight before the wait for the kernel that writes the activations.
template <typename T, int kRows>
__global__ void __launch_bounds__(kGemvWarps * 32) GemvKernel(const SmallGroup<T> g) {
  AllowDependents();
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * static_cast<int64_t>(kGemvWarps) + threadIdx.x / 32;
  if (row >= g.first_row[g.count]) return;
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
  const int64_t vectors = k / 8;
  const uint4* weights = reinterpret_cast<const uint4*>(w + j * k);  // 8 weights per uint4
  float sum[kRows] = {};
  uint4 chunk[kGemvUnroll];
  LoadWeightChunk(weights, vectors, 0, lane, chunk);
  WaitForPrerequisites();  // a (and c when beta ≠ 0) come from earlier kernels
  for (int64_t base = 0; base < vectors; base += 32 * kGemvUnroll) {
    if (base > 0) LoadWeightChunk(weights, vectors, base, lane, chunk);
    AccumulateChunk<T, kRows>(chunk, g.a, k, vectors, base, lane, sum);
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) sum[r] = WarpSum(sum[r]);
  if (lane != 0) return;
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

template <typename T, int kRows>
cudaError_t LaunchGemvRows(const SmallGroup<T>& g, cudaStream_t stream) {
  const int64_t rows = g.first_row[g.count];
  return LaunchDependent(GemvKernel<T, kRows>,
                         dim3(static_cast<unsigned>((rows + kGemvWarps - 1) / kGemvWarps)),
                         dim3(kGemvWarps * 32), stream, g);
}

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

// ---------------------------------------------------------------------------
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
constexpr int kMmaRows = 8;
// Eight warps of one tile each: with four warps of two tiles, one warp per
// scheduler left every instruction's latency exposed (Nsight Compute: ~7
// cycles per issued instruction), and the per-CTA staging and epilogue
// dominated.
constexpr int kMmaWarps = 8;
constexpr int kMmaThreads = kMmaWarps * 32;
constexpr int kMmaCtaOutputs = kMmaWarps * kTileRows;
constexpr int kMmaStepVectors = 4;  // 8-wide vectors per 32-k step
constexpr int kMmaStepK = kMmaStepVectors * 8;
constexpr int kMmaMaxSplits = 8;  // the portable cluster size
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

// 16 bytes from global `src` to shared `dst` without registers; zeros when
// `valid` is false (src must still be a valid address).
[[maybe_unused]] __device__ __forceinline__ void CopyAsync16(void* dst, const void* src,
                                                             bool valid) {
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(to), "l"(src),
               "r"(valid ? 16 : 0));
}

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

template <typename T>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

// acc += A (rows g, g + 8 in a0..a3) · B (b0, b1).
template <typename T>
__device__ __forceinline__ void Mma(float (&acc)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
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
    CopyAsync16(dst + r * stride + col, inside ? a + r * k + k0 + col : a, inside);
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

// Accumulator fragment `acc` of a weight tile whose row gid is CTA output o
// and an activation tile whose row 2·tig is r, into partial[row][output]:
// c0, c1 are output o for rows r and r + 1; c2, c3 output o + 8.
template <int kStride>
__device__ __forceinline__ void StoreFragment(float (*partial)[kStride], const float (&acc)[4],
                                              int o, int r) {
  partial[r][o] = acc[0];
  partial[r + 1][o] = acc[1];
  partial[r][o + 8] = acc[2];
  partial[r + 1][o + 8] = acc[3];
}

// The tensor-core kernels' epilogue for output j (column o of the CTA's
// partials, `partial[row][o]` in every cluster rank's shared memory) in
// activation rows row_of(0 .. kCount - 1) below m: each summed over the
// cluster's splits in split order, then stored; all reads before any store,
// since c may alias the residual.
template <int kCount, int kStride, typename Cluster, typename RowOf>
__device__ __forceinline__ void FinishRows(Cluster& cluster, float (*partial)[kStride], int o,
                                           int64_t m, float alpha, float beta, const Output& out,
                                           int64_t j, RowOf row_of) {
  const int splits = static_cast<int>(cluster.num_blocks());
  float sum[kCount] = {};
  Prior prior[kCount];
#pragma unroll
  for (int i = 0; i < kCount; ++i) {
    const int64_t row = row_of(i);
    if (row < m) {
#pragma unroll
      for (int q = 0; q < kMmaMaxSplits; ++q) {
        if (q < splits) sum[i] += cluster.map_shared_rank(&partial[row][o], q)[0];
      }
      prior[i] = PriorOf(beta, out, row, j);
    }
  }
#pragma unroll
  for (int i = 0; i < kCount; ++i) {
    const int64_t row = row_of(i);
    if (row < m) Store(alpha, beta, out, row, j, sum[i], prior[i]);
  }
}

// The epilogue of a CTA whose kOutputs outputs (kOutputs / kTileRows tiles
// from blockIdx.x on) have their partials in `partial[row][o]` of every
// cluster rank: thread i takes output i % kOutputs in a share of the rows
// (the cluster rank's share, split between the kMmaThreads / kOutputs
// threads of each output), four at a time.
template <int kOutputs, int kStride, typename T>
__device__ __forceinline__ void FinishCta(const SmallGroup<T>& g, float (*partial)[kStride]) {
  static_assert(kMmaThreads % kOutputs == 0 && kOutputs % kTileRows == 0);
  constexpr int kShares = kMmaThreads / kOutputs;
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every split's partial is in its CTA's shared memory
  const int o = static_cast<int>(threadIdx.x) % kOutputs;
  const int64_t stride = static_cast<int64_t>(cluster.num_blocks()) * kShares;
  const int64_t first_row = cluster.block_rank() * kShares + threadIdx.x / kOutputs;
  const int64_t tile = blockIdx.x * static_cast<int64_t>(kOutputs / kTileRows) + o / kTileRows;
  const int member = MemberOf(g.first_tile, g.count, tile);
  const Output out = OutputOf(g, member);
  const int64_t j = (tile - Select(g.first_tile, member)) * kTileRows + o % kTileRows;
  if (tile < g.first_tile[g.count] && j < out.n) {
    // (All sixteen rows of WideMmaKernel at once, 64 more live registers,
    // ran GLA 1.3B at batch 16 at 4,926 tokens/s against 5,671 in batches
    // of four.)
    constexpr int kBatch = 4;
    for (int64_t row0 = first_row; row0 < g.m; row0 += kBatch * stride) {
      FinishRows<kBatch>(cluster, partial, o, g.m, g.alpha, g.beta, out, j,
                         [&](int i) { return row0 + i * stride; });
    }
  }
  cluster.sync();  // no CTA leaves while another reads its shared memory
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
// second CTA. PipeMmaKernel below takes 17 to 32 rows.
constexpr int kWideRows = 16;
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

// ---------------------------------------------------------------------------
// Tensor-core product for 17 to kPipeRows activation rows: the same mma and
// k permutation, with weights and activations streamed through a ring of
// kPipeStages shared-memory stages by cp.async, so each SM keeps tens of KB
// in flight without holding them in registers (the register-fed kernels
// above lost to cuBLASLt from 32 rows on for want of bytes in flight).
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
constexpr int kPipeRows = 32;
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
      CopyAsync16(weights_of(slot) + Swizzled(row, copy_chunk),
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
      CopyAsync16(staged_of(slot) + row * kStageK + 4 * quad, col < k ? g.a + row * k + col : g.a,
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

// How a product is cut: CTAs along the outputs, splits of k (one cluster
// per CTA column) and steps per split.
struct MmaShape {
  int64_t ctas = 0, splits = 0, steps_per_split = 0;
};

// Clusters of `size` CTAs (along y) of `kernel`, with `threads` threads and
// `shared_bytes` of dynamic shared memory each, that run at once. Clusters
// pack into GPCs with SM slots to spare: on an H100 a version of
// WideMmaKernel at two CTAs per SM ran 264 CTAs alone but 237 in clusters
// of 3 and 240 in clusters of 8 (Nsight Compute), so grids cut for 264
// CTAs took two waves.
// (Per device: a process may drive GPUs of different kinds.)
int ActiveClusters(const void* kernel, int threads, size_t shared_bytes, int size) {
  using Key = std::tuple<int, const void*, int, size_t, int>;
  static std::mutex mu;
  static auto* known = new std::map<Key, int>();
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  const std::lock_guard<std::mutex> lock(mu);
  const Key key{device, kernel, threads, shared_bytes, size};
  if (const auto it = known->find(key); it != known->end()) return it->second;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(1, static_cast<unsigned>(size));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = shared_bytes;
  cudaLaunchAttribute cluster = {};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 1;
  cluster.val.clusterDim.y = static_cast<unsigned>(size);
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  int clusters = 0;
  if (size == 1) {  // no cluster: CTAs per SM times SMs
    int sms = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&clusters, kernel, threads, shared_bytes) ==
            cudaSuccess &&
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess) {
      clusters *= sms;
    } else {
      (void)cudaGetLastError();
      clusters = 0;
    }
  } else if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
    (void)cudaGetLastError();
    clusters = 0;
  }
  return (*known)[key] = clusters;
}

// A CTA's fixed cost (first loads, the cluster's reduction, the epilogue) in
// 32-k steps of streaming, for the cut below.
constexpr int64_t kCtaOverheadSteps = 4;

// Cuts `steps` steps (of a kernel's k granule) of a product with `ctas` CTA
// columns into the splits (the cluster size, at most kMmaMaxSplits) that
// minimize waves of clusters × (steps per split + overhead_steps).
// shared_bytes(steps per split) is a CTA's dynamic shared memory, 0 when too
// much. Zero splits: none fits.
template <typename SharedBytes>
MmaShape ShapeFor(const void* kernel, int threads, int64_t ctas, int64_t steps,
                  int64_t overhead_steps, SharedBytes shared_bytes) {
  MmaShape best;
  int64_t best_cost = 0;
  for (int64_t splits = 1; splits <= std::min<int64_t>(kMmaMaxSplits, steps); ++splits) {
    const int64_t per_split = (steps + splits - 1) / splits;
    if ((steps + per_split - 1) / per_split != splits) continue;  // a smaller count's cut
    const size_t bytes = shared_bytes(per_split);
    const int clusters =
        bytes == 0 ? 0 : ActiveClusters(kernel, threads, bytes, static_cast<int>(splits));
    if (clusters <= 0) continue;
    const int64_t cost = (ctas + clusters - 1) / clusters * (per_split + overhead_steps);
    if (best.splits == 0 || cost < best_cost) {
      best = {ctas, splits, per_split};
      best_cost = cost;
    }
  }
  return best;
}

int64_t StepsOf(int64_t k) { return (k + kMmaStepK - 1) / kMmaStepK; }

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
  if (s.splits == 0) return cudaErrorInvalidValue;
  return LaunchDependentInClusters(
      WideMmaKernel<T>, dim3(static_cast<unsigned>(s.ctas), static_cast<unsigned>(s.splits)),
      dim3(kWideThreads), dim3(1, static_cast<unsigned>(s.splits), 1), kWideSharedBytes, stream, g,
      s.steps_per_split);
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
  if (s.splits == 0) return cudaErrorInvalidValue;
  return LaunchDependentInClusters(
      PipeMmaKernel<T, kActTiles>,
      dim3(static_cast<unsigned>(s.ctas), static_cast<unsigned>(s.splits)), dim3(kPipeThreads),
      dim3(1, static_cast<unsigned>(s.splits), 1), kBytes, stream, g, s.steps_per_split);
}

// Three activation tiles up to 24 rows, four above.
template <typename T>
cudaError_t LaunchPipeMma(const SmallGroup<T>& g, cudaStream_t stream) {
  if (g.m <= 24) return LaunchPipeMmaTiles<T, 3>(g, stream);
  return LaunchPipeMmaTiles<T, kPipeRows / 8>(g, stream);
}

template <typename T>
cudaError_t LaunchMma(const SmallGroup<T>& g, cudaStream_t stream) {
  if (g.m > kWideRows) return LaunchPipeMma(g, stream);
  if (g.m > kMmaRows) return LaunchWideMma(g, stream);
  static const cudaError_t configured = cudaFuncSetAttribute(
      MmaKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMmaMaxSharedBytes);
  if (configured != cudaSuccess) return configured;
  const MmaShape s = ShapeFor(reinterpret_cast<const void*>(MmaKernel<T>), kMmaThreads,
                              (g.first_tile[g.count] + kMmaWarps - 1) / kMmaWarps, StepsOf(g.k),
                              kCtaOverheadSteps, MmaSharedBytes);
  if (s.splits == 0) return cudaErrorInvalidValue;  // SmallProductFor rules this out
  const Staging stage(s.steps_per_split * kMmaStepK);
  return LaunchDependentInClusters(
      MmaKernel<T>, dim3(static_cast<unsigned>(s.ctas), static_cast<unsigned>(s.splits)),
      dim3(kMmaThreads), dim3(1, static_cast<unsigned>(s.splits), 1),
      MmaSharedBytes(s.steps_per_split), stream, g, s.steps_per_split, stage);
}

template <typename T>
SmallGroup<T> GroupOf(std::span<const GemmCall> calls) {
  SmallGroup<T> g;
  const GemmCall& first = calls.front();
  g.a = first.a;
  g.m = first.m;
  g.k = first.k;
  g.alpha = first.alpha;
  g.beta = first.beta;
  g.count = static_cast<int>(calls.size());
  for (int i = 0; i < g.count; ++i) {
    g.first_row[i + 1] = g.first_row[i] + calls[i].n;
    g.first_tile[i + 1] = g.first_tile[i] + TilesOf(calls[i].n);
    g.w[i] = static_cast<const T*>(calls[i].b);
    g.bias[i] = calls[i].bias;
    g.c[i] = calls[i].c;
    g.act[i] = calls[i].act;
    g.residual[i] = calls[i].residual;
  }
  return g;
}

template <typename T>
cudaError_t Launch(SmallProduct kind, std::span<const GemmCall> calls, cudaStream_t stream) {
  const SmallGroup<T> g = GroupOf<T>(calls);
  return kind == SmallProduct::kGemv ? LaunchGemv(g, stream) : LaunchMma(g, stream);
}

}  // namespace

SmallProduct SmallProductFor(std::span<const GemmCall> calls, GemmPrecision precision) {
  if (calls.empty() || calls.size() > kMembers) return SmallProduct::kNone;
  const GemmCall& first = calls.front();
  for (const GemmCall& g : calls) {
    if ((g.b_type != DType::kBF16 && g.b_type != DType::kF16) || g.trans_a || !g.trans_b ||
        g.m == 0 || g.n == 0 || g.k == 0 || g.k % 8 != 0 || !Aligned16(g.a) || !Aligned16(g.b) ||
        g.a != first.a || g.m != first.m || g.k != first.k || g.b_type != first.b_type ||
        g.alpha != first.alpha || g.beta != first.beta) {
      return SmallProduct::kNone;
    }
  }
  const bool fast = precision == GemmPrecision::kFast;
  if (first.m <= (fast ? kGemvFastMaxRows : kGemvMaxRows)) return SmallProduct::kGemv;
  // Clusters and the dependent launch's wait need sm_90.
  if (fast && first.m <= kPipeRows && HopperOrLater()) {
    // MmaKernel stages a split of at least k / kMmaMaxSplits.
    const int64_t steps = StepsOf(first.k);
    if (first.m > kMmaRows || MmaSharedBytes((steps + kMmaMaxSplits - 1) / kMmaMaxSplits) > 0)
      return SmallProduct::kTensorCore;
  }
  return SmallProduct::kNone;
}

cudaError_t LaunchSmallProduct(SmallProduct kind, std::span<const GemmCall> calls,
                               cudaStream_t stream) {
  return calls.front().b_type == DType::kBF16 ? Launch<__nv_bfloat16>(kind, calls, stream)
                                              : Launch<__half>(kind, calls, stream);
}

}  // namespace lair::kernels::cuda::dense
