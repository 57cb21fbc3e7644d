// Row sampling on the device (kernels/sampling.h's rules): a step's tokens
// without downloading its logits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/sampling.h"

namespace lair::kernels::cuda {

// ids[r] = SampleRow(logits row r, params[r]) for r < rows, up to rounding
// (sums in double, in another order); for the rows whose rule asks
// (params[r].logprobs >= 0), the draw's logprobs into logprobs [rows, 1 +
// kMaxRowLogprobs] and top_ids [rows, kMaxRowLogprobs] as Backend::
// SampleRows lays them out (null when no rule asks). All device memory.
// One block per row.
cudaError_t LaunchSampleRows(const float* logits, int64_t rows, int64_t vocab,
                             const RowSampling* params, int32_t* ids, float* logprobs,
                             int32_t* top_ids, cudaStream_t stream);

}  // namespace lair::kernels::cuda
