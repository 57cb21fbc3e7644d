// The tensor-core path of LaunchScan (scan.h) for bf16/f16 operands: chunks of
// 64 tokens, bf16 mma.sync with fp32 accumulation, fp32 state. LaunchScan
// dispatches here whenever ScanMmaSupports holds; the fp32 kernel of scan.cu
// serves everything else (f32 operands, right decays, odd dims).
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/cuda/scan.h"

namespace lair::kernels::cuda {

// q, k and v bf16 or f16 and 16-byte aligned, dk ≤ 256 and dv multiples of 16,
// no right decay, and the tile fits in shared memory. Any left decay (none,
// scalar, vector), reverse order, shifted gates and the mLSTM fields are served.
bool ScanMmaSupports(const ScanParams& p);

// Requires ScanMmaSupports(p) and p.num_seqs > 0.
cudaError_t LaunchScanMma(const ScanParams& p, cudaStream_t stream);

}  // namespace lair::kernels::cuda
