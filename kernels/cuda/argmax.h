// Row argmax on the device: greedy sampling without downloading the logits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lair::kernels::cuda {

// ids[r] = the smallest j with logits[r·vocab + j] maximal, for r < rows
// (NaN never wins). One block per row.
cudaError_t LaunchArgmaxRows(const float* logits, int64_t rows, int64_t vocab, int32_t* ids,
                             cudaStream_t stream);

}  // namespace lair::kernels::cuda
