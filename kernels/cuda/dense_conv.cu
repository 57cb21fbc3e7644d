// Causal depthwise conv1d over packed sequences with a per-slot window of the
// last W−1 inputs (kernels/dense.h Conv1dArgs), and its backward.
//   in(τ) = x[bos + τ, c] for τ ≥ 0, window[c, W−1+τ] for τ < 0 (0 when
//           zero_initial_state),
//   pre[t,c] = bias[c] + Σ_i w[c,i] · in(t − (W−1) + i),  y = silu(pre) or pre.
// One thread per (token, channel), coalesced over channels; the window update
// runs after the convolution (it overwrites what the first tokens read).
// Backward: d_pre = dy·silu'(pre) (or dy) into scratch, then
//   dx[t,c]  = Σ_i w[c,i] · d_pre[t + (W−1) − i, c]   (inside the sequence),
//   d_w[c,i] += Σ_t d_pre[t,c] · in(t − (W−1) + i),  d_b[c] += Σ_t d_pre[t,c],
// the sums one thread per (c, i) over chunks of tokens, in double.
#include "kernels/cuda/dense_common.cuh"
#include "kernels/cuda/dense_launch.h"

namespace lair::kernels::cuda::dense {
namespace {

constexpr int kThreads = 256;

// The window of (sequence s, channel c): W−1 floats, oldest first.
__device__ __forceinline__ float* Window(const ConvParams& p, int s, int64_t c) {
  return p.state + (p.slots[s] * p.channels + c) * (p.width - 1);
}

// in(τ) for a sequence starting at token bos.
__device__ __forceinline__ float ConvInput(const ConvParams& p, const float* window, int64_t bos,
                                           int64_t tau, int64_t c) {
  if (tau >= 0) return p.x[(bos + tau) * p.channels + c];
  return p.zero_initial_state ? 0.0f : window[p.width - 1 + tau];
}

// pre[t,c] of token t (local index `local` of sequence s).
__device__ __forceinline__ float PreActivation(const ConvParams& p, int s, int64_t bos,
                                               int64_t local, int64_t c) {
  const float* window = Window(p, s, c);
  const float* w = p.weight + c * p.width;
  float acc = p.bias ? p.bias[c] : 0.0f;
  for (int64_t i = 0; i < p.width; ++i) {
    acc = fmaf(w[i], ConvInput(p, window, bos, local - (p.width - 1) + i, c), acc);
  }
  return acc;
}

__global__ void __launch_bounds__(kThreads) ConvKernel(const ConvParams p) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x;
  if (i >= p.tokens * p.channels) return;
  const int64_t t = i / p.channels, c = i - t * p.channels;
  const int s = SequenceOf(p.cu_seqlens, p.num_seqs, t);
  const int64_t bos = p.cu_seqlens[s];
  const float pre = PreActivation(p, s, bos, t - bos, c);
  p.y[i] = p.silu ? Silu(pre) : pre;
}

// window[c, j] ← in(len − (W−1) + j), j ascending: in place, since the read
// index len + j (when τ < 0) never falls behind the written one.
__global__ void __launch_bounds__(kThreads) ConvWindowKernel(const ConvParams p) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x;
  if (i >= p.num_seqs * p.channels) return;
  const int s = static_cast<int>(i / p.channels);
  const int64_t c = i - s * p.channels;
  const int64_t bos = p.cu_seqlens[s], len = p.cu_seqlens[s + 1] - bos;
  float* window = Window(p, s, c);
  for (int64_t j = 0; j < p.width - 1; ++j) {
    window[j] = ConvInput(p, window, bos, len - (p.width - 1) + j, c);
  }
}

__global__ void __launch_bounds__(kThreads) ConvDPreKernel(const ConvBackwardParams b) {
  const ConvParams& p = b.fwd;
  const int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x;
  if (i >= p.tokens * p.channels) return;
  float d = b.d_y[i];
  if (p.silu) {
    const int64_t t = i / p.channels, c = i - t * p.channels;
    const int s = SequenceOf(p.cu_seqlens, p.num_seqs, t);
    const int64_t bos = p.cu_seqlens[s];
    d *= SiluGrad(PreActivation(p, s, bos, t - bos, c));
  }
  b.d_pre[i] = d;
}

