#include "kernels/cpu/dense.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/dense_checks.h"
#include "kernels/elementwise_math.h"

namespace lair::kernels::cpu {
namespace {

// Every values[i] in [0, limit): the range check that the CUDA backend makes
// on the device (kernels/cuda/dense_ops.h), made here before anything is written.
absl::Status CheckIndices(std::string_view op, std::string_view field, std::string_view what,
                          const int32_t* values, int64_t n, int64_t limit) {
  for (int64_t i = 0; i < n; ++i) {
    if (values[i] < 0 || values[i] >= limit) {
      return InvalidDenseArg(
          op, field,
          absl::StrCat(std::string(what), " ", values[i], " at ", i, " outside [0, ", limit, ")"));
    }
  }
  return absl::OkStatus();
}

// Calls f(i, offset_a, offset_b) for every row-major index i of `shape`.
template <typename F>
void ForEachBroadcast(const Shape& shape, const std::vector<int64_t>& sa,
                      const std::vector<int64_t>& sb, F f) {
  int64_t n = ShapeNumel(shape);
  int r = static_cast<int>(shape.size());
  std::vector<int64_t> index(r, 0);
  int64_t oa = 0, ob = 0;
  for (int64_t i = 0; i < n; ++i) {
    f(i, oa, ob);
    for (int d = r - 1; d >= 0; --d) {
      if (++index[d] < shape[d]) {
        oa += sa[d];
        ob += sb[d];
        break;
      }
      oa -= sa[d] * (shape[d] - 1);
      ob -= sb[d] * (shape[d] - 1);
      index[d] = 0;
    }
  }
}

}  // namespace

absl::Status GemmCpu(const GemmArgs& args) {
  constexpr DType kWeightDTypes[] = {DType::kF32};
  LAIR_ASSIGN_OR_RETURN(GemmDims dims, CheckGemmArgs(args, Device::kCpu, kWeightDTypes));
  const int64_t m = dims.m, n = dims.n, k = dims.k;
  float* c = args.c.f32();
  if (m == 0 || n == 0) return absl::OkStatus();
  if (k == 0) {
    for (int64_t i = 0; i < m * n; ++i) c[i] = args.beta == 0.0f ? 0.0f : args.beta * c[i];
  } else {
    cblas_sgemm(CblasRowMajor, args.trans_a ? CblasTrans : CblasNoTrans,
                args.trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), args.alpha, args.a.f32(), static_cast<int>(args.a.dim(1)),
                args.b.f32(), static_cast<int>(args.b.dim(1)), args.beta, c, static_cast<int>(n));
  }
  if (args.bias.defined()) {
    const float* bias = args.bias.f32();
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * n + j] += bias[j];
    }
  }
  return absl::OkStatus();
}

