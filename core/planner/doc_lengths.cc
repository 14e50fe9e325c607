#include "core/planner/doc_lengths.h"

#include <algorithm>
#include <cmath>

namespace dfa {
namespace {

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

std::vector<int64_t> ParetoDocumentLengths(int64_t seq_len, double alpha, double xm, int64_t cap,
                                           uint64_t seed) {
  std::vector<int64_t> out;
  if (seq_len < 1) return out;
  cap = std::max<int64_t>(1, cap);
  xm = std::clamp(xm, 1.0, static_cast<double>(cap));
  if (!(alpha > 0)) alpha = 1;
  uint64_t state = seed;
  int64_t left = seq_len;
  while (left > 0) {
    // u in (0, 1]: 53 random bits, never 0.
    const double u = static_cast<double>((SplitMix64(state) >> 11) + 1) * 0x1.0p-53;
    const double x = std::floor(xm / std::pow(u, 1.0 / alpha));
    const int64_t len = std::min({static_cast<int64_t>(std::min(x, 1e18)), cap, left});
    out.push_back(std::max<int64_t>(1, len));
    left -= out.back();
  }
  return out;
}

std::vector<int64_t> DocOffsetsOf(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> off = {0};
  for (int64_t l : lengths) off.push_back(off.back() + l);
  return off;
}

}  // namespace dfa
