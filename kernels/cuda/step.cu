// One-token decode step (scan.h LaunchStep): memory-bound, so the kernel is a
// single pass over the state tile with 16-byte loads and stores.
//   s ← diag(e^{lk}) s diag(e^{lv}) · e^{m_prev − m} + e^{lw − m} k vᵀ,   o = sᵀ q'
// (m ≡ 0 without the stabilizer). One CTA per (sequence, head, 32 columns):
// 8 threads × float4 cover a 128-byte row segment, the CTA's row groups
// stride over dk (8 columns, 2 threads, in launches too small to fill the GPU).
// A thread's rows wait in its registers (launches of up to a wave) or in its
// own shared-memory slots, copied by cp.async and read back only by it, so
// the staging needs no barrier (larger launches).
//
// Launched as a programmatic dependent (dependent_launch.cuh): the state is
// most of the bytes and no kernel just before the step writes it, so each
// thread's first rows are in flight before the wait for the kernels that
// write q, k, v and the gates (LaunchStep states the condition).
//
// GLA's and RetNet's per-head output norm after the step keeps a launch of
// its own: forming it here (the head's last CTA after a fenced ticket, or the
// head's CTAs as a cluster) or finishing it in o_proj's GEMV or ring product
// from sums of squares the step wrote measured no faster (docs/benchmarks.md).
//
// A vector decay may come as a low-rank gate (ScanParams::left_low_rank,
// GLA's gk_proj.1): every CTA forms its head's gates from the token's rank-R
// input, its weight rows prefetched into L2 during the wait, which spares
// the decode step the launch of that small product between the projections
// and the step.
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/scan.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace lair::kernels::cuda {
namespace {

struct StepTraits {
  static constexpr int kVec = 4;  // floats per 16-byte access
  // Instances by the key width and the launch's size: kThreads threads of
  // kUnroll rows each (kRowGroups · kUnroll rows, the dk the instance covers
  // in one pass), q/k/decays for up to kMaxKeys keys, the CTAs per SM the
  // registers are budgeted for, and where the rows wait:
  // - Staged (kStaged): in the thread's own shared-memory slots by cp.async,
  //   so that more CTAs fit an SM and more bytes are in flight. On an H200 a
  //   bare in-place update of the pool in this pattern reaches 0.91 of the
  //   copy bandwidth at 4 rows per thread and 8 CTAs per SM (0.75 at 2
  //   rows). Keys up to 128 take 128 threads of 8 rows, 11 CTAs and 176 KB
  //   in flight per SM: the step at B = 256 (dk = dv = 128) went from 0.76
  //   of the copy bandwidth (256 threads of 4 rows, 6 CTAs) to 0.91–0.92.
  //   Keys up to 256 keep 256 threads of 8 rows (5 CTAs, 160 KB): 0.915 at
  //   dk = dv = 256, where 128 threads of 16 rows (6 CTAs) gave 0.79.
  // - Held in registers, for launches of at most a wave (kHeldMaxCtasPerSm
  //   per SM): bound by latency, they lose the staging's round trip (GLA
  //   1.3B decode at B = 1: 1.41 ms a step held, 1.49–1.51 staged). At 4
  //   rows, 48 registers and 5 CTAs per SM on sm_90; sm_80's code spills
  //   there and keeps 64.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  static constexpr int kNarrowHeldMinBlocks = 4;
#else
  static constexpr int kNarrowHeldMinBlocks = 5;
#endif
  // kColsN dv columns per CTA: 32 (8 threads of a row segment) but where
  // that leaves SMs idle (Few).
  template <int kThreadsN, int kUnrollN, int kMaxKeysN, int kMinBlocksN, bool kStagedN,
            int kColsN = 32>
  struct Shape {
    enum : int {
      kThreads = kThreadsN,
      kWarps = kThreadsN / 32,
      kCols = kColsN,
      kColThreads = kColsN / kVec,
      kRowGroups = kThreadsN / kColThreads,
      kUnroll = kUnrollN,
      kMaxKeys = kMaxKeysN,
      kMinBlocks = kMinBlocksN
    };
    enum : bool { kStaged = kStagedN };
  };
  using NarrowHeld = Shape<256, 4, 128, kNarrowHeldMinBlocks, false>;
  using NarrowStaged = Shape<128, 8, 128, 11, true>;  // 16 KB staged
  using WideHeld = Shape<256, 8, 256, 4, false>;
  using WideStaged = Shape<256, 8, 256, 5, true>;  // 32 KB staged
  // Wider keys (GSA's 512) are held at every size: their staged instance
  // (46 KB of shared memory, 3 CTAs per SM) has not been measured.
  using WidestHeld = Shape<256, 8, kMaxStepKeyDim, 4, false>;
  // Launches of up to this many CTAs (tiles) per SM hold their rows.
  static constexpr int kHeldMaxCtasPerSm = 4;
  // Launches whose 8-column CTAs fit a wave of kFewMaxCtasPerSm per SM
  // (their 71–96 registers allow 2–3) take 8 columns per CTA instead of 32:
  // four times the CTAs, each a quarter of the rows' work after the wait.
  // At B = 1 on an H200, GSA 1.3B's two steps (8 and 64 CTAs of 32
  // columns) gained 3% of the decode step, GLA 1.3B's (64) stayed within
  // noise; GLA at B = 2 (512 CTAs of 8, two waves) lost 2.6%.
  static constexpr int kFewCols = 8;
  static constexpr int kFewMaxCtasPerSm = 2;
  template <int kMaxKeysN>
  using Few = Shape<256, kMaxKeysN / 128, kMaxKeysN, 1, false, kFewCols>;
};

// The thread's state rows a0 + u·kRowGroups at `base` (zeros past dk or
// without an initial state), in registers or in its shared-memory slots
// `staged[u][threadIdx.x]` (as Shape says). Read once a step, so evicted
// from L2 first: staged rows are copied under `read_once`
// (EvictFirstPolicy), held rows loaded as streaming loads (__ldcs).
template <typename Shape>
struct StateRows {
  static constexpr int kUnroll = Shape::kUnroll;
  float4 held[Shape::kStaged ? 1 : kUnroll];
  float4 (*staged)[Shape::kThreads];

  __device__ __forceinline__ void Load(const float* base, int64_t dv, int a0, int dk,
                                       bool zero_init, uint64_t read_once) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int a = a0 + u * Shape::kRowGroups;
      const bool present = a < dk && !zero_init;
      if constexpr (Shape::kStaged) {
        if (present) CpAsync16(&staged[u][threadIdx.x], base + a * dv, true, read_once);
      } else {
        held[u] = present ? __ldcs(reinterpret_cast<const float4*>(base + a * dv))
                          : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
    if constexpr (Shape::kStaged) CpAsyncCommit();
  }
  __device__ __forceinline__ void Wait() const {
    if constexpr (Shape::kStaged) CpAsyncWait<0>();
  }
  __device__ __forceinline__ float4 Row(int u, bool zero_init) const {
    if constexpr (Shape::kStaged) {
      return zero_init ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : staged[u][threadIdx.x];
    } else {
      return held[u];
    }
  }
};

// L2 prefetches of head h's rows of the low-rank gate's weights (one block
// of dk · rank 16-bit values), by 128-byte lines: the weights come from
// before the step, so they load during the wait.
template <int kThreads>
__device__ __forceinline__ void PrefetchLowRankRows(const LowRankLeft& g, int h, int dk) {
  const int bytes = dk * g.rank * 2;
  const char* block = static_cast<const char*>(g.w) + static_cast<int64_t>(h) * bytes;
  for (int at = threadIdx.x * 128; at < bytes; at += kThreads * 128) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(block + at));
  }
}

