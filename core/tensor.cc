#include "core/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace lair {

std::string ShapeString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

int64_t ShapeNumel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Tensor Tensor::Zeros(DType dtype, Shape shape) {
  size_t bytes = static_cast<size_t>(ShapeNumel(shape)) * DTypeSize(dtype);
  // 64-byte alignment suits AVX-512 loads and BLAS.
  size_t padded = (bytes + 63) / 64 * 64;
  void* data = std::aligned_alloc(64, padded == 0 ? 64 : padded);
  LAIR_CHECK(data != nullptr);
  std::memset(data, 0, padded == 0 ? 64 : padded);
  std::shared_ptr<void> owner(data, [](void* p) { std::free(p); });
  return Wrap(data, dtype, std::move(shape), Device::kCpu, std::move(owner));
}

Tensor Tensor::FromFloats(Shape shape, const std::vector<float>& values) {
  Tensor t = Zeros(DType::kF32, std::move(shape));
  LAIR_CHECK(static_cast<int64_t>(values.size()) == t.numel());
  if (!values.empty()) std::memcpy(t.raw(), values.data(), values.size() * sizeof(float));
  return t;
}

Tensor Tensor::Wrap(void* data, DType dtype, Shape shape, Device device,
                    std::shared_ptr<void> owner) {
  Tensor t;
  t.data_ = data;
  t.dtype_ = dtype;
  t.device_ = device;
  t.shape_ = std::move(shape);
  t.owner_ = std::move(owner);
  return t;
}

int64_t Tensor::dim(int axis) const {
  if (axis < 0) axis += rank();
  LAIR_CHECK(axis >= 0 && axis < rank());
  return shape_[axis];
}

float* Tensor::f32() const {
  LAIR_CHECK(dtype_ == DType::kF32);
  return static_cast<float*>(data_);
}

Tensor Tensor::Reshape(Shape shape) const {
  LAIR_CHECK(ShapeNumel(shape) == numel());
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::Rows(int64_t begin, int64_t end) const {
  LAIR_CHECK(rank() >= 1 && 0 <= begin && begin <= end && end <= shape_[0]);
  int64_t row = shape_[0] == 0 ? 0 : numel() / shape_[0];
  Tensor t = *this;
  t.data_ = static_cast<char*>(data_) + begin * row * static_cast<int64_t>(DTypeSize(dtype_));
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::ToF32() const {
  LAIR_CHECK(device_ == Device::kCpu);
  Tensor out = Zeros(DType::kF32, shape_);
  float* dst = out.f32();
  int64_t n = numel();
  switch (dtype_) {
    case DType::kF32:
      std::memcpy(dst, data_, nbytes());
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = BF16ToFloat(data<uint16_t>()[i]);
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = F16ToFloat(data<uint16_t>()[i]);
      break;
    case DType::kI32:
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(data<int32_t>()[i]);
      break;
    case DType::kI64:
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(data<int64_t>()[i]);
      break;
  }
  return out;
}

Tensor Tensor::Clone() const {
  LAIR_CHECK(device_ == Device::kCpu);
  Tensor out = Zeros(dtype_, shape_);
  std::memcpy(out.raw(), data_, nbytes());
  return out;
}

std::string Tensor::DebugString() const {
  return absl::StrCat(std::string(DTypeName(dtype_)), ShapeString(shape_));
}

absl::Status ExpectShape(const Tensor& t, const Shape& shape, std::string_view what) {
  if (!t.defined())
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": missing tensor"));
  if (t.shape() != shape) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": expected shape ",
                                                   ShapeString(shape), ", got ",
                                                   ShapeString(t.shape())));
  }
  return absl::OkStatus();
}

double RelativeError(const Tensor& a, const Tensor& b) {
  LAIR_CHECK(a.numel() == b.numel());
  double diff = 0, ref = 0;
  const float* pa = a.f32();
  const float* pb = b.f32();
  for (int64_t i = 0; i < a.numel(); ++i) {
    double d = static_cast<double>(pa[i]) - pb[i];
    diff += d * d;
    ref += static_cast<double>(pb[i]) * pb[i];
  }
  if (ref == 0) return diff == 0 ? 0 : std::sqrt(diff);
  return std::sqrt(diff / ref);
}

std::vector<int32_t> RowArgmax(const Tensor& t) {
  LAIR_CHECK(t.device() == Device::kCpu && t.dtype() == DType::kF32 && t.shape().size() == 2);
  const int64_t rows = t.dim(0), cols = t.dim(1);
  std::vector<int32_t> ids(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = t.f32() + r * cols;
    ids[r] = static_cast<int32_t>(std::max_element(row, row + cols) - row);
  }
  return ids;
}

}  // namespace lair
