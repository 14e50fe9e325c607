// dfa-mask-tile-stats: how well the kernels' tiles fit the masks of `dfa-cuda-kernel-bench
// --masks`, counted on the host with the kernels' own tile-range code (kernels/cuda/
// mask_tiles.cuh): per mask and S, the share of computed scores that are visible ("tile eff":
// visible pairs / scores of the walked blocks; the ceiling of the kernels' "x dense"), and the
// key blocks per forward CTA (128 query rows x 128-key blocks, the TMA forward at head dim 128)
// and query blocks per backward CTA (128 keys x 64-row blocks, the pipe backward).
//   dfa-mask-tile-stats [S...]   (default 65536 262144)
// Needs no GPU. Prints a markdown table.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/cuda/mask_tiles.cuh"
#include "tests/gpu/mask_intervals_host.h"

namespace {

using dfa::cuda::IntervalParams;
using dfa::testing::HostIntervals;
using dfa::testing::HostMask;

void Row(const std::string& name, const HostMask& mask, int64_t s) {
  const HostIntervals h = dfa::testing::BuildIntervals(mask, 1, s);
  IntervalParams iv;
  iv.q_lo = h.q_lo.data(), iv.q_hi = h.q_hi.data(), iv.k_lo = h.k_lo.data(), iv.k_hi = h.k_hi.data();
  iv.seq = s, iv.on = true;
  const double pairs = double(dfa::testing::VisiblePairsOf(h, 0, 0, s, 0, s));
  double fwd = 0, bwd = 0, fwd_max = 0, bwd_max = 0, fwd_ctas = 0, bwd_ctas = 0;
  for (int64_t m0 = 0; m0 < s; m0 += 128, ++fwd_ctas) {
    const auto r = dfa::cuda::IvKeyBlocks(iv, 0, m0, std::min(s, m0 + 128) - 1, 0, s, 128);
    fwd += r.count;
    fwd_max = std::max(fwd_max, double(r.count));
  }
  for (int64_t n0 = 0; n0 < s; n0 += 128, ++bwd_ctas) {
    const auto r = dfa::cuda::IvQueryBlocks(iv, 0, n0, std::min(s, n0 + 128) - 1, 0, s, 64);
    bwd += r.end - r.first;
    bwd_max = std::max(bwd_max, double(r.end - r.first));
  }
  std::printf("| %lldK | %s | %.3g | %.3f | %.1f | %.0f | %.3f | %.1f | %.0f |\n",
              static_cast<long long>(s / 1024), name.c_str(), pairs, pairs / (fwd * 128 * 128),
              fwd / fwd_ctas, fwd_max, pairs / (bwd * 128 * 64), bwd / bwd_ctas, bwd_max);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> lengths;
  for (int i = 1; i < argc; ++i) {
    char* end = nullptr;
    const long long s = std::strtoll(argv[i], &end, 10);
    if (*end != '\0' || s < 128 || s > (1LL << 30)) {
      std::fprintf(stderr, "dfa-mask-tile-stats: bad sequence length '%s' (128 .. 2^30)\n", argv[i]);
      return 2;
    }
    lengths.push_back(s);
  }
  if (lengths.empty()) lengths = {65536, 262144};
  std::printf("| S | mask | visible pairs | fwd tile eff | fwd blocks / CTA | max | bwd tile eff | "
              "bwd blocks / CTA | max |\n|---|---|---|---|---|---|---|---|---|\n");
  for (int64_t s : lengths) {
    HostMask dense;
    dense.causal = true;
    dense.docs = {{0, s}};
    Row("dense causal", dense, s);
    HostMask varlen = dense;  // the bench's documents (same generator and seed)
    varlen.docs = {dfa::testing::ParetoDocOffsets(s, 1.2, 256, 65536, 20)};
    Row("varlen causal (" + std::to_string(varlen.docs[0].size() - 1) + " docs)", varlen, s);
    for (int64_t w : {4096, 32768}) {
      HostMask win = dense;
      win.left = w;
      Row("causal window " + std::to_string(w / 1024) + "K", win, s);
    }
  }
  return 0;
}
