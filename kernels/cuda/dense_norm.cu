// RMS / Layer normalization over groups of a row, with the gate modes of
// kernels/dense.h, and its backward. One team per group: a warp for groups up
// to kWarpGroupMax columns, a 256-thread block above (and, forward, when there
// are few groups). The team walks its group in kVec-wide steps (16-byte loads
// when the group and pointers allow), once per statistic; re-reads hit L1/L2.
// Forward, groups of up to kMaxHeldVectors 16-byte vectors per thread are
// loaded once into registers instead (NormHeldKernel), all loads in flight
// together.
// fp32 math:
//   u = x · silu(gate) (kBefore), silu(x) (kSiluInput) or x,  μ = mean(u) (Layer) or 0,
//   r = 1/√(mean((u − μ)²) + ε),  x̂ = (u − μ)·r,
//   y = x̂ · w · silu(gate) (kAfter) or x̂ · w.
// Backward, with dz = dy·silu(gate) (kAfter) or dy and ĝ = dz·w:
//   du = r·(ĝ − mean(ĝ) [Layer] − x̂·mean(ĝ·x̂)),
//   dx = du·silu(gate) (kBefore), du·silu'(x) (kSiluInput) or du,
//   d_gate = dy·x̂·w·silu'(gate) (kAfter) or du·x·silu'(gate) (kBefore),
//   d_w[c] += Σ_rows dz·x̂  (a second, column-parallel kernel, double sums).
#include <type_traits>

#include "kernels/cuda/dense_common.cuh"
#include "kernels/cuda/dense_launch.h"
#include "kernels/cuda/dependent_launch.cuh"