// The low-rank gate's logit of weight row `row` at token `tok`: the sum
// over r in order, then the bias. Four weights at a time (eight spilled the
// register-budgeted instances).
__device__ __forceinline__ float LowRankLogit(const LowRankLeft& g, int64_t tok, int64_t row) {
  const float* z = g.z + tok * g.rank;
  const char* w = static_cast<const char*>(g.w) + row * g.rank * 2;
  float y = 0.0f;
#pragma unroll 1
  for (int r = 0; r < g.rank; r += 4) {
    const float4 wr = SixteenBitQuad(*reinterpret_cast<const uint2*>(w + r * 2), g.w_type);
    const float4 zr = *reinterpret_cast<const float4*>(z + r);
    y += zr.x * wr.x + zr.y * wr.y + zr.z * wr.z + zr.w * wr.w;
  }
  return g.bias ? y + g.bias[row] : y;
}

template <typename Shape>
__global__ void __launch_bounds__(Shape::kThreads, Shape::kMinBlocks)
    StepKernel(const ScanParams p) {
  AllowDependents();
  constexpr int kUnroll = Shape::kUnroll, kThreads = Shape::kThreads, kWarps = Shape::kWarps;
  constexpr int kRowGroups = Shape::kRowGroups, kCols = Shape::kCols;
  constexpr int kColThreads = Shape::kColThreads;
  static_assert(32 % kColThreads == 0, "a warp holds whole row groups (the column sums)");
  __shared__ float4 staged[Shape::kStaged ? kUnroll : 1][kThreads];
  __shared__ float q[Shape::kMaxKeys], k[Shape::kMaxKeys], dl[Shape::kMaxKeys];
  __shared__ alignas(16) float v[kCols], er[kCols];
  __shared__ alignas(16) float red[kWarps][kCols];
  __shared__ float scal[3];  // coefficient on s, weight on k vᵀ, q'ᵀn

  const int tid = threadIdx.x;
  const int h = blockIdx.y, seq = blockIdx.z;
  const int e0 = blockIdx.x * kCols;
  const int dk = p.dk;
  const int cv = tid % kColThreads, rg = tid / kColThreads;
  const int col = cv * StepTraits::kVec;
  // The slots and the state come from before the previous kernel.
  const int slot = p.s_final.slot ? p.s_final.slot[seq] : seq;
  float* base =
      p.s_final.ptr + slot * p.s_final.slot_stride + static_cast<int64_t>(h) * dk * p.dv + e0 + col;
  const bool zero_init = p.s_init.ptr == nullptr;
  StateRows<Shape> rows;
  rows.staged = staged;
  // The state is read and written once a step: loaded evict-first
  // (StateRows::Load), stored as streaming (evict-first) stores.
  const uint64_t read_once = EvictFirstPolicy();
  rows.Load(base, p.dv, rg, dk, zero_init, read_once);
  if (p.left_low_rank.z) PrefetchLowRankRows<kThreads>(p.left_low_rank, h, dk);
  WaitForPrerequisites();
  // One token per sequence (LaunchStep's contract), so sequence seq's token
  // is token seq: no load of cu_seqlens stands between the wait and the
  // operands' loads, and the state loads wait one latency less for them.
  // (Read from blockIdx here: with `seq`, the compiler formed the operands'
  // addresses before the wait and spilled them at 48 registers.)
  const int64_t tok = blockIdx.z;
  const int64_t row = tok * p.heads + h;

  // Token operands and gates into shared memory.
  float m_prev = 0.0f;
  if (p.stabilize && p.m_init) m_prev = p.m_init[static_cast<int64_t>(slot) * p.heads + h];
  const float lg_scalar = p.left_vector ? 0.0f : GateAt(p.left, tok, 1, 0, h, 0);
  const float lw = p.key_weight.ptr ? GateAt(p.key_weight, tok, 1, 0, h, 0) : 0.0f;
  const float m_new = p.stabilize ? fmaxf(lg_scalar + m_prev, lw) : 0.0f;
  const float coef = expf(lg_scalar + m_prev - m_new);
  const float wk = expf(lw - m_new);
  for (int a = tid; a < dk; a += kThreads) {
    q[a] = LoadElem(p.q.ptr, p.q.type, row * dk + a) * p.q_scale;
    k[a] = LoadElem(p.k.ptr, p.k.type, row * dk + a) * p.k_scale * wk;
    if (!p.left_low_rank.z) dl[a] = p.left_vector ? expf(GateAt(p.left, tok, 1, 0, h, a)) : coef;
  }
  if (p.left_low_rank.z) {
    // The logits first, then the decays: one pass with both spilled the
    // register-budgeted held instances.
    for (int a = tid; a < dk; a += kThreads)
      dl[a] = LowRankLogit(p.left_low_rank, tok, static_cast<int64_t>(h) * dk + a);
    for (int a = tid; a < dk; a += kThreads)
      dl[a] = expf(p.left_low_rank.scale * LogSigmoid(dl[a]));
  }
  if (tid < kCols) {
    const int64_t v_row = tok * (p.heads / p.v_head_share) + h / p.v_head_share;
    v[tid] = LoadElem(p.v.ptr, p.v.type, v_row * p.dv + e0 + tid);
    er[tid] = p.right.ptr ? expf(GateAt(p.right, tok, 1, 0, h / p.v_head_share, e0 + tid)) : 1.0f;
  }
  __syncthreads();

  // Normalizer: n ← coef·n + wk·k (tile 0 writes it), q'ᵀn for the output.
  if (p.n_final && tid < 32) {
    float part = 0.0f;
    for (int a = tid; a < dk; a += 32) {
      const int64_t off = (static_cast<int64_t>(slot) * p.heads + h) * dk + a;
      const float n = (p.n_init ? p.n_init[off] * coef : 0.0f) + k[a];
      if (blockIdx.x == 0) p.n_final[off] = n;
      part += q[a] * n;
    }
    part = WarpSum(part);
    if (tid == 0) scal[2] = part;
  }

  // The state pass: read, decay, add the outer product, accumulate sᵀq'.
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int a0 = rg; a0 < dk; a0 += kRowGroups * kUnroll) {
    if (a0 != rg) rows.Load(base, p.dv, a0, dk, zero_init, read_once);
    rows.Wait();
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int a = a0 + u * kRowGroups;
      if (a >= dk) continue;
      const float d = dl[a], ka = k[a], qa = q[a];
      float4 s = rows.Row(u, zero_init);
      // v and e^{lv} re-read from shared memory: 8 registers fewer.
      const float4 vv = *reinterpret_cast<const float4*>(&v[col]);
      const float4 ee = *reinterpret_cast<const float4*>(&er[col]);
      s.x = s.x * d * ee.x + ka * vv.x;
      s.y = s.y * d * ee.y + ka * vv.y;
      s.z = s.z * d * ee.z + ka * vv.z;
      s.w = s.w * d * ee.w + ka * vv.w;
      acc.x += qa * s.x;
      acc.y += qa * s.y;
      acc.z += qa * s.z;
      acc.w += qa * s.w;
      __stcs(reinterpret_cast<float4*>(base + a * p.dv), s);
    }
  }
  // The column sums: over a warp's row groups by shuffles, then over the
  // warps (a chain of 8 adds where one of 32 had been the CTA's tail).
  for (int lanes = kColThreads; lanes < 32; lanes <<= 1) {
    acc.x += __shfl_xor_sync(0xffffffffu, acc.x, lanes);
    acc.y += __shfl_xor_sync(0xffffffffu, acc.y, lanes);
    acc.z += __shfl_xor_sync(0xffffffffu, acc.z, lanes);
    acc.w += __shfl_xor_sync(0xffffffffu, acc.w, lanes);
  }
  if (tid % 32 < kColThreads) *reinterpret_cast<float4*>(&red[tid / 32][col]) = acc;
  __syncthreads();

  if (tid < kCols) {
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) o += red[w][tid];
    if (p.norm == NormKind::kMlstmExp) {
      o /= fmaxf(fabsf(scal[2]), expf(-m_new)) + p.eps;
    } else if (p.norm == NormKind::kSigNorm) {
      o /= fmaxf(fabsf(scal[2]), 1.0f) + p.eps;
    }
    StoreElem(p.o, p.o_type, row * p.dv + e0 + tid, o);
  }
  if (p.stabilize && p.m_final && blockIdx.x == 0 && tid == 0)
    p.m_final[static_cast<int64_t>(slot) * p.heads + h] = m_new;
}

