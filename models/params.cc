#include "models/params.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/parallel.h"

namespace lair::models {
namespace {

// p[0, n) ~ N(0, std²) in chunks of 2^20 values, each from its own generator
// seeded by (seed, chunk), filled by every core: the values depend only on
// the seed (a 7B-parameter `lair init` takes seconds, not minutes).
void FillNormal(float* p, int64_t n, float std, uint64_t seed) {
  constexpr int64_t kChunk = int64_t{1} << 20;
  ParallelFor((n + kChunk - 1) / kChunk, 0, [&](int64_t c) {
    std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                      static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32)};
    std::mt19937_64 gen(seq);
    std::normal_distribution<float> normal(0.0f, std);
    for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) p[i] = normal(gen);
  });
}

}  // namespace

absl::StatusOr<Tensor> CheckpointSource::Read(const std::string& name, const Shape& shape,
                                              const InitSpec&) {
  return checkpoint_->GetF32(name, shape);
}

absl::StatusOr<Tensor> RandomSource::Read(const std::string&, const Shape& shape,
                                          const InitSpec& init) {
  Tensor t = Tensor::Zeros(DType::kF32, shape);
  float* p = t.f32();
  int64_t n = t.numel();
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  switch (init.kind) {
    case InitSpec::kNormal:
      FillNormal(p, n, init.a > 0 ? init.a : std_, rng_());
      break;
    case InitSpec::kConstant:
      for (int64_t i = 0; i < n; ++i) p[i] = init.a;
      break;
    case InitSpec::kLinspace:
      for (int64_t i = 0; i < n; ++i)
        p[i] = n == 1 ? init.a : init.a + (init.b - init.a) * i / (n - 1);
      break;
    case InitSpec::kLogUniform:
      for (int64_t i = 0; i < n; ++i)
        p[i] = static_cast<float>(std::log(init.a + (init.b - init.a) * uniform(rng_)));
      break;
    case InitSpec::kDtBias:
      for (int64_t i = 0; i < n; ++i) {
        double dt =
            std::exp(std::log(init.a) + (std::log(init.b) - std::log(init.a)) * uniform(rng_));
        dt = std::max(dt, 1e-4);
        p[i] = static_cast<float>(dt + std::log(-std::expm1(-dt)));
      }
      break;
  }
  return t;
}

Params::Params(ParamSource* source, kernels::Backend* backend, DType matrix_dtype)
    : source_(source), backend_(backend), matrix_dtype_(matrix_dtype) {}

absl::StatusOr<int> Params::Add(const std::string& name, const Shape& shape, InitSpec init,
                                bool matrix) {
  LAIR_ASSIGN_OR_RETURN(Tensor host, source_->Read(name, shape, init));
  LAIR_ASSIGN_OR_RETURN(Tensor stored, Place(host, matrix ? matrix_dtype_ : DType::kF32));
  return Append(name, std::move(stored), matrix, /*derived=*/false);
}

int Params::Append(const std::string& name, Tensor stored, bool matrix, bool derived) {
  tensors_.push_back(std::move(stored));
  names_.push_back(name);
  matrix_.push_back(matrix);
  derived_.push_back(derived);
  return size() - 1;
}

absl::StatusOr<Tensor> Params::Place(const Tensor& host, DType dtype) const {
  if (backend_ == nullptr) return host;
  LAIR_ASSIGN_OR_RETURN(Tensor device, backend_->Upload(host, dtype));
  // The CPU multiplies F32 weights only: it holds 16-bit matrices as the
  // F32 values of their rounding, so it computes exactly what they say.
  if (backend_->device() == Device::kCpu && dtype != DType::kF32) device = device.ToF32();
  return device;
}

absl::Status Params::ScaleColumns(int matrix, int vector) {
  const Tensor& m = tensors_.at(matrix);
  const Tensor& v = tensors_.at(vector);
  if (!matrix_[matrix] || m.rank() != 2 || v.numel() != m.dim(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ScaleColumns: ", names_[vector], " ", v.DebugString(),
                     " does not scale the columns of ", names_[matrix], " ", m.DebugString()));
  }
  const int64_t rows = m.dim(0), cols = m.dim(1);
  LAIR_ASSIGN_OR_RETURN(Tensor w, HostF32Copy(m));
  LAIR_ASSIGN_OR_RETURN(const Tensor scale, HostF32Copy(v));
  float* p = w.f32();
  const float* s = scale.f32();
  ParallelFor(rows, 0, [&](int64_t r) {
    for (int64_t c = 0; c < cols; ++c) p[r * cols + c] *= s[c];
  });
  LAIR_ASSIGN_OR_RETURN(tensors_[matrix], Place(w, matrix_dtype_));
  return absl::OkStatus();
}

absl::StatusOr<int> Params::AddProduct(const std::string& name, int left, int right) {
  const Tensor& l = tensors_.at(left);
  const Tensor& r = tensors_.at(right);
  if (!matrix_[left] || !matrix_[right] || l.rank() != 2 || r.rank() != 2 || l.dim(1) != r.dim(0)) {
    return absl::InvalidArgumentError(absl::StrCat("AddProduct: ", names_[left], " ",
                                                   l.DebugString(), " cannot multiply ",
                                                   names_[right], " ", r.DebugString()));
  }
  LAIR_ASSIGN_OR_RETURN(const Tensor a, HostF32Copy(l));
  LAIR_ASSIGN_OR_RETURN(const Tensor b, HostF32Copy(r));
  // The fp32 reference backend's product (OpenBLAS), whatever backend the
  // weights live on.
  kernels::GemmArgs product;
  product.a = a;
  product.b = b;
  product.trans_b = false;
  product.c = Tensor::Zeros(DType::kF32, {l.dim(0), r.dim(1)});
  LAIR_RETURN_IF_ERROR(kernels::MakeCpuBackend()->Gemm(product));
  LAIR_ASSIGN_OR_RETURN(Tensor stored, Place(product.c, matrix_dtype_));
  return Append(name, std::move(stored), /*matrix=*/true, /*derived=*/true);
}

absl::StatusOr<Tensor> Params::HostF32Copy(const Tensor& stored) const {
  if (backend_ == nullptr) return stored.ToF32();
  // Download copies already; only 16-bit values need a second, widening one.
  LAIR_ASSIGN_OR_RETURN(Tensor host, backend_->Download(stored));
  return host.dtype() == DType::kF32 ? host : host.ToF32();
}

absl::StatusOr<Tensor> Params::Constant(const Tensor& host) {
  if (backend_ == nullptr) return host;
  return backend_->Upload(host, host.dtype());
}

int64_t Params::NumElements() const {
  int64_t n = 0;
  for (const Tensor& t : tensors_) n += t.numel();
  return n;
}

}  // namespace lair::models
