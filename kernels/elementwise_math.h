// The functions of kernels/dense.h's UnaryOp (and their derivatives) and
// BinaryOp, written once for the CPU reference (kernels/cpu/dense.cc) and the
// CUDA kernels (kernels/cuda/dense_common.cuh), so that both evaluate the
// same float expressions:
//   σ(x) = 1 / (1 + e^−x),  silu(x) = x·σ(x),  silu'(x) = σ(x)·(1 + x·(1 − σ(x))),
//   log σ(x) = min(x, 0) − log(1 + e^−|x|)  (stable on both sides),
//   softplus(x) = x above 20 (PyTorch's threshold), else log(1 + eˣ).
#pragma once

#include <cmath>

#include "kernels/dense.h"

#if defined(__CUDACC__)
#define LAIR_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define LAIR_HOST_DEVICE inline
#endif

namespace lair::kernels {

LAIR_HOST_DEVICE float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
LAIR_HOST_DEVICE float Silu(float x) { return x * Sigmoid(x); }
LAIR_HOST_DEVICE float SiluGrad(float x) {
  const float s = Sigmoid(x);
  return s * (1.0f + x * (1.0f - s));
}

// f(x) of `op`.
LAIR_HOST_DEVICE float ApplyUnary(UnaryOp op, float x) {
  switch (op) {
    case UnaryOp::kAffine:
      return x;
    case UnaryOp::kSilu:
      return Silu(x);
    case UnaryOp::kSigmoid:
      return Sigmoid(x);
    case UnaryOp::kLogSigmoid:
      return fminf(x, 0.0f) - log1pf(expf(-fabsf(x)));
    case UnaryOp::kSoftplus:
      return x > 20.0f ? x : log1pf(expf(x));
    case UnaryOp::kExp:
      return expf(x);
    case UnaryOp::kLog:
      return logf(x);
    case UnaryOp::kTanh:
      return tanhf(x);
    case UnaryOp::kRelu:
      return x > 0.0f ? x : 0.0f;
    case UnaryOp::kEluPlusOne:
      return x > 0.0f ? x + 1.0f : expf(x);
  }
  return x;
}

// f'(x) of `op`.
LAIR_HOST_DEVICE float UnaryDerivative(UnaryOp op, float x) {
  switch (op) {
    case UnaryOp::kAffine:
      return 1.0f;
    case UnaryOp::kSilu:
      return SiluGrad(x);
    case UnaryOp::kSigmoid: {
      const float s = Sigmoid(x);
      return s * (1.0f - s);
    }
    case UnaryOp::kLogSigmoid:
      return Sigmoid(-x);
    case UnaryOp::kSoftplus:
      return x > 20.0f ? 1.0f : Sigmoid(x);
    case UnaryOp::kExp:
      return expf(x);
    case UnaryOp::kLog:
      return 1.0f / x;
    case UnaryOp::kTanh: {
      const float t = tanhf(x);
      return 1.0f - t * t;
    }
    case UnaryOp::kRelu:
      return x > 0.0f ? 1.0f : 0.0f;
    case UnaryOp::kEluPlusOne:
      return x > 0.0f ? 1.0f : expf(x);
  }
  return 1.0f;
}

// u ∘ v of `op`.
LAIR_HOST_DEVICE float ApplyBinary(BinaryOp op, float u, float v) {
  switch (op) {
    case BinaryOp::kAdd:
      return u + v;
    case BinaryOp::kSub:
      return u - v;
    case BinaryOp::kMul:
      return u * v;
    case BinaryOp::kDiv:
      return u / v;
    case BinaryOp::kSiluMul:
      return Silu(u) * v;
  }
  return u;
}

}  // namespace lair::kernels

#undef LAIR_HOST_DEVICE