// The staged instances ask for the largest shared-memory carveout (once):
// their rows take most of it.
template <typename Shape>
cudaError_t LaunchStepShape(const ScanParams& p, dim3 grid, cudaStream_t stream) {
  if constexpr (Shape::kStaged) {
    static const cudaError_t carveout =
        cudaFuncSetAttribute(StepKernel<Shape>, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared);
    if (carveout != cudaSuccess) return carveout;
  }
  return LaunchDependent(StepKernel<Shape>, grid, dim3(Shape::kThreads), stream, p);
}

// The held instance for a launch of at most kHeldMaxCtasPerSm CTAs per SM,
// else the staged one.
template <typename Held, typename Staged>
cudaError_t LaunchShape(const ScanParams& p, dim3 grid, int sms, cudaStream_t stream) {
  if (StepHoldsRows(p.dv, p.heads, p.num_seqs, sms)) return LaunchStepShape<Held>(p, grid, stream);
  return LaunchStepShape<Staged>(p, grid, stream);
}

}  // namespace

bool StepHoldsRows(int dv, int heads, int num_seqs, int sms) {
  const int64_t ctas = static_cast<int64_t>(dv / StepTraits::NarrowHeld::kCols) * heads * num_seqs;
  return ctas <= static_cast<int64_t>(sms) * StepTraits::kHeldMaxCtasPerSm;
}

