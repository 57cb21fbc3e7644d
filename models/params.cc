#include "models/params.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace lair::models {

absl::StatusOr<Tensor> CheckpointSource::Read(const std::string& name, const Shape& shape,
                                              const InitSpec&) {
  return checkpoint_->GetF32(name, shape);
}

absl::StatusOr<Tensor> RandomSource::Read(const std::string&, const Shape& shape, const InitSpec& init) {
  Tensor t = Tensor::Zeros(DType::kF32, shape);
  float* p = t.f32();
  int64_t n = t.numel();
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  switch (init.kind) {
    case InitSpec::kNormal: {
      std::normal_distribution<float> normal(0.0f, init.a > 0 ? init.a : std_);
      for (int64_t i = 0; i < n; ++i) p[i] = normal(rng_);
      break;
    }
    case InitSpec::kConstant:
      for (int64_t i = 0; i < n; ++i) p[i] = init.a;
      break;
    case InitSpec::kLinspace:
      for (int64_t i = 0; i < n; ++i) p[i] = n == 1 ? init.a : init.a + (init.b - init.a) * i / (n - 1);
      break;
    case InitSpec::kLogUniform:
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(std::log(init.a + (init.b - init.a) * uniform(rng_)));
      break;
    case InitSpec::kDtBias:
      for (int64_t i = 0; i < n; ++i) {
        double dt = std::exp(std::log(init.a) + (std::log(init.b) - std::log(init.a)) * uniform(rng_));
        dt = std::max(dt, 1e-4);
        p[i] = static_cast<float>(dt + std::log(-std::expm1(-dt)));
      }
      break;
  }
  return t;
}

Params::Params(ParamSource* source, kernels::Backend* backend, DType matrix_dtype)
    : source_(source), backend_(backend), matrix_dtype_(matrix_dtype) {}

absl::StatusOr<int> Params::Add(const std::string& name, const Shape& shape, InitSpec init, bool matrix) {
  LAIR_ASSIGN_OR_RETURN(Tensor host, source_->Read(name, shape, init));
  if (backend_ == nullptr) {
    tensors_.push_back(std::move(host));
  } else {
    LAIR_ASSIGN_OR_RETURN(Tensor device, backend_->Upload(host, matrix ? matrix_dtype_ : DType::kF32));
    tensors_.push_back(std::move(device));
  }
  names_.push_back(name);
  matrix_.push_back(matrix);
  return size() - 1;
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