namespace lair::kernels::cuda::dense {
namespace {

constexpr int kWarpGroupMax = 1024;
// Fewer groups than this leave most of the GPU idle under warp teams (four
// to a CTA), and each warp walks its group alone: a decode step's per-head
// norm took 8.7 µs so at GLA 1.3B's batch 1 (4 groups of 512) and 7 µs at
// batch 32 (128 groups, 32 CTAs; H200). Block teams shorten the walk and
// spread the groups over more SMs.
constexpr int64_t kMinWarpTeamGroups = 512;
constexpr int kWarpTeamBlock = 128;  // 4 warp teams per block
constexpr int kBlockTeam = 256;
constexpr int kColumnThreads = 256;
// CTAs per SM NormKernel is compiled for: 64 registers a thread. Left to
// itself ptxas aimed at 40 and spilled.
template <int kTeam>
constexpr int kNormMinBlocks = 65536 / 64 / (kTeam == 32 ? kWarpTeamBlock : kBlockTeam);
// 16-byte vectors of u a thread of NormHeldKernel holds (32 registers).
constexpr int kMaxHeldVectors = 8;

// The team's group: its first element in [rows, cols], the offset of its
// weights (its column offset, or 0 when the groups share the weight), and
// this thread's rank in the team. False when the team has no group.
template <int kTeam>
__device__ __forceinline__ bool FindGroup(const NormParams& p, int64_t* base, int64_t* w0,
                                          int64_t* group_index, int* tid) {
  const int64_t per_row = p.cols / p.group;
  int64_t team;
  if constexpr (kTeam == 32) {
    team = blockIdx.x * static_cast<int64_t>(kWarpTeamBlock / 32) + threadIdx.x / 32;
    *tid = threadIdx.x % 32;
  } else {
    team = blockIdx.x;
    *tid = threadIdx.x;
  }
  if (team >= p.rows * per_row) return false;
  const int64_t r = team / per_row;
  const int64_t g0 = (team - r * per_row) * p.group;
  *base = r * p.cols + g0;
  *w0 = p.shared_weight ? 0 : g0;
  *group_index = team;
  return true;
}

// kVec elements of 16-bit T at offset `at` of `base`, as floats (kVec = 4:
// one 8-byte load, `base + at` 8-byte aligned).
template <int kVec, typename T>
__device__ __forceinline__ void LoadSixteenBit(const void* base, int64_t at, float (&v)[kVec]) {
  const T* p = static_cast<const T*>(base) + at;
  if constexpr (kVec == 4) {
    const float4 f = UnpackFour<T>(*reinterpret_cast<const uint2*>(p));
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = static_cast<float>(p[i]);
  }
}

// kVec elements at offset `at` of `base`, of `type` (F32, BF16 or F16), as floats.
template <int kVec>
__device__ __forceinline__ void LoadAsFloat(const void* base, DType type, int64_t at,
                                            float (&v)[kVec]) {
  switch (type) {
    case DType::kBF16:
      LoadSixteenBit<kVec, __nv_bfloat16>(base, at, v);
      break;
    case DType::kF16:
      LoadSixteenBit<kVec, __half>(base, at, v);
      break;
    default:
      LoadVec<kVec>(static_cast<const float*>(base) + at, v);
  }
}

// x, kVec elements at offset `at`, as floats.
template <int kVec>
__device__ __forceinline__ void LoadX(const NormParams& p, int64_t at, float (&x)[kVec]) {
  LoadAsFloat<kVec>(p.x, p.x_type, at, x);
}
// The gate after the norm (kAfter), F32 or BF16, likewise. A 16-bit gate is
// a product's output, which the fast path writes in bf16 alone: F16 as a
// third case spilled the held kernels' reciprocal.
template <int kVec>
__device__ __forceinline__ void LoadGate(const NormParams& p, int64_t at, float (&g)[kVec]) {
  if (p.gate_type == DType::kBF16) {
    LoadSixteenBit<kVec, __nv_bfloat16>(p.gate, at, g);
  } else {
    LoadVec<kVec>(static_cast<const float*>(p.gate) + at, g);
  }
}

__device__ __forceinline__ float XAt(const NormParams& p, int64_t at) {
  float x[1];
  LoadX<1>(p, at, x);
  return x[0];
}
// The gate where only fp32 comes: before the norm (kBefore) and in the
// backward (CheckNormInputs).
__device__ __forceinline__ const float* FloatGate(const NormParams& p) {
  return static_cast<const float*>(p.gate);
}

// u = x·silu(gate) (kBefore), silu(x) (kSiluInput) or x, kVec elements at offset `at`.
template <int kVec>
__device__ __forceinline__ void LoadU(const NormParams& p, int64_t at, float (&u)[kVec]) {
  LoadX<kVec>(p, at, u);
  if (p.gate_mode == NormGate::kSiluInput) {  // silu(x) = x·σ(x)
#pragma unroll
    for (int e = 0; e < kVec; ++e) u[e] *= Sigmoid(u[e]);
  } else if (p.gate_mode == NormGate::kBefore) {
    float g[kVec];
    LoadVec<kVec>(FloatGate(p) + at, g);
#pragma unroll
    for (int e = 0; e < kVec; ++e) u[e] *= Silu(g[e]);
  }
}

// μ and r of the group at `base` (every team thread gets them).
template <int kTeam, int kVec>
__device__ __forceinline__ float2 GroupStats(const NormParams& p, int64_t base, int tid,
                                             float* shared) {
  float mean = 0.0f;
  if (p.kind == NormKind::kLayer) {
    float sum = 0.0f;
    for (int64_t i = tid * kVec; i < p.group; i += kTeam * kVec) {
      float u[kVec];
      LoadU<kVec>(p, base + i, u);
#pragma unroll
      for (int e = 0; e < kVec; ++e) sum += u[e];
    }
    mean = TeamSum<kTeam>(sum, shared) / static_cast<float>(p.group);
  }
  float sq = 0.0f;
  for (int64_t i = tid * kVec; i < p.group; i += kTeam * kVec) {
    float u[kVec];
    LoadU<kVec>(p, base + i, u);
#pragma unroll
    for (int e = 0; e < kVec; ++e) sq += (u[e] - mean) * (u[e] - mean);
  }
  const float var = TeamSum<kTeam>(sq, shared) / static_cast<float>(p.group);
  return make_float2(mean, 1.0f / sqrtf(var + p.eps));
}

// v into `Out` elements at p (fp32 as it is, 16-bit types rounded to nearest).
template <int kVec, typename Out>
__device__ __forceinline__ void StoreOut(Out* p, const float (&v)[kVec]) {
  if constexpr (std::is_same_v<Out, float>) {
    StoreVec<kVec>(p, v);
  } else if constexpr (kVec == 4) {
    *reinterpret_cast<uint2*>(p) = PackFour<Out>(make_float4(v[0], v[1], v[2], v[3]));
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) p[i] = Out(v[i]);
  }
}

// y = (u − μ)·r·w, times silu(gate) (kAfter), for u, the kVec elements at
// offset i of the group at `base` (weights from w0), stored into p.y.
template <int kVec, typename Out>
__device__ __forceinline__ void StoreNormed(const NormParams& p, int64_t base, int64_t w0,
                                            int64_t i, float2 stats, const float (&u)[kVec]) {
  float w[kVec];
  if (p.weight) {
    LoadVec<kVec>(p.weight + w0 + i, w);
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e) w[e] = 1.0f;
  }
  float y[kVec];
#pragma unroll
  for (int e = 0; e < kVec; ++e) y[e] = (u[e] - stats.x) * stats.y * w[e];
  if (p.gate_mode == NormGate::kAfter) {
    float g[kVec];
    LoadGate<kVec>(p, base + i, g);
#pragma unroll
    for (int e = 0; e < kVec; ++e) y[e] *= Silu(g[e]);
  }
  StoreOut<kVec>(static_cast<Out*>(p.y) + base + i, y);
}

