// Element types and the scalar conversions between them.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace lair {

enum class DType : uint8_t { kF32, kBF16, kF16, kI32, kI64 };

// Bytes per element.
size_t DTypeSize(DType dtype);
// F32, BF16 or F16.
inline bool IsFloat(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
}
// BF16 or F16: the 16-bit floats that products and scans read and write.
inline bool IsSixteenBitFloat(DType dtype) { return dtype == DType::kBF16 || dtype == DType::kF16; }
// The safetensors spelling: "F32", "BF16", "F16", "I32", "I64".
std::string_view DTypeName(DType dtype);

// bfloat16 is the upper half of an IEEE float32; rounding is to nearest even.
inline float BF16ToFloat(uint16_t bits) {
  uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}
uint16_t FloatToBF16(float value);
float F16ToFloat(uint16_t bits);
uint16_t FloatToF16(float value);

}  // namespace lair
