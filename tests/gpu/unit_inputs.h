// Host-side helpers for the GPU kernel tests and tools: the shape of one attention unit, seeded
// random tensors rounded to a dtype, dense views of them, and the fp64 ground truth of the unit
// (forward and backward) from kernels/reference (dfa_reference). Dense BSHD layouts; stats BHS.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <utility>
#include <vector>

#include "kernels/attention_backend.h"
#include "kernels/reference/reference_attention.h"

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

struct ReferenceResult {
  std::vector<double> out, lse;    // [B, m, Hq, D], [B, Hq, m]
  std::vector<double> dq, dk, dv;  // filled when dout is given
};

// The unit's fp64 forward (and, when dout is non-null, backward with the unit's own LSE as the
// final one) by dfa::reference, on the given (already rounded) fp32 values. A failure of the
// reference (a malformed shape in a test) aborts: there is nothing to compare against.
inline ReferenceResult ReferenceAttention(const UnitShape& s, const std::vector<float>& q,
                                          const std::vector<float>& k, const std::vector<float>& v,
                                          const std::vector<float>* dout, float scale) {
  reference::Problem p;
  p.q = View(const_cast<float*>(q.data()), DType::kF32, s, false);
  p.k = View(const_cast<float*>(k.data()), DType::kF32, s, true);
  p.v = View(const_cast<float*>(v.data()), DType::kF32, s, true);
  p.q_row0 = s.q_row0;
  p.kv_row0 = s.kv_row0;
  p.mask = s.mask;
  p.scale = scale;
  auto fwd = reference::Forward(p);
  if (!fwd.ok()) {
    std::fprintf(stderr, "reference forward: %s\n", fwd.status().ToString().c_str());
    std::abort();
  }
  ReferenceResult r;
  r.out = std::move(fwd->out);
  r.lse = std::move(fwd->lse);
  if (dout != nullptr) {
    auto grads =
        reference::Backward(p, View(const_cast<float*>(dout->data()), DType::kF32, s, false));
    if (!grads.ok()) {
      std::fprintf(stderr, "reference backward: %s\n", grads.status().ToString().c_str());
      std::abort();
    }
    r.dq = std::move(grads->dq);
    r.dk = std::move(grads->dk);
    r.dv = std::move(grads->dv);
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

}  // namespace dfa::testing
