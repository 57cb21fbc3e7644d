// Hopper's warpgroup tensor-core products (wgmma, sm_90a only: callers guard
// with __CUDA_ARCH_FEAT_SM90_ALL): one m64n64k16 bf16 product with fp32
// accumulators issued by the four warps of a warpgroup together, its
// operands read by the tensor cores from shared memory (or A from registers),
// asynchronously until a wait.
//
// Shared-memory operands here use the 128-byte swizzle: a tile is stored as
// blocks of 64 columns (16-bit elements), each block `rows` rows of 128 bytes
// in 1024-byte atoms of 8 rows, with the 16-byte chunk index of row r XORed
// by r % 8 (Swizzled). Every 16-byte column of 8 rows then lies in distinct
// banks, for the tensor cores and for row-wise copies alike. One tile serves
// as a K-major operand (rows M or N, columns K) and as an MN-major one (rows
// K, columns M or N); SwizzledKMajor and SwizzledMnMajor give the descriptors
// (PTX ISA, "Matrix Descriptor Format" and "Canonical Layouts"). Tiles start
// on 1024-byte boundaries.
#pragma once

#include <cstdint>

#include "kernels/cuda/async_copy.cuh"

namespace lair::kernels::cuda::wgmma {

constexpr int kAtomBytes = 1024;

// Byte offset of element (r, e) in a swizzled tile of `rows` rows.
__host__ __device__ constexpr int Swizzled(int rows, int r, int e) {
  return (e / 64) * rows * 128 + r * 128 + (((e % 64) / 8) ^ (r % 8)) * 16 + (e % 8) * 2;
}

// A 128-byte-swizzle matrix descriptor: start address, leading-dimension and
// stride-dimension byte offsets, each encoded as (x & 0x3FFFF) >> 4.
__device__ __forceinline__ uint64_t Descriptor(const void* start, uint32_t lbo, uint32_t sbo) {
  const auto enc = [](uint32_t x) { return static_cast<uint64_t>((x & 0x3FFFF) >> 4); };
  return enc(SmemAddr(start)) | enc(lbo) << 16 | enc(sbo) << 32 | uint64_t{1} << 62;
}
// K-major: K runs along a row (a k-step of 16 starts 32 bytes on within the
// atom); the next 8 rows of M or N are an atom on.
__device__ __forceinline__ uint64_t SwizzledKMajor(const void* start) {
  return Descriptor(start, 16, kAtomBytes);
}
// MN-major (rows are K): the next 8 rows of K are an atom on, the next 64
// columns of M or N a block (rows · 128 bytes) on.
__device__ __forceinline__ uint64_t SwizzledMnMajor(const void* start, int rows) {
  return Descriptor(start, static_cast<uint32_t>(rows) * 128, kAtomBytes);
}

// The descriptor of the same matrix `bytes` further on (the start address is
// its low field, in 16-byte units, and shared memory ends below 256 KB).
__host__ __device__ constexpr uint64_t Advance(uint64_t desc, int bytes) {
  return desc + static_cast<uint64_t>(bytes >> 4);
}
// A descriptor the compiler must form where it is (not hoisted out of a loop
// into registers held across it).
__device__ __forceinline__ uint64_t Here(uint64_t desc) {
  asm volatile("" : "+l"(desc));
  return desc;
}

// An int the compiler must take as unknown where it is: what is formed from
// it is formed there, not hoisted out of a loop into registers held across it.
__device__ __forceinline__ int Here(int x) {
  asm volatile("" : "+r"(x));
  return x;
}

// Orders this thread's generic-proxy shared-memory writes (stores, cp.async
// data it waited for) before later async-proxy reads (wgmma operands).
__device__ __forceinline__ void FenceSharedForAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Before the first wgmma of a batch whose accumulators or A registers other
// instructions wrote.
__device__ __forceinline__ void Fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void Commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Until at most kPending committed batches of this warpgroup are in flight.
template <int kPending>
__device__ __forceinline__ void Wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving accesses of d across a wgmma issue or wait.
template <int kN>
__device__ __forceinline__ void Pin(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The accumulator of m64n64: warp w of the group holds rows 16w + lane/4
// (+ 8 for entries 2-3 of each 4) and columns 8·(i/4) + 2·(lane%4) + i%2.
using Acc = float[32];

#define LAIR_WGMMA_D                                                                            \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define LAIR_WGMMA_D_OPERANDS(d)                                                                  \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

// d (+)= A·B, A [64 × 16] and B [16 × 64] from shared memory; kTransA/kTransB
// 1 where the operand is MN-major. accumulate false: d = A·B.
template <int kTransA, int kTransB>
__device__ __forceinline__ void MmaShared(Acc& d, uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " LAIR_WGMMA_D
      ", %32, %33, p, 1, 1, %35, %36;\n}\n"
      : LAIR_WGMMA_D_OPERANDS(d)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(kTransA), "n"(kTransB));
}
// d (+)= A·B with A [64 × 16] from registers (the m16n8k16 A fragment of the
// warp's 16 rows: {g: 2t}, {g+8: 2t}, {g: 2t+8}, {g+8: 2t+8} as bf16 pairs).
template <int kTransB>
__device__ __forceinline__ void MmaRegisterA(Acc& d, const uint32_t (&a)[4], uint64_t b,
                                             bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " LAIR_WGMMA_D
      ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
      : LAIR_WGMMA_D_OPERANDS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)),
        "n"(kTransB));
}

#undef LAIR_WGMMA_D
#undef LAIR_WGMMA_D_OPERANDS

}  // namespace lair::kernels::cuda::wgmma