__global__ void __launch_bounds__(kThreads) ConvDxKernel(const ConvBackwardParams b) {
  const ConvParams& p = b.fwd;
  const int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x;
  if (i >= p.tokens * p.channels) return;
  const int64_t t = i / p.channels, c = i - t * p.channels;
  const int64_t eos = p.cu_seqlens[SequenceOf(p.cu_seqlens, p.num_seqs, t) + 1];
  const float* w = p.weight + c * p.width;
  float acc = 0.0f;
  for (int64_t k = 0; k < p.width; ++k) {
    const int64_t out = t + (p.width - 1) - k;  // the token whose tap k read x[t]
    if (out < eos) acc = fmaf(w[k], b.d_pre[out * p.channels + c], acc);
  }
  b.dx[i] = acc;
}

// Output o < C·W is d_w[c = o / W, i = o % W]; o ≥ C·W is d_b[o − C·W].
// Sums over this split's tokens; the sequence index advances with t.
__global__ void __launch_bounds__(kThreads)
    ConvWeightGradKernel(const ConvBackwardParams b, int64_t outputs) {
  const ConvParams& p = b.fwd;
  const int64_t o = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x;
  if (o >= outputs) return;
  const int64_t taps = p.channels * p.width;
  const bool is_bias = o >= taps;
  const int64_t c = is_bias ? o - taps : o / p.width;
  const int64_t tap = is_bias ? 0 : o - c * p.width;
  const int64_t chunk = (p.tokens + b.splits - 1) / b.splits;
  const int64_t lo = blockIdx.y * chunk;
  const int64_t hi = lo + chunk < p.tokens ? lo + chunk : p.tokens;
  double sum = 0.0;
  if (lo < hi) {
    int s = SequenceOf(p.cu_seqlens, p.num_seqs, lo);
    for (int64_t t = lo; t < hi; ++t) {
      while (t >= p.cu_seqlens[s + 1]) ++s;
      const float d = b.d_pre[t * p.channels + c];
      if (is_bias) {
        sum += d;
      } else {
        const int64_t bos = p.cu_seqlens[s];
        const float in = ConvInput(p, Window(p, s, c), bos, t - bos - (p.width - 1) + tap, c);
        sum += static_cast<double>(d) * in;
      }
    }
  }
  if (b.splits == 1) {
    StoreColumnSum(sum, o, b.d_weight, taps, b.d_bias, true);
  } else {
    b.partial[blockIdx.y * outputs + o] = sum;
  }
}

}  // namespace

cudaError_t LaunchConv1d(const ConvParams& p, cudaStream_t stream) {
  if (p.tokens * p.channels > 0) {
    ConvKernel<<<BlocksFor(p.tokens * p.channels, kThreads), kThreads, 0, stream>>>(p);
  }
  if (p.width > 1 && p.num_seqs * p.channels > 0) {
    ConvWindowKernel<<<BlocksFor(p.num_seqs * p.channels, kThreads), kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

cudaError_t LaunchConv1dBackward(const ConvBackwardParams& b, cudaStream_t stream) {
  const ConvParams& p = b.fwd;
  const int64_t elements = p.tokens * p.channels;
  if (elements > 0) {
    ConvDPreKernel<<<BlocksFor(elements, kThreads), kThreads, 0, stream>>>(b);
    ConvDxKernel<<<BlocksFor(elements, kThreads), kThreads, 0, stream>>>(b);
  }
  const int64_t taps = p.channels * p.width;
  const int64_t outputs = taps + (b.d_bias ? p.channels : 0);
  if (outputs == 0) return cudaGetLastError();
  const dim3 grid(BlocksFor(outputs, kThreads), static_cast<unsigned>(b.splits));
  ConvWeightGradKernel<<<grid, kThreads, 0, stream>>>(b, outputs);
  if (b.splits == 1) return cudaGetLastError();
  return LaunchFinishColumnSums(b.partial, b.splits, outputs, b.d_weight, taps, b.d_bias, true,
                                stream);
}

}  // namespace lair::kernels::cuda::dense
