#include "worker/synthetic_inputs.h"

namespace dfa {
namespace {

// SplitMix64's finaliser: a bijective mix with full avalanche.
inline uint64_t Mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline float ToUniform(uint64_t h) {
  return static_cast<float>(static_cast<double>(h >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

inline uint64_t RowKey(uint64_t seed, int kind, int64_t batch, int64_t row) {
  uint64_t k = Mix(seed ^ (static_cast<uint64_t>(kind) << 56));
  k = Mix(k ^ static_cast<uint64_t>(batch));
  return Mix(k ^ static_cast<uint64_t>(row));
}

}  // namespace

float SyntheticValue(uint64_t seed, int kind, int64_t batch, int64_t row, int64_t head,
                     int64_t d) {
  const uint64_t key = RowKey(seed, kind, batch, row);
  return ToUniform(Mix(key ^ ((static_cast<uint64_t>(head) << 32) | static_cast<uint64_t>(d))));
}

void FillSynthetic(uint64_t seed, int kind, int batch, int64_t row0, int64_t n_rows, int head0,
                   int heads, int head_dim, DType dtype, void* dst) {
  int64_t i = 0;
  for (int b = 0; b < batch; ++b) {
    for (int64_t r = row0; r < row0 + n_rows; ++r) {
      const uint64_t key = RowKey(seed, kind, b, r);
      for (int h = head0; h < head0 + heads; ++h) {
        for (int d = 0; d < head_dim; ++d, ++i) {
          const uint64_t hd = (static_cast<uint64_t>(h) << 32) | static_cast<uint64_t>(d);
          StoreFromFloat(dst, dtype, i, ToUniform(Mix(key ^ hd)));
        }
      }
    }
  }
}

void FillSynthetic(uint64_t seed, int kind, int batch, int64_t row0, int64_t n_rows, int heads,
                   int head_dim, DType dtype, void* dst) {
  FillSynthetic(seed, kind, batch, row0, n_rows, /*head0=*/0, heads, head_dim, dtype, dst);
}

}  // namespace dfa
