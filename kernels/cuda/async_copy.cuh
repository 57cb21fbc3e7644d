// cp.async: 16-byte copies from global to shared memory that bypass the
// registers (sm_80 and later), in commit groups a thread waits for. Shared
// by the tensor-core scans (mma_fragments.cuh), the decode step and the
// decode products' staging (dense_small_gemm_common.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace lair::kernels::cuda {

// The shared-memory address of generic pointer p (into shared memory).
__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global → shared without registers; zero-filled when !valid
// (src must still be a mapped address).
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
// 4 bytes global → shared (through L1), zero-filled when !valid.
__device__ __forceinline__ void CpAsync4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(SmemAddr(dst)), "l"(src),
               "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most kPending of this thread's committed groups are in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

}  // namespace lair::kernels::cuda
