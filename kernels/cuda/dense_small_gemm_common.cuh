// What the decode-sized product kernels (dense_small_gemm_*.cu) share: a
// launch's group of products and the lookups of its members and weight
// tiles, the epilogue, the mma primitive, the tensor-core kernels'
// cluster reduction, and the cut of a product into CTAs and k splits.
// dense_small_gemm.cu routes a group to one of the launchers declared last.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/dense_common.cuh"
#include "kernels/cuda/dense_small_gemm.h"
#include "kernels/cuda/dependent_launch.cuh"

namespace lair::kernels::cuda::dense::small_product {

inline constexpr int kMembers = kSmallProductMembers;

// Output features per tensor-core tile (the m of mma.m16n8k16).
inline constexpr int kTileRows = 16;

inline int64_t TilesOf(int64_t n) { return (n + kTileRows - 1) / kTileRows; }

// One launch's products: member i owns weight rows [first_row[i],
// first_row[i + 1]) of the launch's concatenated outputs, in its own c; for
// the tensor-core kernel also the kTileRows-row tiles [first_tile[i],
// first_tile[i + 1]). All members share a, m, k, alpha and beta.
template <typename T>
struct SmallGroup {
  const float* a = nullptr;  // [m, k]
  const T* a16 = nullptr;    // [m, k]: a rounded to T, read instead of a (the ring kernel)
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
  // SwiGLU's gate and up products (members 0 and 1, of equal n, without
  // bias, activation or residual; alpha 1, beta 0): silu(gate) ∘ up, formed
  // in the epilogue, so that no pass of its own stands between them and the
  // down product. The GEMV writes it to c[0]; the ring kernel, rounded to T,
  // to silu_pair16 (c unused).
  bool silu_pair = false;
  T* silu_pair16 = nullptr;  // [m, n]
  // The GEMV only (GemmCall::a_rms): every output of row r scaled by
  // 1/√(mean(a[r]²) + rms_eps) before the bias and activation.
  bool row_rms = false;
  float rms_eps = 0.0f;
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
__device__ __forceinline__ int MemberOf(const int64_t (&first)[kMembers + 1], int count,
                                        int64_t index) {
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

// The eight 16-bit weights of a 16-byte vector as four fp32 pairs (the
// exact kernels' arithmetic).
template <typename T>
__device__ __forceinline__ void Widen8(const uint4& v, float2 (&wf)[4]) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2* pairs = reinterpret_cast<const __half2*>(&v);
#pragma unroll
    for (int p = 0; p < 4; ++p) wf[p] = __half22float2(pairs[p]);
  } else {
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int p = 0; p < 4; ++p) wf[p] = __bfloat1622float2(pairs[p]);
  }
}

// wf (Widen8) · the eight activations x0, x1, in fp32.
__device__ __forceinline__ float Dot8(const float2 (&wf)[4], const float4& x0, const float4& x1) {
  return x0.x * wf[0].x + x0.y * wf[0].y + x0.z * wf[1].x + x0.w * wf[1].y + x1.x * wf[2].x +
         x1.y * wf[2].y + x1.z * wf[3].x + x1.w * wf[3].y;
}

// ---------------------------------------------------------------------------
// The rows each kernel takes (SmallProductFor routes by them).

// The GEMV, exact: both precisions, up to kGemvMaxRows rows.
inline constexpr int kGemvMaxRows = 8;
// The fast path's limit. Every row rereads the fp32 activations through L1,
// so the GEMV's cost grows with rows: on an H100 (GLA 1.3B decode) it beat
// bf16 cuBLASLt at 2 rows (2.09 against 2.47 ms per step) and lost at 4
// (2.87 against 2.55) and 8 (4.39 against 2.73). Against the tensor-core
// ring (H200, GLA 1.3B decode through the step graphs) it wins at 1 row
// (1.18 against 1.26 ms a step) and loses at 2 (1.52 against 1.35; GSA
// 1.3B 1.70 against 1.44).
inline constexpr int kGemvFastMaxRows = 1;

// The narrow-k kernel, exact: k up to kNarrowK, more rows than the GEMV
// takes, up to kNarrowKMaxRows (a decode batch; cuBLASLt above).
inline constexpr int kNarrowK = 64;
inline constexpr int kNarrowKMaxRows = 1024;

// The tensor-core kernel: a shared-memory ring from the GEMV's rows up to
// kPipeRows (dense_small_gemm_ring.cu); cuBLASLt above.
inline constexpr int kPipeRows = 32;
static_assert(kPipeRows == kSmallProductMaxRows);

// ---------------------------------------------------------------------------
// The tensor-core kernel: CTAs of kMmaWarps warps, k in steps of kMmaStepK
// (two m16n8k16 mmas), split over clusters of up to kMmaMaxSplits CTAs.

inline constexpr int kMmaWarps = 8;
inline constexpr int kMmaThreads = kMmaWarps * 32;
inline constexpr int kMmaStepVectors = 4;  // 8-wide vectors per 32-k step
inline constexpr int kMmaStepK = kMmaStepVectors * 8;
inline constexpr int kMmaMaxSplits = 8;  // the portable cluster size

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

