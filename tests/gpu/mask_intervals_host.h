// Host-side kIntervals masks for the GPU kernel tests and benchmarks: a document / window mask
// (the rule of core/mask.h MaskSpec), its per-position visible intervals in closed form (the
// four arrays of kernels/attention_backend.h MaskIntervals), the same by brute force over every
// pair (the tests check the two against each other), visible-pair counts, and the long-tailed
// document lengths of the benchmarks. Self-contained so that the kernel tests do not wait on
// core/mask.cc.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace dfa::testing {

// Query i sees key j iff both lie in one document of the batch row, (!causal || j <= i),
// (left < 0 || j >= i - left) and (right < 0 || j <= i + right).
struct HostMask {
  bool causal = false;
  int64_t left = -1, right = -1;
  // Per batch row: cumulative document offsets {0, ..., seq}; one entry serves every row.
  std::vector<std::vector<int64_t>> docs;

  const std::vector<int64_t>& Docs(int b) const { return docs.size() == 1 ? docs[0] : docs[b]; }
  // [d0, d1) of the document holding position p.
  void DocOf(int b, int64_t p, int64_t* d0, int64_t* d1) const {
    const auto& o = Docs(b);
    const auto it = std::upper_bound(o.begin(), o.end(), p);
    *d0 = *(it - 1);
    *d1 = *it;
  }
  bool Visible(int b, int64_t i, int64_t j) const {
    int64_t a0, a1, b0, b1;
    DocOf(b, i, &a0, &a1);
    DocOf(b, j, &b0, &b1);
    return a0 == b0 && (!causal || j <= i) && (left < 0 || j >= i - left) &&
           (right < 0 || j <= i + right);
  }
};

// The four int32 arrays of [batch * seq] (b * seq + p).
struct HostIntervals {
  int64_t seq = 0;
  std::vector<int32_t> q_lo, q_hi, k_lo, k_hi;
};

// Closed form per document: the keys of query i are [max(d0, i - left), min(d1, i + 1 (causal),
// i + right + 1)); the queries of key j are [max(d0, j (causal), j - right), min(d1, j + left + 1)).
// Empty intervals are written as [lo, lo).
inline HostIntervals BuildIntervals(const HostMask& mask, int batch, int64_t seq) {
  HostIntervals iv;
  iv.seq = seq;
  const size_t total = static_cast<size_t>(batch) * static_cast<size_t>(seq);
  iv.q_lo.resize(total), iv.q_hi.resize(total), iv.k_lo.resize(total), iv.k_hi.resize(total);
  for (int b = 0; b < batch; ++b) {
    const auto& o = mask.Docs(b);
    for (size_t d = 0; d + 1 < o.size(); ++d) {
      const int64_t d0 = o[d], d1 = o[d + 1];
      for (int64_t p = d0; p < d1; ++p) {
        int64_t lo = d0, hi = d1;
        if (mask.left >= 0) lo = std::max(lo, p - mask.left);
        if (mask.causal) hi = std::min(hi, p + 1);
        if (mask.right >= 0) hi = std::min(hi, p + mask.right + 1);
        const size_t at = static_cast<size_t>(b * seq + p);
        iv.q_lo[at] = static_cast<int32_t>(lo);
        iv.q_hi[at] = static_cast<int32_t>(std::max(lo, hi));
        lo = d0, hi = d1;
        if (mask.causal) lo = std::max(lo, p);
        if (mask.right >= 0) lo = std::max(lo, p - mask.right);
        if (mask.left >= 0) hi = std::min(hi, p + mask.left + 1);
        iv.k_lo[at] = static_cast<int32_t>(lo);
        iv.k_hi[at] = static_cast<int32_t>(std::max(lo, hi));
      }
    }
  }
  return iv;
}

// The same from Visible() over every pair (small seq only). Returns false when some row's or
// column's visible set is not one interval (the mask model promises it always is).
inline bool BuildIntervalsBruteForce(const HostMask& mask, int batch, int64_t seq,
                                     HostIntervals* iv) {
  iv->seq = seq;
  const size_t total = static_cast<size_t>(batch) * static_cast<size_t>(seq);
  iv->q_lo.assign(total, 0), iv->q_hi.assign(total, 0);
  iv->k_lo.assign(total, 0), iv->k_hi.assign(total, 0);
  for (int b = 0; b < batch; ++b) {
    for (int64_t x = 0; x < seq; ++x) {
      for (int pass = 0; pass < 2; ++pass) {  // 0: keys of query x, 1: queries of key x
        int64_t lo = -1, hi = -1, count = 0;
        for (int64_t y = 0; y < seq; ++y) {
          if (!(pass == 0 ? mask.Visible(b, x, y) : mask.Visible(b, y, x))) continue;
          if (lo < 0) lo = y;
          hi = y + 1;
          ++count;
        }
        if (count != hi - lo && count > 0) return false;
        const size_t at = static_cast<size_t>(b * seq + x);
        auto& out_lo = pass == 0 ? iv->q_lo : iv->k_lo;
        auto& out_hi = pass == 0 ? iv->q_hi : iv->k_hi;
        out_lo[at] = static_cast<int32_t>(count > 0 ? lo : 0);
        out_hi[at] = static_cast<int32_t>(count > 0 ? hi : 0);
      }
    }
  }
  return true;
}

// Visible pairs of queries [q0, q0 + m) x keys [k0, k0 + n) of batch row b.
inline int64_t VisiblePairsOf(const HostIntervals& iv, int b, int64_t q0, int64_t m, int64_t k0,
                              int64_t n) {
  int64_t pairs = 0;
  for (int64_t i = q0; i < q0 + m; ++i) {
    const size_t at = static_cast<size_t>(b * iv.seq + i);
    const int64_t lo = std::max<int64_t>(iv.q_lo[at], k0);
    const int64_t hi = std::min<int64_t>(iv.q_hi[at], k0 + n);
    if (hi > lo) pairs += hi - lo;
  }
  return pairs;
}

// Document offsets {0, ..., total} with lengths from a Pareto distribution (shape alpha, scale
// x_min tokens: P(L > x) = (x_min / x)^alpha), each capped at `cap`, the last one cut to fit;
// fixed seed.
inline std::vector<int64_t> ParetoDocOffsets(int64_t total, double alpha, double x_min,
                                             int64_t cap, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<int64_t> o{0};
  while (o.back() < total) {
    const double x = x_min / std::pow(1.0 - u(rng), 1.0 / alpha);
    int64_t len = std::max<int64_t>(1, static_cast<int64_t>(x));
    len = std::min({len, cap, total - o.back()});
    o.push_back(o.back() + len);
  }
  return o;
}

}  // namespace dfa::testing