absl::Status EmbeddingCpu(const EmbeddingArgs& args) {
  LAIR_RETURN_IF_ERROR(CheckEmbeddingArgs(args, Device::kCpu));
  int64_t rows = args.table.dim(0), width = args.table.dim(1), n = args.ids.dim(0);
  const int32_t* ids = args.ids.data<int32_t>();
  LAIR_RETURN_IF_ERROR(CheckIndices("Embedding", "ids", "id", ids, n, rows));
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(args.out.f32() + i * width, args.table.f32() + ids[i] * width,
                static_cast<size_t>(width) * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status EmbeddingBackwardCpu(const EmbeddingBackwardArgs& args) {
  LAIR_RETURN_IF_ERROR(CheckEmbeddingBackwardArgs(args, Device::kCpu));
  int64_t rows = args.d_table.dim(0), width = args.d_table.dim(1), n = args.ids.dim(0);
  const int32_t* ids = args.ids.data<int32_t>();
  LAIR_RETURN_IF_ERROR(CheckIndices("EmbeddingBackward", "ids", "id", ids, n, rows));
  for (int64_t i = 0; i < n; ++i) {
    float* dst = args.d_table.f32() + ids[i] * width;
    const float* src = args.d_out.f32() + i * width;
    for (int64_t j = 0; j < width; ++j) dst[j] += src[j];
  }
  return absl::OkStatus();
}

namespace {

// Mean (0 for RMS) and reciprocal standard deviation of u[0..n).
void NormStats(NormKind kind, const float* u, int64_t n, float eps, double* mean, double* rstd) {
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < n; ++i) sum += u[i];
  *mean = kind == NormKind::kLayer ? sum / n : 0.0;
  for (int64_t i = 0; i < n; ++i) {
    double d = u[i] - *mean;
    sq += d * d;
  }
  *rstd = 1.0 / std::sqrt(sq / n + eps);
}

// The weight element of column `col` (a weight of one group's length is
// shared by the groups).
int64_t WeightColumn(const NormArgs& args, int64_t col) { return col % args.weight.dim(0); }

}  // namespace

absl::Status NormCpu(const NormArgs& args) {
  LAIR_ASSIGN_OR_RETURN(int64_t group, CheckNormArgs(args, Device::kCpu));
  int64_t rows = args.x.dim(0), cols = args.x.dim(1);
  std::vector<float> u(group);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g0 = 0; g0 < cols; g0 += group) {
      int64_t base = r * cols + g0;
      const float* x = args.x.f32() + base;
      for (int64_t i = 0; i < group; ++i) {
        u[i] = args.gate_mode == NormGate::kBefore      ? x[i] * Silu(args.gate.f32()[base + i])
               : args.gate_mode == NormGate::kSiluInput ? Silu(x[i])
                                                        : x[i];
      }
      double mean, rstd;
      NormStats(args.kind, u.data(), group, args.eps, &mean, &rstd);
      for (int64_t i = 0; i < group; ++i) {
        float v = static_cast<float>((u[i] - mean) * rstd);
        if (args.weight.defined()) v *= args.weight.f32()[WeightColumn(args, g0 + i)];
        if (args.gate_mode == NormGate::kAfter) v *= Silu(args.gate.f32()[base + i]);
        args.y.f32()[base + i] = v;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status NormBackwardCpu(const NormBackwardArgs& args) {
  const NormArgs& fwd = args.fwd;
  LAIR_ASSIGN_OR_RETURN(int64_t group, CheckNormBackwardArgs(args, Device::kCpu));
  int64_t rows = fwd.x.dim(0), cols = fwd.x.dim(1);
  std::vector<float> u(group);
  std::vector<double> dxhat(group), xhat(group), d_weight(cols, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g0 = 0; g0 < cols; g0 += group) {
      int64_t base = r * cols + g0;
      const float* x = fwd.x.f32() + base;
      const float* gate = NormHasGate(fwd.gate_mode) ? fwd.gate.f32() + base : nullptr;
      const float* dy = args.d_y.f32() + base;
      for (int64_t i = 0; i < group; ++i) {
        u[i] = fwd.gate_mode == NormGate::kBefore      ? x[i] * Silu(gate[i])
               : fwd.gate_mode == NormGate::kSiluInput ? Silu(x[i])
                                                       : x[i];
      }
      double mean, rstd;
      NormStats(fwd.kind, u.data(), group, fwd.eps, &mean, &rstd);
      double sum_dxhat = 0, sum_dxhat_xhat = 0;
      for (int64_t i = 0; i < group; ++i) {
        xhat[i] = (u[i] - mean) * rstd;
        float w = fwd.weight.defined() ? fwd.weight.f32()[WeightColumn(fwd, g0 + i)] : 1.0f;
        float dz = dy[i];
        if (fwd.gate_mode == NormGate::kAfter) {
          if (args.d_gate.defined()) {
            args.d_gate.f32()[base + i] = static_cast<float>(dz * xhat[i] * w * SiluGrad(gate[i]));
          }
          dz *= Silu(gate[i]);
        }
        if (fwd.weight.defined()) d_weight[WeightColumn(fwd, g0 + i)] += dz * xhat[i];
        dxhat[i] = static_cast<double>(dz) * w;
        sum_dxhat += dxhat[i];
        sum_dxhat_xhat += dxhat[i] * xhat[i];
      }
      double mean_dxhat = fwd.kind == NormKind::kLayer ? sum_dxhat / group : 0.0;
      double mean_dxhat_xhat = sum_dxhat_xhat / group;
      for (int64_t i = 0; i < group; ++i) {
        float du = static_cast<float>(rstd * (dxhat[i] - mean_dxhat - xhat[i] * mean_dxhat_xhat));
        if (fwd.gate_mode == NormGate::kBefore) {
          if (args.d_gate.defined()) args.d_gate.f32()[base + i] = du * x[i] * SiluGrad(gate[i]);
          du *= Silu(gate[i]);
        } else if (fwd.gate_mode == NormGate::kSiluInput) {
          du *= SiluGrad(x[i]);
        }
        args.dx.f32()[base + i] = du;
      }
    }
  }
  if (args.d_weight.defined()) {
    for (int64_t i = 0; i < fwd.weight.dim(0); ++i) {
      args.d_weight.f32()[i] += static_cast<float>(d_weight[i]);
    }
  }
  return absl::OkStatus();
}

absl::Status UnaryCpu(const UnaryArgs& args) {
  LAIR_ASSIGN_OR_RETURN(std::vector<int64_t> sx, CheckUnaryArgs(args, Device::kCpu));
  const float* x = args.x.f32();
  float* y = args.y.f32();
  auto f = [&](float v) { return args.alpha * ApplyUnary(args.op, args.in_scale * v) + args.beta; };
  if (args.x.shape() == args.y.shape()) {
    for (int64_t i = 0; i < args.y.numel(); ++i) y[i] = f(x[i]);
  } else {
    ForEachBroadcast(args.y.shape(), sx, sx,
                     [&](int64_t i, int64_t ox, int64_t) { y[i] = f(x[ox]); });
  }
  return absl::OkStatus();
}

absl::Status UnaryBackwardCpu(const UnaryBackwardArgs& args) {
  LAIR_RETURN_IF_ERROR(CheckUnaryBackwardArgs(args, Device::kCpu));
  const UnaryArgs& fwd = args.fwd;
  const float* x = fwd.x.f32();
  const float* dy = args.d_y.f32();
  float scale = fwd.alpha * fwd.in_scale;
  for (int64_t i = 0; i < fwd.x.numel(); ++i) {
    args.dx.f32()[i] = dy[i] * scale * UnaryDerivative(fwd.op, fwd.in_scale * x[i]);
  }
  return absl::OkStatus();
}

absl::Status BinaryCpu(const BinaryArgs& args) {
  LAIR_ASSIGN_OR_RETURN(BinaryStrides strides, CheckBinaryArgs(args, Device::kCpu));
  const float* a = args.a.f32();
  const float* b = args.b.f32();
  float* y = args.y.f32();
  auto apply = [&](float u, float v) { return ApplyBinary(args.op, u, v); };
  if (args.a.shape() == args.y.shape() && args.b.shape() == args.y.shape()) {
    for (int64_t i = 0; i < args.y.numel(); ++i) y[i] = apply(a[i], b[i]);
  } else {
    ForEachBroadcast(args.y.shape(), strides.a, strides.b,
                     [&](int64_t i, int64_t oa, int64_t ob) { y[i] = apply(a[oa], b[ob]); });
  }
  return absl::OkStatus();
}

absl::Status ReduceSumCpu(const ReduceSumArgs& args) {
  LAIR_ASSIGN_OR_RETURN(std::vector<int64_t> sy, CheckReduceSumArgs(args, Device::kCpu));
  std::vector<double> sum(args.y.numel(), 0.0);
  const float* x = args.x.f32();
  ForEachBroadcast(args.x.shape(), sy, sy,
                   [&](int64_t i, int64_t oy, int64_t) { sum[oy] += x[i]; });
  for (int64_t i = 0; i < args.y.numel(); ++i) args.y.f32()[i] = static_cast<float>(sum[i]);
  return absl::OkStatus();
}

absl::Status CopyColumnsCpu(const CopyColumnsArgs& args) {
  LAIR_RETURN_IF_ERROR(CheckCopyColumnsArgs(args, Device::kCpu));
  int64_t rows = DenseRows(args.src), src_cols = args.src.dim(-1), dst_cols = args.dst.dim(-1);
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = args.src.f32() + r * src_cols + args.src_col;
    float* dst = args.dst.f32() + r * dst_cols + args.dst_col;
    if (args.accumulate) {
      for (int64_t j = 0; j < args.width; ++j) dst[j] += src[j];
    } else {
      std::memcpy(dst, src, static_cast<size_t>(args.width) * sizeof(float));
    }
  }
  return absl::OkStatus();
}

namespace {

// The convolution input at local time `t` (negative: from the window) of a
// sequence whose new tokens start at row `begin` of x.
float ConvInput(const Conv1dArgs& args, bool zero_window, const float* window, int64_t begin,
                int64_t t, int64_t c, int64_t channels, int64_t width) {
  if (t >= 0) return args.x.f32()[(begin + t) * channels + c];
  if (zero_window) return 0.0f;
  return window[c * (width - 1) + (width - 1 + t)];
}

}  // namespace

absl::Status Conv1dCpu(const SequenceBatch& batch, const Conv1dArgs& args) {
  LAIR_ASSIGN_OR_RETURN(ConvDims dims, CheckConv1dArgs(batch, args, Device::kCpu));
  const int64_t channels = dims.channels, width = dims.width;
  int64_t slot_size = channels * (width - 1);
  std::vector<float> next(slot_size);
  for (int s = 0; s < batch.num_seqs; ++s) {
    int64_t begin = batch.cu_seqlens[s], len = batch.cu_seqlens[s + 1] - begin;
    float* window = args.state.f32() + batch.state_slot[s] * slot_size;
    for (int64_t t = 0; t < len; ++t) {
      for (int64_t c = 0; c < channels; ++c) {
        double acc = args.bias.defined() ? args.bias.f32()[c] : 0.0;
        for (int64_t i = 0; i < width; ++i) {
          acc += static_cast<double>(args.weight.f32()[c * width + i]) *
                 ConvInput(args, batch.zero_initial_state, window, begin, t - (width - 1) + i, c,
                           channels, width);
        }
        float pre = static_cast<float>(acc);
        args.y.f32()[(begin + t) * channels + c] = args.silu ? Silu(pre) : pre;
      }
    }
    for (int64_t c = 0; c < channels; ++c) {
      for (int64_t i = 0; i < width - 1; ++i) {
        next[c * (width - 1) + i] = ConvInput(args, batch.zero_initial_state, window, begin,
                                              len - (width - 1) + i, c, channels, width);
      }
    }
    std::memcpy(window, next.data(), static_cast<size_t>(slot_size) * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status Conv1dBackwardCpu(const SequenceBatch& batch, const Conv1dBackwardArgs& args) {
  const Conv1dArgs& fwd = args.fwd;
  LAIR_ASSIGN_OR_RETURN(ConvDims dims, CheckConv1dBackwardArgs(batch, args, Device::kCpu));
  const int64_t channels = dims.channels, width = dims.width;
  int64_t slot_size = channels * (width - 1);
  std::fill(args.dx.f32(), args.dx.f32() + args.dx.numel(), 0.0f);
  std::vector<double> d_weight(channels * width, 0.0), d_bias(channels, 0.0);
  for (int s = 0; s < batch.num_seqs; ++s) {
    int64_t begin = batch.cu_seqlens[s], len = batch.cu_seqlens[s + 1] - begin;
    const float* window = fwd.state.f32() + batch.state_slot[s] * slot_size;
    for (int64_t t = 0; t < len; ++t) {
      for (int64_t c = 0; c < channels; ++c) {
        float dpre = args.d_y.f32()[(begin + t) * channels + c];
        if (fwd.silu) {
          double acc = fwd.bias.defined() ? fwd.bias.f32()[c] : 0.0;
          for (int64_t i = 0; i < width; ++i) {
            acc += static_cast<double>(fwd.weight.f32()[c * width + i]) *
                   ConvInput(fwd, batch.zero_initial_state, window, begin, t - (width - 1) + i, c,
                             channels, width);
          }
          dpre *= SiluGrad(static_cast<float>(acc));
        }
        d_bias[c] += dpre;
        for (int64_t i = 0; i < width; ++i) {
          int64_t src = t - (width - 1) + i;
          d_weight[c * width + i] +=
              static_cast<double>(dpre) *
              ConvInput(fwd, batch.zero_initial_state, window, begin, src, c, channels, width);
          if (src >= 0)
            args.dx.f32()[(begin + src) * channels + c] += dpre * fwd.weight.f32()[c * width + i];
        }
      }
    }
  }
  for (int64_t i = 0; i < channels * width; ++i)
    args.d_weight.f32()[i] += static_cast<float>(d_weight[i]);
  if (args.d_bias.defined()) {
    for (int64_t c = 0; c < channels; ++c) args.d_bias.f32()[c] += static_cast<float>(d_bias[c]);
  }
  return absl::OkStatus();
}

absl::Status RotaryCpu(const RotaryArgs& args) {
  LAIR_RETURN_IF_ERROR(CheckRotaryArgs(args, Device::kCpu));
  int64_t n = args.x.dim(0), heads = args.x.dim(1), dim = args.x.dim(2);
  int64_t half = args.rotary_dim / 2;
  std::vector<float> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] = 1.0f / std::pow(args.theta,
                                  static_cast<float>(2 * i) / static_cast<float>(args.rotary_dim));
  }
  std::vector<float> cos_t(half), sin_t(half), row(dim);
  for (int64_t t = 0; t < n; ++t) {
    float pos = static_cast<float>(args.positions.data<int32_t>()[t]);
    for (int64_t i = 0; i < half; ++i) {
      float angle = pos * inv_freq[i];
      cos_t[i] = std::cos(angle);
      sin_t[i] = args.inverse ? -std::sin(angle) : std::sin(angle);
    }
    for (int64_t h = 0; h < heads; ++h) {
      const float* x = args.x.f32() + (t * heads + h) * dim;
      std::memcpy(row.data(), x, static_cast<size_t>(dim) * sizeof(float));
      float* y = args.y.f32() + (t * heads + h) * dim;
      for (int64_t i = 0; i < half; ++i) {
        int64_t i0 = args.interleaved ? 2 * i : i;
        int64_t i1 = args.interleaved ? 2 * i + 1 : i + half;
        float x0 = row[i0], x1 = row[i1];
        y[i0] = x0 * cos_t[i] - x1 * sin_t[i];
        y[i1] = x0 * sin_t[i] + x1 * cos_t[i];
      }
      for (int64_t i = args.rotary_dim; i < dim; ++i) y[i] = row[i];
    }
  }
  return absl::OkStatus();
}

namespace {

double Dot(const float* a, const float* b, int64_t n) {
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(a[i]) * b[i];
  return acc;
}

}  // namespace

absl::Status AttentionCpu(const SequenceBatch& batch, const AttentionArgs& args) {
  LAIR_RETURN_IF_ERROR(CheckAttentionArgs(batch, args, Device::kCpu).status());
  const int64_t max_context = args.k_cache.dim(1);
  const int64_t d = args.head_dim, group = args.heads / args.kv_heads;
  const int64_t kv_row = args.kv_heads * d;
  std::vector<double> scores;
  std::vector<double> acc(d);
  for (int s = 0; s < batch.num_seqs; ++s) {
    int64_t begin = batch.cu_seqlens[s], len = batch.cu_seqlens[s + 1] - begin;
    int64_t start = args.start_positions[s];
    float* k_cache = args.k_cache.f32() + batch.state_slot[s] * max_context * kv_row;
    float* v_cache = args.v_cache.f32() + batch.state_slot[s] * max_context * kv_row;
    std::memcpy(k_cache + start * kv_row, args.k.f32() + begin * kv_row,
                static_cast<size_t>(len * kv_row) * sizeof(float));
    std::memcpy(v_cache + start * kv_row, args.v.f32() + begin * kv_row,
                static_cast<size_t>(len * kv_row) * sizeof(float));
    for (int64_t t = 0; t < len; ++t) {
      int64_t visible = start + t + 1;
      scores.resize(visible);
      for (int64_t h = 0; h < args.heads; ++h) {
        int64_t kvh = h / group;
        const float* q = args.q.f32() + ((begin + t) * args.heads + h) * d;
        double max_score = -INFINITY;
        for (int64_t j = 0; j < visible; ++j) {
          scores[j] = args.scale * Dot(q, k_cache + j * kv_row + kvh * d, d);
          max_score = std::max(max_score, scores[j]);
        }
        double denom = 0;
        for (int64_t j = 0; j < visible; ++j) {
          scores[j] = std::exp(scores[j] - max_score);
          denom += scores[j];
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < visible; ++j) {
          const float* v = v_cache + j * kv_row + kvh * d;
          for (int64_t i = 0; i < d; ++i) acc[i] += scores[j] * v[i];
        }
        float* o = args.o.f32() + ((begin + t) * args.heads + h) * d;
        for (int64_t i = 0; i < d; ++i) o[i] = static_cast<float>(acc[i] / denom);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status AttentionBackwardCpu(const SequenceBatch& batch, const AttentionBackwardArgs& args) {
  const AttentionArgs& fwd = args.fwd;
  LAIR_ASSIGN_OR_RETURN(int64_t n, CheckAttentionBackwardArgs(batch, args, Device::kCpu));
  const int64_t d = fwd.head_dim, group = fwd.heads / fwd.kv_heads;
  const int64_t q_row = fwd.heads * d, kv_row = fwd.kv_heads * d;
  std::vector<double> dq_acc(d), dk_acc(n * kv_row, 0.0), dv_acc(n * kv_row, 0.0);
  std::vector<double> p, dp;
  for (int s = 0; s < batch.num_seqs; ++s) {
    int64_t begin = batch.cu_seqlens[s], len = batch.cu_seqlens[s + 1] - begin;
    for (int64_t t = 0; t < len; ++t) {
      int64_t row = begin + t, visible = t + 1;
      p.resize(visible);
      dp.resize(visible);
      for (int64_t h = 0; h < fwd.heads; ++h) {
        int64_t kvh = h / group;
        const float* q = fwd.q.f32() + row * q_row + h * d;
        const float* d_o = args.d_o.f32() + row * q_row + h * d;
        double max_score = -INFINITY;
        for (int64_t j = 0; j < visible; ++j) {
          p[j] = fwd.scale * Dot(q, fwd.k.f32() + (begin + j) * kv_row + kvh * d, d);
          max_score = std::max(max_score, p[j]);
        }
        double denom = 0;
        for (int64_t j = 0; j < visible; ++j) {
          p[j] = std::exp(p[j] - max_score);
          denom += p[j];
        }
        double p_dot_dp = 0;
        for (int64_t j = 0; j < visible; ++j) {
          p[j] /= denom;
          dp[j] = Dot(d_o, fwd.v.f32() + (begin + j) * kv_row + kvh * d, d);
          p_dot_dp += p[j] * dp[j];
        }
        std::fill(dq_acc.begin(), dq_acc.end(), 0.0);
        for (int64_t j = 0; j < visible; ++j) {
          double ds = p[j] * (dp[j] - p_dot_dp) * fwd.scale;
          const float* k = fwd.k.f32() + (begin + j) * kv_row + kvh * d;
          double* dk = dk_acc.data() + (begin + j) * kv_row + kvh * d;
          double* dv = dv_acc.data() + (begin + j) * kv_row + kvh * d;
          for (int64_t i = 0; i < d; ++i) {
            dq_acc[i] += ds * k[i];
            dk[i] += ds * q[i];
            dv[i] += p[j] * d_o[i];
          }
        }
        float* dq = args.dq.f32() + row * q_row + h * d;
        for (int64_t i = 0; i < d; ++i) dq[i] = static_cast<float>(dq_acc[i]);
      }
    }
  }
  for (int64_t i = 0; i < n * kv_row; ++i) {
    args.dk.f32()[i] = static_cast<float>(dk_acc[i]);
    args.dv.f32()[i] = static_cast<float>(dv_acc[i]);
  }
  return absl::OkStatus();
}

absl::Status CrossEntropyCpu(const CrossEntropyArgs& args) {
  LAIR_RETURN_IF_ERROR(CheckCrossEntropyArgs(args, Device::kCpu));
  int64_t n = args.logits.dim(0), vocab = args.logits.dim(1);
  const int32_t* targets = args.targets.data<int32_t>();
  LAIR_RETURN_IF_ERROR(CheckIndices("CrossEntropy", "targets", "target", targets, n, vocab));
  for (int64_t i = 0; i < n; ++i) {
    const float* x = args.logits.f32() + i * vocab;
    double max_logit = *std::max_element(x, x + vocab);
    double sum = 0;
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(x[j] - max_logit);
    double lse = max_logit + std::log(sum);
    args.losses.f32()[i] = static_cast<float>(lse - x[targets[i]]);
    if (args.d_logits.defined()) {
      float* dx = args.d_logits.f32() + i * vocab;
      for (int64_t j = 0; j < vocab; ++j) {
        double p = std::exp(x[j] - lse) - (j == targets[i] ? 1.0 : 0.0);
        dx[j] = static_cast<float>(args.grad_scale * p);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace lair::kernels::cpu