// *at summed over the cluster's ranks in split order (`at` in this CTA's
// shared memory, the same offset in every rank's): the order every
// tensor-core epilogue sums in, so that they agree bit for bit.
//
// Each rank's value is read through its 32-bit shared::cluster address
// (mapa), not through the 64-bit generic pointer that map_shared_rank
// gives. With the relaxed last barrier (ClusterBarrierBeforeExit) this ran
// GLA 1.3B's decode step 0–1.5% faster at batch 32, 1–3% at 16 and 2.5–4%
// at 4 on an H200 (docs/benchmarks.md); the epilogue's sums and stores had
// taken 1.7–3 µs of each batch-32 ring product.
template <typename Cluster>
__device__ __forceinline__ float ClusterSum(Cluster& cluster, float* at) {
  const int splits = static_cast<int>(cluster.num_blocks());
  const auto local = static_cast<uint32_t>(__cvta_generic_to_shared(at));
  // Every rank's load is issued before the first add waits on one.
  float value[kMmaMaxSplits];
#pragma unroll
  for (int q = 0; q < kMmaMaxSplits; ++q) {
    if (q < splits) {
      uint32_t remote;
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(q));
      asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(value[q]) : "r"(remote) : "memory");
    }
  }
  float sum = 0.0f;
#pragma unroll
  for (int q = 0; q < kMmaMaxSplits; ++q) {
    if (q < splits) sum += value[q];
  }
  return sum;
}

// The epilogue's last cluster barrier: no CTA leaves while another reads its
// shared memory. Its arrive is relaxed, since those reads have returned by
// then and nothing else needs releasing; a plain cluster.sync() would first
// wait for the CTA's stores to c to be performed (a GPU-scope MEMBAR), which
// cost 0.25–0.5 µs a ring product at batch 32 on an H200.
__device__ __forceinline__ void ClusterBarrierBeforeExit() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n\tbarrier.cluster.wait.aligned;" ::
                   : "memory");
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
  float sum[kCount] = {};
  Prior prior[kCount];
#pragma unroll
  for (int i = 0; i < kCount; ++i) {
    const int64_t row = row_of(i);
    if (row < m) {
      sum[i] = ClusterSum(cluster, &partial[row][o]);
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
    // (All sixteen rows at once, 64 more live registers, ran GLA 1.3B at
    // batch 16 at 4,926 tokens/s against 5,671 in batches of four, in a
    // kernel of 9 to 16 rows since removed.)
    constexpr int kBatch = 4;
    for (int64_t row0 = first_row; row0 < g.m; row0 += kBatch * stride) {
      FinishRows<kBatch>(cluster, partial, o, g.m, g.alpha, g.beta, out, j,
                         [&](int i) { return row0 + i * stride; });
    }
  }
  ClusterBarrierBeforeExit();
}

// ---------------------------------------------------------------------------
// The cut (host side).

// How a product is cut: CTAs along the outputs, splits of k (one cluster
// per CTA column) and steps per split.
struct MmaShape {
  int64_t ctas = 0, splits = 0, steps_per_split = 0;
};

// A CTA's fixed cost (first loads, the cluster's reduction, the epilogue) in
// 32-k steps of streaming, for ShapeFor.
inline constexpr int64_t kCtaOverheadSteps = 4;

// Cuts `steps` steps (of a kernel's k granule) of a product with `ctas` CTA
// columns into the splits (the cluster size, at most kMmaMaxSplits) that
// minimize waves of clusters × (steps per split + overhead_steps), counting
// the clusters of `kernel` (`threads` threads) that run at once.
// shared_bytes(steps per split) is a CTA's dynamic shared memory, 0 when too
// much. Zero splits: none fits.
MmaShape ShapeFor(const void* kernel, int threads, int64_t ctas, int64_t steps,
                  int64_t overhead_steps, size_t (*shared_bytes)(int64_t));

// `kernel` over the cut `s` as a dependent: s.ctas × s.splits CTAs of
// `threads` threads, blockIdx.y the split, in clusters of (1, s.splits, 1),
// each with `shared_bytes` of dynamic shared memory. Invalid when nothing
// fitted (no splits).
template <typename... Params, typename... Args>
cudaError_t LaunchCut(void (*kernel)(Params...), const MmaShape& s, int threads,
                      size_t shared_bytes, cudaStream_t stream, Args&&... args) {
  if (s.splits == 0) return cudaErrorInvalidValue;
  const auto splits = static_cast<unsigned>(s.splits);
  return LaunchDependentInClusters(kernel, dim3(static_cast<unsigned>(s.ctas), splits),
                                   dim3(static_cast<unsigned>(threads)), dim3(1, splits, 1),
                                   shared_bytes, stream, std::forward<Args>(args)...);
}

// ---------------------------------------------------------------------------
// The launchers, T __nv_bfloat16 or __half; each takes g.m within its rows.

// 1 to kGemvMaxRows rows (dense_small_gemm_gemv.cu).
template <typename T>
cudaError_t LaunchGemv(const SmallGroup<T>& g, cudaStream_t stream);

// k ≤ kNarrowK, up to kNarrowKMaxRows rows (dense_small_gemm_narrow_k.cu).
template <typename T>
cudaError_t LaunchNarrowK(const SmallGroup<T>& g, cudaStream_t stream);

// kGemvFastMaxRows + 1 to kPipeRows rows (dense_small_gemm_ring.cu), sm_90.
template <typename T>
cudaError_t LaunchPipeMma(const SmallGroup<T>& g, cudaStream_t stream);

}  // namespace lair::kernels::cuda::dense::small_product
