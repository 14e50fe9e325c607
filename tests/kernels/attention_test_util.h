// Helpers for the kernel tests: random inputs rounded to a dtype, views over them, and
// tolerances derived from the dtypes' precision.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention_backend.h"

namespace dfa::testing {

// A host tensor [B, rows, H, D] stored in `dtype`, dense.
struct HostTensor {
  DType dtype = DType::kF32;
  int batch = 1, heads = 0, head_dim = 0;
  int64_t rows = 0;
  std::vector<uint8_t> bytes;

  HostTensor() = default;
  HostTensor(DType t, int b, int64_t r, int h, int d)
      : dtype(t),
        batch(b),
        heads(h),
        head_dim(d),
        rows(r),
        bytes(static_cast<size_t>(b) * r * h * d * DTypeSize(t)) {}
  int64_t size() const { return int64_t{batch} * rows * heads * head_dim; }
  TensorView view() {
    TensorView v;
    v.data = bytes.data();
    v.dtype = dtype;
    v.batch = batch;
    v.rows = rows;
    v.heads = heads;
    v.head_dim = head_dim;
    return v;
  }
  float get(int64_t i) const { return LoadAsFloat(bytes.data(), dtype, i); }
  void set(int64_t i, float x) { StoreFromFloat(bytes.data(), dtype, i, x); }
  // Uniform in [-amp, amp], rounded to the dtype.
  void Randomize(std::mt19937& rng, float amp = 1.f) {
    std::uniform_real_distribution<float> u(-amp, amp);
    for (int64_t i = 0; i < size(); ++i) set(i, u(rng));
  }
};

// fp32 per-row statistics [B, H, rows].
struct HostStats {
  std::vector<float> v;
  int batch = 1, heads = 0;
  int64_t rows = 0;
  HostStats() = default;
  HostStats(int b, int h, int64_t r, float init = 0.f)
      : v(static_cast<size_t>(b) * h * r, init), batch(b), heads(h), rows(r) {}
  RowStatView view() {
    RowStatView s;
    s.data = v.data();
    s.batch = batch;
    s.heads = heads;
    s.rows = rows;
    return s;
  }
};

// Unit roundoff of a dtype (half an ulp of 1).
inline double UnitRoundoff(DType t) {
  switch (t) {
    case DType::kF32:
      return std::ldexp(1.0, -24);
    case DType::kBF16:
      return std::ldexp(1.0, -8);
    case DType::kF16:
      return std::ldexp(1.0, -11);
  }
  return 1.0;
}

// Error bound for a value computed in fp32 from `terms` accumulated products whose magnitudes
// sum to about `magnitude`, then stored in `out`: the classic gamma_n bound with sqrt growth
// (random rounding), times a safety factor of 4, plus the final rounding to the output dtype.
// Inputs of the tests are uniform in [-1, 1], so a product x_d y_d has E|x_d y_d| = 1/4: the
// tests pass magnitudes built from that (kMeanAbsProduct), not worst-case bounds.
inline double Fp32Tolerance(int64_t terms, double magnitude, DType out = DType::kF32) {
  const double u32 = UnitRoundoff(DType::kF32);
  return 4.0 * u32 * std::sqrt(static_cast<double>(terms) + 1.0) * magnitude +
         2.0 * UnitRoundoff(out) * magnitude;
}

inline constexpr double kMeanAbsProduct = 0.25;

inline std::string ShapeName(DType t, int hq, int hkv, int d, int64_t m, int64_t n, int64_t q0,
                             int64_t k0, MaskKind mask) {
  return std::string(DTypeName(t)) + " Hq=" + std::to_string(hq) + " Hkv=" + std::to_string(hkv) +
         " D=" + std::to_string(d) + " m=" + std::to_string(m) + " n=" + std::to_string(n) +
         " q0=" + std::to_string(q0) + " k0=" + std::to_string(k0) +
         (mask == MaskKind::kCausal ? " causal" : " full");
}

}  // namespace dfa::testing
