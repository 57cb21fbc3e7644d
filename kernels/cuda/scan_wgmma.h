// The scalar-decay forward scan on Hopper's warpgroup products (wgmma), for
// the shapes that dominate simple GLA and RetNet prefill: LaunchScanMma
// (scan_mma.h) sends a launch here when ScanWgmmaSupports holds and the
// device runs sm_90a code, and keeps its mma.sync kernel for the rest.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/cuda/scan.h"

namespace lair::kernels::cuda {

// A forward scan (not reversed) with a scalar or no left decay (unshifted),
// no right decay and none of the mLSTM or backward fields; bf16 q, k, v on
// 16-byte boundaries, dk = 128 and dv a multiple of 64.
bool ScanWgmmaSupports(const ScanParams& p);

// Whether the current device can run the kernel: compute capability 9.0 and
// an sm_90a image of it in this build.
bool WgmmaAvailable();

// Requires ScanWgmmaSupports(p), WgmmaAvailable() and p.num_seqs > 0.
cudaError_t LaunchScanWgmma(const ScanParams& p, cudaStream_t stream);

}  // namespace lair::kernels::cuda
