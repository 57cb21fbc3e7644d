// The CUDA implementation of kernels::Backend.
//
// Device memory comes from cudaMallocAsync on the backend's one stream (the
// tensors' deleters free it on that stream); every operation is issued on the
// stream and returns once queued, so errors of a launch show up at the latest
// in the next Synchronize. Inside a step (Backend::BeginStep) temporaries
// come from a bump arena (grown, at the next BeginStep, to the largest step
// seen, at most 1 GiB; the rest overflows to the allocator); StageInts packs
// a step's int metadata into pinned memory and makes one copy into a
// persistent device block; CaptureStep records CUDA graphs (thread-local
// capture mode), and memory_epoch moves when the arena, the staging block or
// any dense-op scratch is reallocated. BackendOptions::gemm picks the dense
// ops' GemmPrecision. Inputs may be F32, BF16 or F16; states and gates
// are F32; arithmetic is fp32 (no TF32), so an F32 run matches the CPU
// reference to rounding.
//
// Mixers run as the chunked scans of kernels/cuda/scan.h; a batch of
// one-token sequences (N == num_seqs) runs the bandwidth-bound step kernel.
// Decay backward runs the scans' argument permutations; GSA backward composes
// two decay backwards with the softmax Jacobian; mLSTM backward is the exact
// reverse-mode kernel of kernels/cuda/mixer_backward.h (key_dim, value_dim
// ≤ 128). The dense operations are kernels/cuda/dense_ops.h on the same
// stream (cuBLASLt SGEMM, no TF32).
#pragma once

#include <memory>

#include "core/status.h"
#include "kernels/backend.h"

namespace lair::kernels {

// Unavailable when no CUDA device with that index is present.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device_index,
                                                         const BackendOptions& options = {});

}  // namespace lair::kernels
