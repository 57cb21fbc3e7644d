// Small kernels around the scans (scan.h): dtype conversion, the GSA softmax,
// the reverse-cumsum decay gradients and dh0 = diag(λ_1) G_1 diag(γ_1).
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/scan.h"

namespace lair::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void ConvertKernel(const void* src, ElemType st, void* dst, ElemType dt, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    StoreElem(dst, dt, i, LoadElem(src, st, i));
  }
}

// One warp per row: p = exp(x − max) / Σ.
__global__ void SoftmaxKernel(float* x, int64_t rows, int width) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  float* row = x + r * width;
  float mx = -INFINITY;
  for (int i = lane; i < width; i += 32) mx = fmaxf(mx, row[i]);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0.0f;
  for (int i = lane; i < width; i += 32) sum += expf(row[i] - mx);
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float inv = 1.0f / sum;
  for (int i = lane; i < width; i += 32) row[i] = expf(row[i] - mx) * inv;
}

// term[t,h,a] = x·dx − y·dy, or Σ_a of it (one warp per token-head) when reducing.
__global__ void DecayTermKernel(const DecayGradParams p, int64_t tokens) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= tokens * p.heads) return;
  float part = 0.0f;
  for (int a = lane; a < p.dim; a += 32) {
    const int64_t i = r * p.dim + a;
    const float t = LoadElem(p.x.ptr, p.x.type, i) * LoadElem(p.dx.ptr, p.dx.type, i) -
                    LoadElem(p.y.ptr, p.y.type, i) * LoadElem(p.dy.ptr, p.dy.type, i);
    if (p.reduce_features) {
      part += t;
    } else {
      p.out[i] = t;
    }
  }
  if (p.reduce_features) {
    for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
    if (lane == 0) p.out[r] = part;
  }
}

// Reverse cumsum along each sequence, seeded with the final-state term
// rowsum(dS ⊙ S) (colsum when transposed; the full sum when reducing).
// One thread per (sequence, head, feature column); loads run kAhead deep.
__global__ void ReverseCumsumKernel(const DecayGradParams p) {
  constexpr int kAhead = 8;
  const int cols = p.reduce_features ? 1 : p.dim;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int h = blockIdx.y, seq = blockIdx.z;
  if (c >= cols) return;
  float run = 0.0f;
  if (p.d_state) {
    const int64_t base = (static_cast<int64_t>(seq) * p.heads + h) * p.dim * p.other;
    const int a_begin = p.reduce_features ? 0 : c, a_end = p.reduce_features ? p.dim : c + 1;
    for (int a = a_begin; a < a_end; ++a)
      for (int b = 0; b < p.other; ++b) {
        const int64_t i = base + (p.transposed ? static_cast<int64_t>(b) * p.dim + a
                                               : static_cast<int64_t>(a) * p.other + b);
        run += p.d_state[i] * p.state[i];
      }
  }
  const int64_t bos = p.cu_seqlens[seq], eos = p.cu_seqlens[seq + 1];
  for (int64_t t = eos - 1; t >= bos; t -= kAhead) {
    float vals[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u)
      vals[u] = t - u >= bos ? p.out[((t - u) * p.heads + h) * cols + c] : 0.0f;
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      if (t - u < bos) break;
      run += vals[u];
      p.out[((t - u) * p.heads + h) * cols + c] = run;
    }
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

int Blocks(int64_t n, int per_block) {
  const int64_t b = (n + per_block - 1) / per_block;
  return static_cast<int>(b < 65535 * 16 ? (b > 0 ? b : 1) : 65535 * 16);
}

}  // namespace

cudaError_t LaunchConvert(const void* src, ElemType src_type, void* dst, ElemType dst_type,
                          int64_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  ConvertKernel<<<Blocks(count, kThreads), kThreads, 0, stream>>>(src, src_type, dst, dst_type,
                                                                 count);
  return cudaGetLastError();
}

cudaError_t LaunchSoftmaxRows(float* x, int64_t rows, int width, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  SoftmaxKernel<<<Blocks(rows, kThreads / 32), kThreads, 0, stream>>>(x, rows, width);
  return cudaGetLastError();
}

cudaError_t LaunchDecayGrad(const DecayGradParams& p, cudaStream_t stream) {
  if (p.num_seqs == 0) return cudaSuccess;
  cudaError_t err = cudaSuccess;
  const int64_t tokens = p.tokens;
  if (tokens > 0) {
    DecayTermKernel<<<Blocks(tokens * p.heads, kThreads / 32), kThreads, 0, stream>>>(p, tokens);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  const int cols = p.reduce_features ? 1 : p.dim;
  const int threads = cols >= 128 ? 128 : 32 * ((cols + 31) / 32);
  ReverseCumsumKernel<<<dim3((cols + threads - 1) / threads, p.heads, p.num_seqs), threads, 0,
                        stream>>>(p);
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
