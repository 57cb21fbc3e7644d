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
// An L2 policy that evicts the lines it covers first: for data a decode step
// reads once (the ring's and the GEMV's weights, the state step's states), so
// that they do not push out of L2 the activations and residuals that the next
// kernels read. On an H200 the ring's weights and the states together ran GLA
// 1.3B's decode step 3.5% faster at batch 32, 4% at 16 and 2–3% at 2 and 4;
// the persistent batch-1 kernel's weight stream so was 1.3% slower
// (docs/benchmarks.md).
__device__ __forceinline__ uint64_t EvictFirstPolicy() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
// CpAsync16 under an L2 policy (EvictFirstPolicy).
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid, uint64_t policy) {
  asm volatile(
      "cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(SmemAddr(dst)),
      "l"(src), "r"(valid ? 16 : 0), "l"(policy));
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