template <int kTeam, int kVec, typename Out>
__global__ void __launch_bounds__(kTeam == 32 ? kWarpTeamBlock : kBlockTeam, kNormMinBlocks<kTeam>)
    NormKernel(const NormParams p) {
  AllowDependents();
  WaitForPrerequisites();
  __shared__ float shared[kBlockTeam / 32];
  int64_t base, w0, group_index;
  int tid;
  if (!FindGroup<kTeam>(p, &base, &w0, &group_index, &tid)) return;
  const float2 stats = GroupStats<kTeam, kVec>(p, base, tid, shared);
  for (int64_t i = tid * kVec; i < p.group; i += kTeam * kVec) {
    float u[kVec];
    LoadU<kVec>(p, base + i, u);
    StoreNormed<kVec, Out>(p, base, w0, i, stats, u);
  }
}

// NormKernel for groups of at most kTeam · 4 · kItems elements (16-byte
// aligned, a multiple of 4): each thread holds its vectors of u between the
// statistics and the output, so x (and the gate of kBefore) is read once and
// every load of the group is issued before the first sum needs one. Its sums
// run in NormKernel's order, so the two agree bit for bit.
template <int kTeam, int kItems, typename Out>
__global__ void __launch_bounds__(kTeam == 32 ? kWarpTeamBlock : kBlockTeam)
    NormHeldKernel(const NormParams p) {
  AllowDependents();
  WaitForPrerequisites();
  __shared__ float shared[kBlockTeam / 32];
  int64_t base, w0, group_index;
  int tid;
  if (!FindGroup<kTeam>(p, &base, &w0, &group_index, &tid)) return;
  // Vector `it` of this thread starts at offset(it) of the group.
  const auto offset = [&](int it) { return (it * int64_t{kTeam} + tid) * 4; };
  const auto held = [&](int it) { return offset(it) < p.group; };
  float u[kItems][4];
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    if (held(it)) LoadU<4>(p, base + offset(it), u[it]);
  }
  float mean = 0.0f;
  if (p.kind == NormKind::kLayer) {
    float sum = 0.0f;
#pragma unroll
    for (int it = 0; it < kItems; ++it) {
      if (!held(it)) continue;
#pragma unroll
      for (int e = 0; e < 4; ++e) sum += u[it][e];
    }
    mean = TeamSum<kTeam>(sum, shared) / static_cast<float>(p.group);
  }
  float sq = 0.0f;
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    if (!held(it)) continue;
#pragma unroll
    for (int e = 0; e < 4; ++e) sq += (u[it][e] - mean) * (u[it][e] - mean);
  }
  const float r = 1.0f / sqrtf(TeamSum<kTeam>(sq, shared) / static_cast<float>(p.group) + p.eps);
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    if (held(it)) StoreNormed<4, Out>(p, base, w0, offset(it), {mean, r}, u[it]);
  }
}

