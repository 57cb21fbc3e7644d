// The CUDA backend's kernels::PersistentDecode: lays a model's weights out
// once as the persistent decode kernel's per-CTA streams
// (kernels/cuda/persistent_decode.h) and launches the kernel per step.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/persistent_decode.h"

namespace lair::kernels::cuda {

// `backend` (the CUDA backend issuing on `stream`) allocates and copies and
// must outlive the result. Unimplemented where the model's shapes or dtypes
// (bf16 matrices) do not fit the kernel or the device is not sm_90.
absl::StatusOr<std::unique_ptr<PersistentDecode>> MakeCudaPersistentDecode(
    Backend* backend, cudaStream_t stream, const PersistentDecodeModel& model);

}  // namespace lair::kernels::cuda
