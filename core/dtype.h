// Element types of attention tensors and scalar conversions (fp32 arithmetic everywhere).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace dfa {

enum class DType : int { kF32 = 1, kBF16 = 2, kF16 = 3 };

inline constexpr int DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }
std::string_view DTypeName(DType t);

// bf16 <-> fp32, round to nearest even; NaN stays NaN.
inline float BF16ToFloat(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t FloatToBF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
// IEEE half <-> fp32 (F16C-free portable versions; the CPU kernels vectorise their own).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);

// Reads element i of a buffer of type t as fp32.
inline float LoadAsFloat(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kBF16: return BF16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16: return HalfToFloat(static_cast<const uint16_t*>(p)[i]);
  }
  return 0.f;
}
inline void StoreFromFloat(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(p)[i] = v; break;
    case DType::kBF16: static_cast<uint16_t*>(p)[i] = FloatToBF16(v); break;
    case DType::kF16: static_cast<uint16_t*>(p)[i] = FloatToHalf(v); break;
  }
}

}  // namespace dfa