// Per element of the group: x̂, ĝ = dz·w, and (kAfter, when wanted) d_gate.
template <int kVec>
__device__ __forceinline__ void BackwardTerms(const NormBackwardParams& b, int64_t at, int64_t col,
                                              float2 stats, float (&xhat)[kVec],
                                              float (&ghat)[kVec], bool write_gate) {
  const NormParams& p = b.fwd;
  float dy[kVec], w[kVec];
  LoadU<kVec>(p, at, xhat);
  LoadVec<kVec>(b.d_y + at, dy);
  if (p.weight) {
    LoadVec<kVec>(p.weight + col, w);
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e) w[e] = 1.0f;
  }
#pragma unroll
  for (int e = 0; e < kVec; ++e) xhat[e] = (xhat[e] - stats.x) * stats.y;
  if (p.gate_mode == NormGate::kAfter) {
    float g[kVec], dg[kVec];
    LoadVec<kVec>(FloatGate(p) + at, g);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      dg[e] = dy[e] * xhat[e] * w[e] * SiluGrad(g[e]);
      dy[e] *= Silu(g[e]);
    }
    if (write_gate) StoreVec<kVec>(b.d_gate + at, dg);
  }
#pragma unroll
  for (int e = 0; e < kVec; ++e) ghat[e] = dy[e] * w[e];
}

template <int kTeam, int kVec>
__global__ void __launch_bounds__(kTeam == 32 ? kWarpTeamBlock : kBlockTeam)
    NormBackwardKernel(const NormBackwardParams b) {
  __shared__ float shared[kBlockTeam / 32];
  const NormParams& p = b.fwd;
  int64_t base, w0, group_index;
  int tid;
  if (!FindGroup<kTeam>(p, &base, &w0, &group_index, &tid)) return;
  const float2 stats = GroupStats<kTeam, kVec>(p, base, tid, shared);
  if (b.stats && tid == 0) b.stats[group_index] = stats;

  // Σ ĝ and Σ ĝ·x̂ over the group.
  float sum_g = 0.0f, sum_gx = 0.0f;
  for (int64_t i = tid * kVec; i < p.group; i += kTeam * kVec) {
    float xhat[kVec], ghat[kVec];
    BackwardTerms<kVec>(b, base + i, w0 + i, stats, xhat, ghat, b.d_gate != nullptr);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      sum_g += ghat[e];
      sum_gx += ghat[e] * xhat[e];
    }
  }
  const float inv_n = 1.0f / static_cast<float>(p.group);
  const float mean_g = p.kind == NormKind::kLayer ? TeamSum<kTeam>(sum_g, shared) * inv_n : 0.0f;
  const float mean_gx = TeamSum<kTeam>(sum_gx, shared) * inv_n;

  for (int64_t i = tid * kVec; i < p.group; i += kTeam * kVec) {
    float xhat[kVec], du[kVec];
    BackwardTerms<kVec>(b, base + i, w0 + i, stats, xhat, du, false);
#pragma unroll
    for (int e = 0; e < kVec; ++e) du[e] = stats.y * (du[e] - mean_g - xhat[e] * mean_gx);
    if (p.gate_mode == NormGate::kBefore) {
      float x[kVec], g[kVec], dg[kVec];
      LoadX<kVec>(p, base + i, x);
      LoadVec<kVec>(FloatGate(p) + base + i, g);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        dg[e] = du[e] * x[e] * SiluGrad(g[e]);
        du[e] *= Silu(g[e]);
      }
      if (b.d_gate) StoreVec<kVec>(b.d_gate + base + i, dg);
    } else if (p.gate_mode == NormGate::kSiluInput) {
      float x[kVec];
      LoadX<kVec>(p, base + i, x);
#pragma unroll
      for (int e = 0; e < kVec; ++e) du[e] *= SiluGrad(x[e]);
    }
    StoreVec<kVec>(b.dx + base + i, du);
  }
}

