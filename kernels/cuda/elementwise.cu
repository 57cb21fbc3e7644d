// Small kernels around the scans (scan.h): dtype conversion, row repeats and
// group sums (key blocks as heads), the GSA softmax, per-head token sums and
// dh0 = diag(λ_1) G_1 diag(γ_1). The decay gradient
// lives in decay_grad.cu.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/scan.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace lair::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void ConvertKernel(const void* src, ElemType st, void* dst, ElemType dt, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    StoreElem(dst, dt, i, LoadElem(src, st, i));
  }
}

// ConvertKernel from fp32 four elements at a time: rounding a scan's q, k, v
// one element per thread ran at about 60% of the copy bandwidth.
__global__ void ConvertF32QuadsKernel(const float4* src, void* dst, ElemType dt, int64_t quads) {
  for (int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; q < quads;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    StoreElem4(dst, dt, q, src[q]);
  }
}

// One warp per row: p = exp(x − max) / Σ.
__global__ void SoftmaxKernel(const float* x, int64_t rows, int width, void* out,
                              ElemType out_type) {
  const int lane = threadIdx.x % 32;
  for (int64_t r = WarpRow(); r < rows; r += WarpRowStride()) {
    const float* row = x + r * width;
    float mx = -INFINITY;
    for (int i = lane; i < width; i += 32) mx = fmaxf(mx, row[i]);
    mx = WarpMax(mx);
    float sum = 0.0f;
    for (int i = lane; i < width; i += 32) sum += expf(row[i] - mx);
    sum = WarpSum(sum);
    const float inv = 1.0f / sum;
    for (int i = lane; i < width; i += 32)
      StoreElem(out, out_type, r * width + i, expf(row[i] - mx) * inv);
  }
}

__global__ void SumTokensKernel(const float* x, int64_t tokens, int heads, float* out) {
  __shared__ float part[kThreads];
  const int h = blockIdx.x;
  float s = 0.0f;
  for (int64_t t = threadIdx.x; t < tokens; t += blockDim.x) s += x[t * heads + h];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[h] = part[0];
}

__global__ void ScaleFirstKernel(const float* g, int num_seqs, int heads, int dk, int dv,
                                 const int32_t* cu_seqlens, LogGate left, bool left_vector,
                                 LogGate right, float* out) {
  const int64_t n = static_cast<int64_t>(num_seqs) * heads * dk * dv;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int b = i % dv, a = (i / dv) % dk, h = (i / (static_cast<int64_t>(dv) * dk)) % heads;
    const int s = i / (static_cast<int64_t>(dv) * dk * heads);
    const int64_t bos = cu_seqlens[s];
    const int len = cu_seqlens[s + 1] - static_cast<int>(bos);
    float lg = 0.0f;
    if (len > 0) {
      lg = GateAt(left, bos, len, 0, h, left_vector ? a : 0) + GateAt(right, bos, len, 0, h, b);
    }
    out[i] = expf(lg) * g[i];
  }
}

__global__ void RepeatRowsKernel(const void* src, ElemType type, int64_t rows, int width,
                                 int copies, void* dst) {
  const int64_t n = rows * copies * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = i % width, r = i / (static_cast<int64_t>(width) * copies);
    StoreElem(dst, type, i, LoadElem(src, type, r * width + e));
  }
}

__global__ void SumRowGroupsKernel(const float* parts, int64_t rows, int width, int copies,
                                   void* out, ElemType out_type) {
  const int64_t n = rows * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = i % width, r = i / width;
    const float* at = parts + r * copies * width + e;
    float sum = 0.0f;
    for (int c = 0; c < copies; ++c) sum += at[static_cast<int64_t>(c) * width];
    StoreElem(out, out_type, i, sum);
  }
}

// SumRowGroupsKernel four columns at a time (width a multiple of 4, aligned
// parts and out), summing the copies in the same order.
__global__ void SumRowGroupsQuadsKernel(const float4* parts, int64_t rows, int width4, int copies,
                                        void* out, ElemType out_type) {
  const int64_t n = rows * width4;
  for (int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; q < n;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = q / width4;
    const float4* at = parts + r * copies * width4 + (q - r * width4);
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int c = 0; c < copies; ++c) {
      const float4 v = at[static_cast<int64_t>(c) * width4];
      sum.x += v.x;
      sum.y += v.y;
      sum.z += v.z;
      sum.w += v.w;
    }
    StoreElem4(out, out_type, q, sum);
  }
}

}  // namespace

cudaError_t LaunchConvert(const void* src, ElemType src_type, void* dst, ElemType dst_type,
                          int64_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (src_type == ElemType::kF32 && count % 4 == 0 && Elem4Aligned(src, ElemType::kF32) &&
      Elem4Aligned(dst, dst_type)) {
    ConvertF32QuadsKernel<<<Blocks(count / 4, kThreads), kThreads, 0, stream>>>(
        static_cast<const float4*>(src), dst, dst_type, count / 4);
    return cudaGetLastError();
  }
  ConvertKernel<<<Blocks(count, kThreads), kThreads, 0, stream>>>(src, src_type, dst, dst_type,
                                                                  count);
  return cudaGetLastError();
}

cudaError_t LaunchRepeatRows(const void* src, ElemType type, int64_t rows, int width, int copies,
                             void* dst, cudaStream_t stream) {
  const int64_t n = rows * copies * width;
  if (n == 0) return cudaSuccess;
  RepeatRowsKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(src, type, rows, width, copies,
                                                                 dst);
  return cudaGetLastError();
}

cudaError_t LaunchSumRowGroups(const float* parts, int64_t rows, int width, int copies, void* out,
                               ElemType out_type, cudaStream_t stream) {
  const int64_t n = rows * width;
  if (n == 0) return cudaSuccess;
  if (width % 4 == 0 && Elem4Aligned(parts, ElemType::kF32) && Elem4Aligned(out, out_type)) {
    SumRowGroupsQuadsKernel<<<Blocks(n / 4, kThreads), kThreads, 0, stream>>>(
        reinterpret_cast<const float4*>(parts), rows, width / 4, copies, out, out_type);
    return cudaGetLastError();
  }
  SumRowGroupsKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(parts, rows, width, copies, out,
                                                                   out_type);
  return cudaGetLastError();
}

cudaError_t LaunchSoftmaxRows(const float* x, int64_t rows, int width, void* out, ElemType out_type,
                              cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  SoftmaxKernel<<<Blocks(rows, kThreads / 32), kThreads, 0, stream>>>(x, rows, width, out,
                                                                      out_type);
  return cudaGetLastError();
}

cudaError_t LaunchSumTokens(const float* x, int64_t tokens, int heads, float* out,
                            cudaStream_t stream) {
  SumTokensKernel<<<heads, kThreads, 0, stream>>>(x, tokens, heads, out);
  return cudaGetLastError();
}

cudaError_t LaunchScaleByFirstDecay(const float* g, int num_seqs, int heads, int dk, int dv,
                                    const int32_t* cu_seqlens, const LogGate& left,
                                    bool left_vector, const LogGate& right, float* out,
                                    cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(num_seqs) * heads * dk * dv;
  if (n == 0) return cudaSuccess;
  ScaleFirstKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(
      g, num_seqs, heads, dk, dv, cu_seqlens, left, left_vector, right, out);
  return cudaGetLastError();
}

}  // namespace lair::kernels::cuda
