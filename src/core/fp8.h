// Scalar conversions between f32 and FP8 e4m3 ("fn" variant: 4 exponent bits
// with bias 7, 3 mantissa bits, no infinities, 0x7f/0xff are NaN, largest
// finite value 448). This is the KV cache's 8-bit format; the CUDA kernels use
// the hardware conversion with the same rules, so the CPU and the GPU store
// identical bytes for the same value.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace deepinfer {

inline constexpr float kF8E4M3Max = 448.0f;

// Round to nearest, ties to even; finite values beyond +-448 and infinities
// saturate to +-448 (what a cache wants: one outlier must not become NaN and
// poison every later attention score); NaN stays NaN.
inline uint8_t f32_to_f8e4m3(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const auto sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7f);
  const float a = std::fabs(f);
  if (a >= kF8E4M3Max) return static_cast<uint8_t>(sign | 0x7e);
  if (a < 0x1p-6f) {
    // Subnormal range: a multiple of 2^-9. a * 512 is exact, and nearbyint
    // rounds ties to even in the default rounding mode; 8 * 2^-9 = 2^-6 is
    // the smallest normal, whose code 0x08 the same arithmetic yields.
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f)));
  }
  int exponent = static_cast<int>(abs_bits >> 23) - 127;  // in [-6, 8]
  uint32_t mantissa = (abs_bits >> 20) & 7u;
  const uint32_t rest = abs_bits & 0xfffffu, halfway = 0x80000u;
  if (rest > halfway || (rest == halfway && (mantissa & 1u))) ++mantissa;
  if (mantissa == 8) {
    mantissa = 0;
    ++exponent;
  }
  // a < 448 = 1.75 * 2^8 rounds to at most 448 (the tie 464 is out of range).
  return static_cast<uint8_t>(sign | static_cast<uint32_t>(exponent + 7) << 3 | mantissa);
}

inline float f8e4m3_to_f32_exact(uint8_t v) {
  const int exponent = (v >> 3) & 0xf, mantissa = v & 7;
  if (exponent == 15 && mantissa == 7) return std::numeric_limits<float>::quiet_NaN();
  const float magnitude = exponent == 0 ? static_cast<float>(mantissa) * 0x1p-9f
                                        : std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
  return (v & 0x80) ? -magnitude : magnitude;
}

// All 256 values, for loops that decode whole rows.
inline const std::array<float, 256>& f8e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[static_cast<size_t>(i)] = f8e4m3_to_f32_exact(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}

inline float f8e4m3_to_f32(uint8_t v) { return f8e4m3_table()[v]; }

}  // namespace deepinfer
