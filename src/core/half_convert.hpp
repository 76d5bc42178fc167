// IEEE binary16 and bfloat16 <-> float on the host, round-to-nearest-even,
// with NaN, infinities and subnormals kept. Used by the CPU backend to convert
// on load and store, and by tests and tools to build inputs.
#pragma once

#include <cstdint>
#include <cstring>

namespace cuflash::detail {

inline std::uint32_t float_bits(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

inline float bits_float(std::uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

inline float bf16_to_float(std::uint16_t h) { return bits_float(static_cast<std::uint32_t>(h) << 16); }

inline std::uint16_t float_to_bf16(float value) {
  std::uint32_t bits = float_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}

inline float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return bits_float(sign);
    // Subnormal: value = mantissa * 2^-24.
    float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

inline std::uint16_t float_to_f16(float value) {
  const std::uint32_t bits = float_bits(value);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  if (abs_bits >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs_bits < 0x38800000u) {
    // Subnormal or zero in half: round abs/2^-24 to an integer, ties to even.
    const float scaled = bits_float(abs_bits) * 16777216.0f;  // exact: power of two
    float rounded = static_cast<float>(static_cast<std::uint32_t>(scaled));
    const float fraction = scaled - rounded;
    if (fraction > 0.5f || (fraction == 0.5f && (static_cast<std::uint32_t>(rounded) & 1u))) rounded += 1.0f;
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(rounded));
  }
  // Normal: rebias the exponent, round the 13 dropped mantissa bits to even.
  std::uint32_t half = ((abs_bits - 0x38000000u) >> 13);
  const std::uint32_t dropped = abs_bits & 0x1fffu;
  if (dropped > 0x1000u || (dropped == 0x1000u && (half & 1u))) half += 1;
  return static_cast<std::uint16_t>(sign | half);
}

}  // namespace cuflash::detail
