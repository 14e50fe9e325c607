// The fp64 ground truth of one attention unit under a kIntervals mask (tests/gpu/
// mask_intervals_host.h), forward and backward, by the textbook formulas over the visible pairs
// of the per-position intervals: O = softmax(scale Q K^T) V, LSE, and with dO the gradients
// dQ, dK, dV (the unit's own LSE as the final one). Rows that see no key: LSE = -inf, O = 0.
// Dense BSHD layouts as tests/gpu/unit_inputs.h. Also the intervals' device copy for a backend
// under test (UploadIntervals).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "tests/gpu/mask_intervals_host.h"
#include "tests/gpu/unit_inputs.h"

namespace dfa::testing {

inline ReferenceResult MaskedReference(const UnitShape& s, const HostIntervals& iv,
                                       const std::vector<float>& q, const std::vector<float>& k,
                                       const std::vector<float>& v,
                                       const std::vector<float>* dout, float scale) {
  const int D = s.head_dim, group = s.q_heads / s.kv_heads;
  const size_t nq = size_t(s.batch) * s.m * s.q_heads * D;
  const size_t nk = size_t(s.batch) * s.n * s.kv_heads * D;
  ReferenceResult r;
  r.out.assign(nq, 0.0);
  r.lse.assign(size_t(s.batch) * s.q_heads * s.m, -INFINITY);
  if (dout) r.dq.assign(nq, 0.0), r.dk.assign(nk, 0.0), r.dv.assign(nk, 0.0);
  auto qi = [&](int b, int64_t row, int h) { return ((size_t(b) * s.m + row) * s.q_heads + h) * D; };
  auto ki = [&](int b, int64_t row, int h) { return ((size_t(b) * s.n + row) * s.kv_heads + h) * D; };
  std::vector<double> p(size_t(s.n)), dp(size_t(s.n));
  for (int b = 0; b < s.batch; ++b) {
    for (int h = 0; h < s.q_heads; ++h) {
      const int hk = h / group;
      for (int64_t row = 0; row < s.m; ++row) {
        const size_t at = size_t(b * iv.seq + s.q_row0 + row);
        const int64_t lo = std::max<int64_t>(iv.q_lo[at] - s.kv_row0, 0);
        const int64_t hi = std::min<int64_t>(iv.q_hi[at] - s.kv_row0, s.n);
        if (hi <= lo) continue;
        double mx = -INFINITY;
        for (int64_t c = lo; c < hi; ++c) {
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += double(q[qi(b, row, h) + d]) * k[ki(b, c, hk) + d];
          p[c] = dot * scale;
          mx = std::max(mx, p[c]);
        }
        double sum = 0;
        for (int64_t c = lo; c < hi; ++c) sum += (p[c] = std::exp(p[c] - mx));
        const double lse = mx + std::log(sum);
        r.lse[(size_t(b) * s.q_heads + h) * s.m + row] = lse;
        for (int64_t c = lo; c < hi; ++c) {
          p[c] /= sum;
          for (int d = 0; d < D; ++d) r.out[qi(b, row, h) + d] += p[c] * v[ki(b, c, hk) + d];
        }
        if (!dout) continue;
        // dP = dO V^T, Delta = rowsum(dO o O), dS = P (dP - Delta).
        double delta = 0;
        for (int d = 0; d < D; ++d) delta += double((*dout)[qi(b, row, h) + d]) * r.out[qi(b, row, h) + d];
        for (int64_t c = lo; c < hi; ++c) {
          double x = 0;
          for (int d = 0; d < D; ++d) x += double((*dout)[qi(b, row, h) + d]) * v[ki(b, c, hk) + d];
          dp[c] = p[c] * (x - delta);
        }
        for (int64_t c = lo; c < hi; ++c) {
          for (int d = 0; d < D; ++d) {
            r.dq[qi(b, row, h) + d] += scale * dp[c] * k[ki(b, c, hk) + d];
            r.dk[ki(b, c, hk) + d] += scale * dp[c] * q[qi(b, row, h) + d];
            r.dv[ki(b, c, hk) + d] += p[c] * (*dout)[qi(b, row, h) + d];
          }
        }
      }
    }
  }
  return r;
}

// The four interval arrays of `iv` copied to device memory by `upload(host, bytes)` (the test
// fixture's allocating copy, returning the device pointer), as the backends' MaskIntervals.
template <typename UploadFn>
MaskIntervals UploadIntervals(const HostIntervals& iv, UploadFn&& upload) {
  MaskIntervals d;
  const size_t bytes = iv.q_lo.size() * sizeof(int32_t);
  d.q_lo = static_cast<const int32_t*>(upload(iv.q_lo.data(), bytes));
  d.q_hi = static_cast<const int32_t*>(upload(iv.q_hi.data(), bytes));
  d.k_lo = static_cast<const int32_t*>(upload(iv.k_lo.data(), bytes));
  d.k_hi = static_cast<const int32_t*>(upload(iv.k_hi.data(), bytes));
  d.seq = iv.seq;
  return d;
}

}  // namespace dfa::testing
