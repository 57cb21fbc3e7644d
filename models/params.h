// Params: a model's weights by checkpoint name, built once by the family code
// and read by Graph as parameter ids.
//
// The family code declares each parameter with its reference name, shape and
// how a fresh model initializes it; a ParamSource supplies the values: the
// checkpoint when loading (shape checked, name reported when missing), or a
// seeded random generator for `lair init`. The same declarations therefore
// define loading, the gradient names of LossAndGrad and new checkpoints.
//
// Thread safety: not thread-safe; built by one thread, then read-only.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/tensor.h"
#include "kernels/backend.h"

namespace lair::models {

// How `lair init` fills a parameter.
struct InitSpec {
  enum Kind {
    kNormal,      // N(0, a²); a = 0 means the config's initializer_range
    kConstant,    // every element a
    kLinspace,    // a .. b evenly over the elements
    kLogUniform,  // log(U(a, b))            (Mamba2 A_log)
    kDtBias,      // softplus⁻¹(exp(U(log a, log b)))  (Mamba2 dt_bias)
  };
  Kind kind = kNormal;
  float a = 0.0f, b = 0.0f;

  static InitSpec Normal(float std = 0.0f) { return {kNormal, std, 0.0f}; }
  static InitSpec Constant(float value) { return {kConstant, value, 0.0f}; }
  static InitSpec Ones() { return Constant(1.0f); }
  static InitSpec Zeros() { return Constant(0.0f); }
};

// Supplies host F32 values for declared parameters.
class ParamSource {
 public:
  virtual ~ParamSource() = default;
  virtual absl::StatusOr<Tensor> Read(const std::string& name, const Shape& shape,
                                      const InitSpec& init) = 0;
};

// Reads the checkpoint; NotFound / InvalidArgument name the tensor and the
// directory.
class CheckpointSource : public ParamSource {
 public:
  explicit CheckpointSource(const Checkpoint* checkpoint) : checkpoint_(checkpoint) {}
  absl::StatusOr<Tensor> Read(const std::string& name, const Shape& shape,
                              const InitSpec& init) override;

 private:
  const Checkpoint* checkpoint_;
};

// Fresh weights from a seeded std::mt19937_64.
class RandomSource : public ParamSource {
 public:
  RandomSource(uint64_t seed, float initializer_range) : rng_(seed), std_(initializer_range) {}
  absl::StatusOr<Tensor> Read(const std::string& name, const Shape& shape,
                              const InitSpec& init) override;

 private:
  std::mt19937_64 rng_;
  float std_;
};

class Params {
 public:
  // Values go to `backend` (weight matrices as `matrix_dtype`, everything else
  // F32; the CPU backend holds a 16-bit matrix_dtype as F32 values rounded to
  // it); with a null backend the host tensors are kept (for `lair init`).
  Params(ParamSource* source, kernels::Backend* backend, DType matrix_dtype = DType::kF32);

  // Declares a parameter and returns its id. `matrix` marks projection
  // weights (read by Gemm), which may be stored in matrix_dtype.
  absl::StatusOr<int> Add(const std::string& name, const Shape& shape, InitSpec init = {},
                          bool matrix = false);
  absl::StatusOr<int> AddMatrix(const std::string& name, const Shape& shape, InitSpec init = {}) {
    return Add(name, shape, init, true);
  }

  // A constant (not a parameter) on the same device as the weights.
  absl::StatusOr<Tensor> Constant(const Tensor& host);

  // Matrix `matrix` [out, in] becomes matrix · diag(vector) (vector [in], F32):
  // a norm's weight folded into the products that read the norm, so that
  // they may read it without its weight (models/decoder.h). Computed in F32
  // from the stored values, then stored as the matrix was.
  absl::Status ScaleColumns(int matrix, int vector);
  // A new matrix, left · right (left [out, r], right [r, in] matrices),
  // computed in F32 from the stored values and stored as matrices are: a
  // weight derived for inference (is_derived), not a checkpoint parameter.
  absl::StatusOr<int> AddProduct(const std::string& name, int left, int right);

  int size() const { return static_cast<int>(names_.size()); }
  const std::string& name(int id) const { return names_[id]; }
  const std::vector<Tensor>& tensors() const { return tensors_; }
  // Whether parameter `id` was declared with AddMatrix.
  bool is_matrix(int id) const { return matrix_[id]; }
  // Whether parameter `id` came from AddProduct.
  bool is_derived(int id) const { return derived_[id]; }
  int64_t NumElements() const;

 private:
  // `host` (F32) as parameter storage: on the backend in `dtype`, or kept.
  absl::StatusOr<Tensor> Place(const Tensor& host, DType dtype) const;
  // A host F32 copy of stored parameter values, which the caller may change.
  absl::StatusOr<Tensor> HostF32Copy(const Tensor& stored) const;
  // Appends a parameter to the parallel lists below; returns its id.
  int Append(const std::string& name, Tensor stored, bool matrix, bool derived);

  ParamSource* source_;
  kernels::Backend* backend_;
  DType matrix_dtype_;
  std::vector<std::string> names_;
  std::vector<Tensor> tensors_;
  std::vector<bool> matrix_;
  std::vector<bool> derived_;
};

}  // namespace lair::models
