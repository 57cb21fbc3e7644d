// Tensor: a dense, row-major, typed block of memory on one device.
//
// A Tensor shares its storage: copying a Tensor copies the handle, not the
// data, and views (Reshape, Rows) alias their source. Storage is freed when
// the last handle goes. Host tensors are allocated here; device tensors are
// made by a backend, which wraps its own allocation with Tensor::Wrap.
//
// Thread safety: const methods may be called from many threads; writes to the
// data need external synchronization, as for any buffer.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace lair {

enum class Device : uint8_t { kCpu, kCuda };

using Shape = std::vector<int64_t>;

// "[2, 130, 64]"
std::string ShapeString(const Shape& shape);
int64_t ShapeNumel(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;

  // A zero-filled host tensor.
  static Tensor Zeros(DType dtype, Shape shape);
  // A host float32 tensor holding `values` (size must match the shape).
  static Tensor FromFloats(Shape shape, const std::vector<float>& values);
  // Wraps memory owned elsewhere; `owner` keeps it alive (may be null for
  // memory that outlives every use, such as a memory-mapped checkpoint held
  // by the caller).
  static Tensor Wrap(void* data, DType dtype, Shape shape, Device device,
                     std::shared_ptr<void> owner);

  bool defined() const { return data_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  // Size of dimension `axis`; negative axes count from the end.
  int64_t dim(int axis) const;
  int64_t numel() const { return ShapeNumel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }

  void* raw() const { return data_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(data_);
  }
  // REQUIRES: dtype() == kF32.
  float* f32() const;

  // The same storage under another shape with the same element count.
  Tensor Reshape(Shape shape) const;
  // Rows [begin, end) of the first dimension, aliasing this tensor.
  Tensor Rows(int64_t begin, int64_t end) const;
  // A host copy converted to float32 (any float dtype, any device handled by
  // the caller copying to host first). REQUIRES: device() == kCpu.
  Tensor ToF32() const;
  // A deep host copy. REQUIRES: device() == kCpu.
  Tensor Clone() const;

  // "F32[2, 130, 64]"
  std::string DebugString() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;
  Shape shape_;
  std::shared_ptr<void> owner_;
};

// Returns InvalidArgument naming `what` unless `t` has exactly `shape`.
absl::Status ExpectShape(const Tensor& t, const Shape& shape, std::string_view what);

// ‖a − b‖₂ / ‖b‖₂ over float32 host tensors of equal size (0 when both are 0).
double RelativeError(const Tensor& a, const Tensor& b);

// The first largest index of each row of a float32 host tensor [rows, cols]:
// greedy decoding's tokens from host logits (Backend::ArgmaxRows does this
// on the device).
std::vector<int32_t> RowArgmax(const Tensor& t);

}  // namespace lair
