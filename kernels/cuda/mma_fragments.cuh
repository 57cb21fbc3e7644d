// The warp-level tensor-core pieces the mma kernels share (scan_mma.cu,
// scan_segments.cu): ldmatrix fragment loads, the bf16 m16n8k16 mma with fp32
// accumulators, and the 16-bit operand and output accesses around them
// (with the cp.async copies of async_copy.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/scan.h"

namespace lair::kernels::cuda {

// ldmatrix: four 8×8 matrices of 16-bit elements; lane l supplies the row
// address of matrix l / 8.
__device__ __forceinline__ void Ldsm4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}
__device__ __forceinline__ void Ldsm4T(uint32_t (&r)[4], const __nv_bfloat16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}
__device__ __forceinline__ void Ldsm2(uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(SmemAddr(p)));
}

// d += a·b for one m16n8k16 tile (a: 16×16 row-major fragment, b: 16×8 col-major).
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// (lo, hi) rounded to bf16 as one 32-bit fragment register.
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t r;
  memcpy(&r, &v, 4);
  return r;
}

// A pair of bf16 values (one 32-bit fragment register) times (f0, f1),
// rounded to bf16.
__device__ __forceinline__ uint32_t Scale2(uint32_t x, float f0, float f1) {
  __nv_bfloat162 v;
  memcpy(&v, &x, 4);
  const float2 f = __bfloat1622float2(v);
  return PackBf16(f.x * f0, f.y * f1);
}

// o[off], o[off + 1] (off even, so the pair is aligned).
__device__ __forceinline__ void StorePair(void* o, ElemType t, int64_t off, float x, float y) {
  switch (t) {
    case ElemType::kBF16:
      *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(o) + off) =
          __floats2bfloat162_rn(x, y);
      break;
    case ElemType::kF16:
      *reinterpret_cast<__half2*>(static_cast<__half*>(o) + off) = __floats2half2_rn(x, y);
      break;
    default:
      *reinterpret_cast<float2*>(static_cast<float*>(o) + off) = make_float2(x, y);
  }
}

// Eight consecutive elements of a bf16/f16 operand as bf16.
__device__ __forceinline__ uint4 Load8(const Operand& op, int64_t off) {
  if (op.type == ElemType::kBF16)
    return *reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(op.ptr) + off);
  const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const __half*>(op.ptr) + off);
  __half2 h[4];
  memcpy(h, &raw, 16);
  __nv_bfloat162 o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) o[i] = __float22bfloat162_rn(__half22float2(h[i]));
  uint4 out;
  memcpy(&out, o, 16);
  return out;
}

}  // namespace lair::kernels::cuda
