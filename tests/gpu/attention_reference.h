// Host-side helpers for the GPU kernel tests and tools: seeded random tensors rounded to a
// dtype, and an fp64 reference of one attention unit (forward and backward) at global offsets
// with GQA. Dense BSHD layouts; stats are BHS. Slow and simple on purpose.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/attention_backend.h"

namespace dfa::testing {

struct UnitShape {
  DType dtype = DType::kBF16;
  int batch = 1, q_heads = 4, kv_heads = 4, head_dim = 128;
  int64_t m = 128, n = 128, q_row0 = 0, kv_row0 = 0;
  MaskKind mask = MaskKind::kCausal;
};

// Values in [-1, 1) rounded to `dtype`; returns the rounded values as float and the raw bits.
inline std::vector<float> RandomRounded(size_t count, DType dtype, uint64_t seed,
                                        std::vector<uint16_t>* bits) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> vals(count);
  bits->resize(count);
  for (size_t i = 0; i < count; ++i) {
    const float x = dist(rng);
    const uint16_t b = dtype == DType::kBF16 ? FloatToBF16(x) : FloatToHalf(x);
    (*bits)[i] = b;
    vals[i] = dtype == DType::kBF16 ? BF16ToFloat(b) : HalfToFloat(b);
  }
  return vals;
}

struct ReferenceResult {
  std::vector<double> out, lse;      // [B, m, Hq, D], [B, Hq, m]
  std::vector<double> dq, dk, dv;    // filled by the backward reference
};

inline bool Visible(const UnitShape& s, int64_t i, int64_t j) {
  return s.mask == MaskKind::kFull || s.kv_row0 + j <= s.q_row0 + i;
}

// Forward (and, when dout is non-null, backward with the unit's own LSE as the final one).
inline ReferenceResult ReferenceAttention(const UnitShape& s, const std::vector<float>& q,
                                          const std::vector<float>& k, const std::vector<float>& v,
                                          const std::vector<float>* dout, float scale) {
  const int D = s.head_dim, Hq = s.q_heads, Hk = s.kv_heads, G = Hq / Hk;
  ReferenceResult r;
  r.out.assign(q.size(), 0.0);
  r.lse.assign(size_t(s.batch) * Hq * s.m, -INFINITY);
  if (dout) {
    r.dq.assign(q.size(), 0.0);
    r.dk.assign(k.size(), 0.0);
    r.dv.assign(v.size(), 0.0);
  }
  std::vector<double> p(s.n), dp(s.n);
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < Hq; ++h) {
      const int hk = h / G;
      for (int64_t i = 0; i < s.m; ++i) {
        const float* qi = &q[((b * s.m + i) * Hq + h) * D];
        double mx = -INFINITY;
        for (int64_t j = 0; j < s.n; ++j) {
          if (!Visible(s, i, j)) {
            p[j] = -INFINITY;
            continue;
          }
          const float* kj = &k[((b * s.n + j) * Hk + hk) * D];
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += double(qi[d]) * kj[d];
          p[j] = dot * scale;
          mx = std::max(mx, p[j]);
        }
        if (mx == -INFINITY) continue;  // no visible key: out 0, lse -inf, no gradient
        double sum = 0;
        for (int64_t j = 0; j < s.n; ++j) sum += p[j] == -INFINITY ? 0 : std::exp(p[j] - mx);
        const double lse = mx + std::log(sum);
        r.lse[(b * Hq + h) * s.m + i] = lse;
        double* oi = &r.out[((b * s.m + i) * Hq + h) * D];
        for (int64_t j = 0; j < s.n; ++j) {
          p[j] = p[j] == -INFINITY ? 0 : std::exp(p[j] - lse);
          if (p[j] == 0) continue;
          const float* vj = &v[((b * s.n + j) * Hk + hk) * D];
          for (int d = 0; d < D; ++d) oi[d] += p[j] * vj[d];
        }
        if (!dout) continue;
        const float* doi = &(*dout)[((b * s.m + i) * Hq + h) * D];
        double delta = 0;
        for (int d = 0; d < D; ++d) delta += double(doi[d]) * oi[d];
        for (int64_t j = 0; j < s.n; ++j) {
          if (p[j] == 0) continue;
          const float* vj = &v[((b * s.n + j) * Hk + hk) * D];
          double dpj = 0;
          for (int d = 0; d < D; ++d) dpj += double(doi[d]) * vj[d];
          const double ds = p[j] * (dpj - delta) * scale;
          const float* kj = &k[((b * s.n + j) * Hk + hk) * D];
          double* dqi = &r.dq[((b * s.m + i) * Hq + h) * D];
          double* dkj = &r.dk[((b * s.n + j) * Hk + hk) * D];
          double* dvj = &r.dv[((b * s.n + j) * Hk + hk) * D];
          for (int d = 0; d < D; ++d) {
            dqi[d] += ds * kj[d];
            dkj[d] += ds * qi[d];
            dvj[d] += p[j] * doi[d];
          }
        }
      }
    }
  return r;
}

// ||a - ref|| / ||ref|| over finite reference entries (1 when a has a NaN).
inline double RelError(const std::vector<float>& a, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(ref[i])) continue;
    if (!std::isfinite(a[i])) return 1.0;
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Unit roundoff of a storage dtype.
inline double Eps(DType t) { return t == DType::kBF16 ? 1.0 / 256 : t == DType::kF16 ? 1.0 / 2048 : 1e-7; }

// Seeded inputs of a unit, fp32 values rounded to s.dtype (and their 16-bit bits).
struct Inputs {
  std::vector<float> q, k, v, dout;
  std::vector<uint16_t> qb, kb, vb, dob;
};

inline Inputs MakeInputs(const UnitShape& s, uint64_t seed) {
  Inputs in;
  const size_t nq = size_t(s.batch) * s.m * s.q_heads * s.head_dim;
  const size_t nk = size_t(s.batch) * s.n * s.kv_heads * s.head_dim;
  in.q = RandomRounded(nq, s.dtype, seed, &in.qb);
  in.k = RandomRounded(nk, s.dtype, seed + 1, &in.kb);
  in.v = RandomRounded(nk, s.dtype, seed + 2, &in.vb);
  in.dout = RandomRounded(nq, s.dtype, seed + 3, &in.dob);
  return in;
}

inline TensorView View(void* data, DType t, const UnitShape& s, bool kv) {
  TensorView v;
  v.data = data;
  v.dtype = t;
  v.batch = s.batch;
  v.rows = kv ? s.n : s.m;
  v.heads = kv ? s.kv_heads : s.q_heads;
  v.head_dim = s.head_dim;
  return v;
}
inline RowStatView Stat(float* data, const UnitShape& s) {
  RowStatView r;
  r.data = data;
  r.batch = s.batch;
  r.heads = s.q_heads;
  r.rows = s.m;
  return r;
}

}  // namespace dfa::testing