// Weight elements: cols, or one group's when shared by the groups.
__host__ __device__ inline int64_t WeightColumns(const NormParams& p) {
  return p.shared_weight ? p.group : p.cols;
}

// d_w[c] (+)= Σ_{rows of this split} dz·x̂ (over every group of a row when
// the weight is shared), one thread per weight element, from the saved
// (μ, r) of each group.
__global__ void __launch_bounds__(kColumnThreads) NormWeightGradKernel(const NormBackwardParams b) {
  const NormParams& p = b.fwd;
  const int64_t c = blockIdx.x * static_cast<int64_t>(kColumnThreads) + threadIdx.x;
  const int64_t columns = WeightColumns(p);
  if (c >= columns) return;
  const int64_t per_row = p.cols / p.group;
  const int64_t chunk = (p.rows + b.splits - 1) / b.splits;
  const int64_t lo = blockIdx.y * chunk;
  const int64_t hi = lo + chunk < p.rows ? lo + chunk : p.rows;
  double sum = 0.0;
  for (int64_t r = lo; r < hi; ++r) {
    for (int64_t col = c; col < p.cols; col += columns) {
      const int64_t at = r * p.cols + col;
      float u = XAt(p, at), dz = b.d_y[at];
      if (p.gate_mode == NormGate::kBefore) u *= Silu(FloatGate(p)[at]);
      if (p.gate_mode == NormGate::kSiluInput) u = Silu(u);
      if (p.gate_mode == NormGate::kAfter) dz *= Silu(FloatGate(p)[at]);
      const float2 st = b.stats[r * per_row + col / p.group];
      sum += static_cast<double>(dz) * ((u - st.x) * st.y);
    }
  }
  if (b.splits == 1) {
    StoreColumnSum(sum, c, b.d_weight, columns, nullptr, true);
  } else {
    b.partial[blockIdx.y * columns + c] = sum;
  }
}

bool Vectorizable(const NormParams& p) {
  return p.group % 4 == 0 && Aligned16(p.x) && Aligned16(p.y) &&
         (p.weight == nullptr || Aligned16(p.weight)) && (p.gate == nullptr || Aligned16(p.gate));
}

// kernel(p) over `groups` groups with kTeam-thread teams, launched as a
// programmatic dependent (the kernels wait before they read).
template <int kTeam>
cudaError_t LaunchTeams(void (*kernel)(NormParams), const NormParams& p, int64_t groups,
                        cudaStream_t stream) {
  if constexpr (kTeam == 32) {
    return LaunchDependent(kernel, BlocksFor(groups, kWarpTeamBlock / 32), kWarpTeamBlock, stream,
                           p);
  }
  return LaunchDependent(kernel, static_cast<unsigned>(groups), kBlockTeam, stream, p);
}

