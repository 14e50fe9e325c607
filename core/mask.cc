#include "core/mask.h"

#include <algorithm>

namespace dfa {

int64_t VisiblePairs(int64_t q_row0, int64_t m, int64_t kv_row0, int64_t n, MaskKind mask) {
  if (m <= 0 || n <= 0) return 0;
  if (mask == MaskKind::kFull) return m * n;
  // Query i (global) sees keys j in [kv_row0, min(i, kv_row0 + n - 1)].
  int64_t total = 0;
  const int64_t kv_end = kv_row0 + n;
  // Rows with i < kv_row0 see nothing; rows with i >= kv_end - 1 see all n.
  const int64_t full_from = std::max(q_row0, kv_end - 1);
  const int64_t q_end = q_row0 + m;
  if (q_end > full_from) total += (q_end - full_from) * n;
  const int64_t partial_begin = std::max(q_row0, kv_row0);
  const int64_t partial_end = std::min(q_end, full_from);
  if (partial_end > partial_begin) {
    // sum over i in [a, b) of (i - kv_row0 + 1)
    const int64_t a = partial_begin - kv_row0 + 1, b = partial_end - kv_row0;  // inclusive
    total += (a + b) * (b - a + 1) / 2;
  }
  return total;
}

double ForwardFlops(int batch, int q_heads, int head_dim, int64_t q_row0, int64_t m,
                    int64_t kv_row0, int64_t n, MaskKind mask) {
  // A causal square counts exactly half of the full one (4·B·H·S²·D / 2).
  const double pairs = mask == MaskKind::kFull
                           ? static_cast<double>(m) * static_cast<double>(n)
                           : static_cast<double>(VisiblePairs(q_row0, m, kv_row0, n, mask));
  return 4.0 * batch * q_heads * head_dim * pairs;
}

}  // namespace dfa
