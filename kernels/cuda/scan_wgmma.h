// The scalar-decay scan on Hopper's warpgroup products (wgmma), for the
// shapes of simple GLA, RetNet and mLSTM at 128 keys, forward and backward: LaunchScanMma
// (scan_mma.h) sends a launch here when ScanWgmmaSupports holds and the
// device runs sm_90a code, and keeps its mma.sync kernel for the rest.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/cuda/scan.h"

namespace lair::kernels::cuda {

// A scan with a scalar or no left decay and no right decay, in either
// direction, with any of the mLSTM fields (key and row weights, stabilizer,
// normalizer) or the extra key feature with its row dots (not both); bf16 q,
// k, v (and dot_with) on 16-byte boundaries, dk = 128 and dv a multiple of 64.
bool ScanWgmmaSupports(const ScanParams& p);

// Whether the current device can run the kernel: compute capability 9.0 and
// an sm_90a image of it in this build.
bool WgmmaAvailable();

// Requires ScanWgmmaSupports(p), WgmmaAvailable() and p.num_seqs > 0.
cudaError_t LaunchScanWgmma(const ScanParams& p, cudaStream_t stream);

}  // namespace lair::kernels::cuda
