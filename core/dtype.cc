#include "core/dtype.h"

#include <cmath>

namespace dfa {

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
  }
  return "unknown";
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal half -> normal float
      float f = std::ldexp(static_cast<float>(mant), -24);
      std::memcpy(&u, &f, 4);
      u |= sign;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00;  // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00; // overflow (incl. rounding up) -> inf
  if (abs < 0x38800000u) {                      // below smallest normal half: subnormal or 0
    const float a = std::fabs(f);
    const float scaled = a * 16777216.f;         // 2^24: units of the smallest subnormal
    const float r = std::nearbyint(scaled);      // round to nearest even (default mode)
    return sign | static_cast<uint16_t>(r);
  }
  // Normal: rebias exponent, round mantissa to 10 bits, nearest even.
  uint32_t m = abs + 0xfffu + ((abs >> 13) & 1u);
  return sign | static_cast<uint16_t>((m - 0x38000000u) >> 13);
}

}  // namespace dfa