// NormHeldKernel when each thread's vectors of a group fit kMaxHeldVectors
// (vectorizable groups only), else NormKernel.
template <int kTeam, int kVec, typename Out>
cudaError_t LaunchForwardTo(const NormParams& p, int64_t groups, cudaStream_t stream) {
  if constexpr (kVec == 4) {
    const int64_t vectors = (p.group / 4 + kTeam - 1) / kTeam;  // per thread
    if (vectors <= 1) return LaunchTeams<kTeam>(NormHeldKernel<kTeam, 1, Out>, p, groups, stream);
    if (vectors <= 2) return LaunchTeams<kTeam>(NormHeldKernel<kTeam, 2, Out>, p, groups, stream);
    if (vectors <= 4) return LaunchTeams<kTeam>(NormHeldKernel<kTeam, 4, Out>, p, groups, stream);
    // A warp team's group (at most kWarpGroupMax) always fits.
    static_assert(kWarpGroupMax <= 32 * 4 * kMaxHeldVectors);
    if (kTeam == 32 || vectors <= kMaxHeldVectors) {
      return LaunchTeams<kTeam>(NormHeldKernel<kTeam, kMaxHeldVectors, Out>, p, groups, stream);
    }
  }
  if constexpr (kTeam != 32 || kVec != 4) {
    return LaunchTeams<kTeam>(NormKernel<kTeam, kVec, Out>, p, groups, stream);
  }
}

template <int kTeam, int kVec>
cudaError_t LaunchForward(const NormParams& p, int64_t groups, cudaStream_t stream) {
  switch (p.y_type) {
    case DType::kF32:
      return LaunchForwardTo<kTeam, kVec, float>(p, groups, stream);
    case DType::kBF16:
      return LaunchForwardTo<kTeam, kVec, __nv_bfloat16>(p, groups, stream);
    case DType::kF16:
      return LaunchForwardTo<kTeam, kVec, __half>(p, groups, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

template <int kTeam, int kVec>
void LaunchBackward(const NormBackwardParams& b, int64_t groups, cudaStream_t stream) {
  if constexpr (kTeam == 32) {
    NormBackwardKernel<32, kVec>
        <<<BlocksFor(groups, kWarpTeamBlock / 32), kWarpTeamBlock, 0, stream>>>(b);
  } else {
    NormBackwardKernel<kBlockTeam, kVec>
        <<<static_cast<unsigned>(groups), kBlockTeam, 0, stream>>>(b);
  }
}

}  // namespace

cudaError_t LaunchNorm(const NormParams& p, cudaStream_t stream) {
  const int64_t groups = p.rows * (p.cols / p.group);
  if (groups == 0) return cudaSuccess;
  const bool vec = Vectorizable(p);
  if (p.group <= kWarpGroupMax && groups >= kMinWarpTeamGroups) {
    return vec ? LaunchForward<32, 4>(p, groups, stream) : LaunchForward<32, 1>(p, groups, stream);
  }
  return vec ? LaunchForward<kBlockTeam, 4>(p, groups, stream)
             : LaunchForward<kBlockTeam, 1>(p, groups, stream);
}

cudaError_t LaunchNormBackward(const NormBackwardParams& b, cudaStream_t stream) {
  const NormParams& p = b.fwd;
  const int64_t groups = p.rows * (p.cols / p.group);
  if (groups == 0) return cudaSuccess;
  const bool vec = Vectorizable(p) && Aligned16(b.d_y) && Aligned16(b.dx) &&
                   (b.d_gate == nullptr || Aligned16(b.d_gate));
  if (p.group <= kWarpGroupMax) {
    vec ? LaunchBackward<32, 4>(b, groups, stream) : LaunchBackward<32, 1>(b, groups, stream);
  } else {
    vec ? LaunchBackward<kBlockTeam, 4>(b, groups, stream)
        : LaunchBackward<kBlockTeam, 1>(b, groups, stream);
  }
  if (b.d_weight == nullptr) return cudaGetLastError();
  const int64_t columns = WeightColumns(p);
  const dim3 grid(BlocksFor(columns, kColumnThreads), static_cast<unsigned>(b.splits));
  NormWeightGradKernel<<<grid, kColumnThreads, 0, stream>>>(b);
  if (b.splits == 1) return cudaGetLastError();
  return LaunchFinishColumnSums(b.partial, b.splits, columns, b.d_weight, columns, nullptr, true,
                                stream);
}

}  // namespace lair::kernels::cuda::dense
