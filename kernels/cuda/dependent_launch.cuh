// Programmatic dependent launch (sm_90 and later).
//
// A kernel launched with the programmatic-serialization attribute may start
// while the kernel before it in the stream still runs, so it can issue work
// that depends on nothing earlier (a decode GEMV streaming its weights)
// under the previous kernel's tail. It must call WaitForPrerequisites before
// it reads or writes memory that earlier kernels touch: the wait returns once
// they have completed and their writes are visible (at once when the kernel
// was launched normally). AllowDependents, early in a kernel, lets the next
// such kernel be scheduled before this one finishes; without it the next one
// starts as this one's blocks exit. Both are no-ops before sm_90.
//
// LaunchDependent launches a kernel that way (normally before sm_90). The
// decode products (dense_small_gemm.cu), the decode step (step.cu), the
// forward norms (dense_norm.cu) and the unary and binary elementwise
// kernels (dense_elementwise.cu) use it, and each of them calls
// AllowDependents first, so a step's kernels chain without a launch gap: on
// an H100 (GLA 1.3B, batch 1) the GEMVs gained about 2%, on an H200 the
// step's state loads before the wait 1–1.6%, and the norms and elementwise
// kernels as dependents 4–5% at batches 1 to 32 (GLA 1.3B; launched
// plainly, each waited for its predecessor to finish and be flushed before
// it started; docs/benchmarks.md).
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace lair::kernels::cuda {

// Whether the current device is sm_90 or later: it takes programmatic
// dependent launches and thread-block clusters (read once per process).
inline bool HopperOrLater() {
  static const bool supported = [] {
    int device = 0, major = 0;
    return cudaGetDevice(&device) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) ==
               cudaSuccess &&
           major >= 9;
  }();
  return supported;
}

// The current device's multiprocessors, which decode launches are sized by;
// asked per call, as a process may drive GPUs of different kinds. 0 on an
// error, which stays pending for the caller (cudaGetLastError).
inline int CurrentDeviceSms() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return 0;
  }
  return sms;
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...) in clusters of
// `cluster` CTAs (sm_90; dim3(1, 1, 1) launches without clusters) and as a
// programmatic dependent of the previous kernel in `stream`: the kernel must
// call WaitForPrerequisites before it touches memory.
template <typename... Params, typename... Args>
cudaError_t LaunchDependentInClusters(void (*kernel)(Params...), dim3 grid, dim3 block,
                                      dim3 cluster, size_t shared_bytes, cudaStream_t stream,
                                      Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attributes[2] = {};
  unsigned count = 0;
  if (HopperOrLater()) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  if (cluster.x * cluster.y * cluster.z > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = cluster.x;
    attributes[count].val.clusterDim.y = cluster.y;
    attributes[count].val.clusterDim.z = cluster.z;
    ++count;
  }
  config.attrs = attributes;
  config.numAttrs = count;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

template <typename... Params, typename... Args>
cudaError_t LaunchDependent(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
                            Args&&... args) {
  return LaunchDependentInClusters(kernel, grid, block, dim3(1, 1, 1), 0, stream,
                                   std::forward<Args>(args)...);
}

__device__ __forceinline__ void WaitForPrerequisites() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void AllowDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace lair::kernels::cuda
