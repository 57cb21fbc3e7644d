// Products of few activation rows against 16-bit weights in the nn.Linear
// layout (dense_small_gemm.cu routes them to dense_small_gemm_gemv.cu,
// _narrow_k.cu or _ring.cu): a decode step's projections. Every kernel
// streams the weights once and takes a whole linear group (up to
// kSmallProductMembers products of the same activations) in one launch,
// applying each member's bias, activation and residual in their epilogue.
//   - kGemv: fp32 arithmetic, one warp per weight row. Exact, so both
//     precisions take it, up to 8 rows (1 on the fast path).
//   - kNarrowK: fp32 arithmetic, one thread per output, for k ≤ 64 (a
//     low-rank gate's up-projection) and more rows than the GEMV takes, up
//     to 1024. Exact.
//   - kTensorCore (fast path, sm_90): bf16/f16 mma.sync on the activations
//     rounded to the weights' type, 2 to 32 rows (cuBLASLt above), weights
//     and activations streamed through a shared-memory ring; the k range is
//     split across the CTAs of a thread-block cluster, which sum their
//     partials through distributed shared memory in a fixed order
//     (deterministic).
#pragma once

#include <cuda_runtime.h>

#include <span>

#include "kernels/cuda/dense_launch.h"
#include "kernels/cuda/dense_ops.h"

namespace lair::kernels::cuda::dense {

constexpr int kSmallProductMembers = 8;
// No kernel here takes more activation rows, but for k ≤ 64 (kNarrowK).
constexpr int64_t kSmallProductMaxRows = 32;
// The GEMV forms a weightless RMS norm of its input (GemmCall::a_rms) up to
// this many rows. On an H100 it took GLA 1.3B's decode step at batch 1 from
// 1.47 to 1.36–1.38 ms and GSA 1.3B's from 1.67–1.69 to 1.56–1.57, but at
// batch 2 it lost to the norm pass: 1.71 → 1.76 ms and 1.87–1.91 → 1.99.
constexpr int64_t kGemvNormMaxRows = 1;

enum class SmallProduct { kNone, kGemv, kNarrowK, kTensorCore };

// Which kernel, if either, takes all of `calls` in one launch: each is not
// empty, has 16-bit weights in the nn.Linear layout with 16-byte aligned rows
// and shares the activations (and their gate), m, k, the weight type, alpha
// and beta. The kernels read the activations as given: RunGroup forms gated
// ones first.
SmallProduct SmallProductFor(std::span<const GemmCall> calls, GemmPrecision precision);

// Whether the kernel SmallProductFor picks for `calls` can read their
// activations already rounded to the weights' type (GemmCall::a_rounded):
// the tensor-core ring, which then copies them into its stages as they are,
// where it would copy fp32 and round them itself.
bool ReadsRoundedActivations(std::span<const GemmCall> calls, GemmPrecision precision);

// `calls` through `kind` (not kNone), which SmallProductFor chose for them.
cudaError_t LaunchSmallProduct(SmallProduct kind, std::span<const GemmCall> calls,
                               cudaStream_t stream);

// Whether LaunchSiluPair takes SwiGLU's gate and up products: the GEMV or
// the ring kernel takes them (SmallProductFor, ReadsRoundedActivations), of
// equal n, without bias, activation, residual or 16-bit output, alpha 1 and
// beta 0.
bool TakesSiluPair(std::span<const GemmCall, 2> gate_up, GemmPrecision precision);
// out [m, n] ← silu(gate) ∘ up in one launch through `kind` (kGemv or
// kTensorCore, which SmallProductFor chose for them; the calls' own c
// unused): fp32 from the GEMV, rounded to the weights' type from the ring
// kernel, ready for a down product that reads it so.
cudaError_t LaunchSiluPair(SmallProduct kind, std::span<const GemmCall, 2> gate_up, void* out,
                           cudaStream_t stream);

}  // namespace lair::kernels::cuda::dense
