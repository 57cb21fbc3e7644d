#include "core/dtype.h"

#include <cmath>

namespace lair {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kI64:
      return 8;
  }
  return 0;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
  }
  return "?";
}

uint16_t FloatToBF16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  if (std::isnan(value)) return static_cast<uint16_t>((word >> 16) | 0x40);
  // Round to nearest, ties to even, on the 16 bits that are dropped.
  uint32_t rounding = 0x7fff + ((word >> 16) & 1);
  return static_cast<uint16_t>((word + rounding) >> 16);
}

float F16ToFloat(uint16_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000) << 16;
  int exponent = (bits >> 10) & 0x1f;
  uint32_t mantissa = bits & 0x3ff;
  uint32_t word;
  if (exponent == 0x1f) {
    word = sign | 0x7f800000 | (mantissa << 13);
  } else if (exponent != 0) {
    word = sign | (static_cast<uint32_t>(exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    word = sign;
  } else {
    // Subnormal half: value = mantissa * 2^-24.
    float value = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -value : value;
  }
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

uint16_t FloatToF16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  uint16_t sign = static_cast<uint16_t>((word >> 16) & 0x8000);
  if (std::isnan(value)) return sign | 0x7e00;
  float magnitude = std::fabs(value);
  if (magnitude >= 65520.0f) return sign | 0x7c00;
  if (magnitude < std::ldexp(1.0f, -24) * 0.5f) return sign;
  int exponent;
  std::frexp(magnitude, &exponent);  // magnitude = f * 2^exponent, f in [0.5, 1)
  if (exponent < -13) {
    // Subnormal: units of 2^-24, rounded to nearest even.
    float units = std::nearbyint(std::ldexp(magnitude, 24));
    return sign | static_cast<uint16_t>(units);
  }
  float units = std::nearbyint(std::ldexp(magnitude, 11 - exponent));  // 11 significant bits
  uint32_t mant = static_cast<uint32_t>(units);
  if (mant >= 2048) {
    mant >>= 1;
    ++exponent;
  }
  uint32_t biased = static_cast<uint32_t>(exponent + 14);
  return sign | static_cast<uint16_t>((biased << 10) | (mant & 0x3ff));
}

}  // namespace lair
