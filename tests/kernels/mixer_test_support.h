// Helpers shared by the mixer kernel tests (gsa_test.cc, mlstm_test.cc):
// packed batches and their pieces, random inputs, float64 comparisons and
// central differences, and the golden fixtures' [B,T,...] layout.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/tensor.h"
#include "kernels/mixer.h"

namespace lair::kernels::mixer_test {

// cu_seqlens of sequences of `lens` tokens packed one after the other.
inline std::vector<int32_t> Offsets(const std::vector<int>& lens) {
  std::vector<int32_t> cu = {0};
  for (int len : lens) cu.push_back(cu.back() + len);
  return cu;
}

inline void FillNormal(const Tensor& t, std::mt19937& rng, float mean, float stddev) {
  std::normal_distribution<float> dist(mean, stddev);
  for (int64_t e = 0; e < t.numel(); ++e) t.f32()[e] = dist(rng);
}

inline Tensor Normal(const Shape& shape, std::mt19937& rng, float stddev) {
  Tensor t = Tensor::Zeros(DType::kF32, shape);
  FillNormal(t, rng, 0.0f, stddev);
  return t;
}

// Rows `rows` of a packed tensor (dimension 0), as a new tensor.
inline Tensor GatherRows(const Tensor& t, const std::vector<int64_t>& rows) {
  Shape shape = t.shape();
  shape[0] = static_cast<int64_t>(rows.size());
  Tensor out = Tensor::Zeros(DType::kF32, shape);
  const int64_t width = t.numel() / t.dim(0);
  for (size_t r = 0; r < rows.size(); ++r) {
    std::copy_n(t.f32() + rows[r] * width, width, out.f32() + r * width);
  }
  return out;
}

// Writes row r of `src` to row rows[r] of `dst`.
inline void ScatterRows(const Tensor& src, const std::vector<int64_t>& rows, const Tensor& dst) {
  const int64_t width = dst.numel() / dst.dim(0);
  for (size_t r = 0; r < rows.size(); ++r) {
    std::copy_n(src.f32() + r * width, width, dst.f32() + rows[r] * width);
  }
}

// Tokens [begin, end) of every sequence (clamped to its length) as one
// launch: the rows of the whole packed tensors it covers, and its batch.
// Sequences with no token there are left out.
struct Piece {
  std::vector<int64_t> rows;
  std::vector<int32_t> cu_seqlens = {0};
  std::vector<int32_t> slots;

  bool empty() const { return slots.empty(); }
  SequenceBatch Batch() const {
    SequenceBatch batch;
    batch.num_seqs = static_cast<int>(slots.size());
    batch.cu_seqlens = cu_seqlens;
    batch.state_slot = slots;
    return batch;
  }
};

// `slots[s]`: the state slot of sequence s.
inline Piece MakePiece(const std::vector<int>& lens, const std::vector<int32_t>& slots, int begin,
                       int end) {
  const std::vector<int32_t> cu = Offsets(lens);
  Piece piece;
  for (size_t s = 0; s < lens.size(); ++s) {
    const int from = std::min(begin, lens[s]), to = std::min(end, lens[s]);
    if (from == to) continue;
    for (int t = from; t < to; ++t) piece.rows.push_back(cu[s] + t);
    piece.cu_seqlens.push_back(static_cast<int32_t>(piece.rows.size()));
    piece.slots.push_back(slots[s]);
  }
  return piece;
}

// Cuts 0, 1, ..., longest: one token of every sequence per piece (decode).
inline std::vector<int> StepCuts(const std::vector<int>& lens) {
  std::vector<int> cuts;
  for (int t = 0; t <= *std::max_element(lens.begin(), lens.end()); ++t) cuts.push_back(t);
  return cuts;
}

inline std::vector<double> ToDouble(const Tensor& t) {
  return std::vector<double>(t.f32(), t.f32() + t.numel());
}

inline double Dot(const std::vector<double>& a, const Tensor& b) {
  double sum = 0;
  for (size_t e = 0; e < a.size(); ++e) sum += a[e] * b.f32()[e];
  return sum;
}

// ‖ours − ref‖ / sqrt(‖ref‖² + floor²): a floor keeps all-but-zero
// references meaningful.
inline double RelativeErrorTo(const Tensor& ours, const std::vector<double>& ref,
                              double floor = 0) {
  double diff = 0, norm = floor * floor;
  for (size_t e = 0; e < ref.size(); ++e) {
    diff += (ours.f32()[e] - ref[e]) * (ours.f32()[e] - ref[e]);
    norm += ref[e] * ref[e];
  }
  return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

// Central differences (step 1e-5) of loss(inputs) with respect to every
// element of inputs.*field.
template <typename Inputs, typename Loss>
std::vector<double> FiniteDifference(const Inputs& x, std::vector<double> Inputs::*field,
                                     Loss loss) {
  constexpr double kStep = 1e-5;
  Inputs probe = x;
  std::vector<double> grad((x.*field).size());
  for (size_t e = 0; e < grad.size(); ++e) {
    (probe.*field)[e] = (x.*field)[e] + kStep;
    const double plus = loss(probe);
    (probe.*field)[e] = (x.*field)[e] - kStep;
    const double minus = loss(probe);
    (probe.*field)[e] = (x.*field)[e];
    grad[e] = (plus - minus) / (2 * kStep);
  }
  return grad;
}

// A fixture tensor [B,T,...] as the packed [B·T,...] the kernels take.
inline Tensor PackSequences(const Tensor& x) {
  Shape shape = x.shape();
  shape.erase(shape.begin());
  shape[0] *= x.dim(0);
  return x.Reshape(shape);
}

}  // namespace lair::kernels::mixer_test