cudaError_t LaunchStep(const ScanParams& p, cudaStream_t stream) {
  if (p.dk <= 0 || p.dk > kMaxStepKeyDim || p.dv % StepTraits::NarrowHeld::kCols != 0 ||
      p.reverse || p.left.shift || p.right.shift || p.s_final.ptr == nullptr ||
      (p.s_init.ptr != nullptr && p.s_init.ptr != p.s_final.ptr) || p.s_final.stride_b != 1 ||
      p.s_final.stride_a != p.dv || (p.left_vector && p.stabilize) || p.row_weight.ptr ||
      p.extra_key || p.norm_dot) {
    return cudaErrorInvalidValue;
  }
  const LowRankLeft& low_rank = p.left_low_rank;
  if (low_rank.z && (!p.left_vector || low_rank.rank <= 0 || low_rank.rank % 8 != 0 ||
                     low_rank.rank > kMaxLowRank || low_rank.w_type == ElemType::kF32 ||
                     reinterpret_cast<uintptr_t>(low_rank.w) % 16 != 0 ||
                     reinterpret_cast<uintptr_t>(low_rank.z) % 16 != 0)) {
    return cudaErrorInvalidValue;
  }
  if (p.num_seqs == 0) return cudaSuccess;
  using T = StepTraits;
  const int sms = CurrentDeviceSms();
  if (sms == 0) return cudaGetLastError();
  const dim3 grid(p.dv / T::NarrowHeld::kCols, p.heads, p.num_seqs);
  const dim3 few(p.dv / T::kFewCols, p.heads, p.num_seqs);
  if (static_cast<int64_t>(few.x) * few.y * few.z <= T::kFewMaxCtasPerSm * int64_t{sms}) {
    if (p.dk <= T::NarrowHeld::kMaxKeys)
      return LaunchStepShape<T::Few<T::NarrowHeld::kMaxKeys>>(p, few, stream);
    if (p.dk <= T::WideHeld::kMaxKeys)
      return LaunchStepShape<T::Few<T::WideHeld::kMaxKeys>>(p, few, stream);
    return LaunchStepShape<T::Few<kMaxStepKeyDim>>(p, few, stream);
  }
  if (p.dk <= T::NarrowHeld::kMaxKeys)
    return LaunchShape<T::NarrowHeld, T::NarrowStaged>(p, grid, sms, stream);
  if (p.dk <= T::WideHeld::kMaxKeys)
    return LaunchShape<T::WideHeld, T::WideStaged>(p, grid, sms, stream);
  return LaunchStepShape<T::WidestHeld>(p, grid, stream);
}

}  // namespace lair::kernels::cuda
