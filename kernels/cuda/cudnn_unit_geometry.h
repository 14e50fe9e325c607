// How one attention unit at global offsets maps onto a single cuDNN SDPA call.
//
// A unit is "query rows [q_row0, q_row0 + m) attend to key rows [kv_row0, kv_row0 + n)" under
// the global causal rule (query i sees key j iff j <= i) or with no mask. cuDNN only knows masks
// relative to the local tile, so the unit is reduced to:
//   - `empty_rows` leading query rows that see no key at all (LSE = -inf, output 0); cuDNN never
//     sees them, so it is never asked for a row with nothing visible (which it leaves undefined);
//   - query rows [row0, row0 + rows) with keys [0, kv_rows) (trailing keys no row can see are
//     dropped), where local row r sees local key c iff c <= r + right_bound, or every key when
//     right_bound < 0. right_bound == 0 is the ordinary top-left causal mask; right_bound > 0 is
//     cuDNN's diagonal band with TOP_LEFT alignment and that right bound.
// Pure arithmetic, no CUDA: tested on the CPU (tests/gpu/cudnn_unit_geometry_test.cc).
#pragma once

#include <algorithm>
#include <cstdint>

namespace dfa::cudnn {

struct UnitGeometry {
  int64_t empty_rows = 0;    // leading rows that see nothing
  int64_t row0 = 0;          // first row handed to cuDNN (== empty_rows)
  int64_t rows = 0;          // rows handed to cuDNN (0: the whole unit is masked out)
  int64_t kv_rows = 0;       // keys handed to cuDNN, always a prefix [0, kv_rows)
  int64_t right_bound = -1;  // -1: no mask; >= 0: c <= r + right_bound (local coordinates)
};

// `causal` false means every query row sees every key. m, n >= 1; offsets >= 0.
inline UnitGeometry PlanUnit(int64_t q_row0, int64_t m, int64_t kv_row0, int64_t n, bool causal) {
  UnitGeometry g;
  if (!causal) {
    g.rows = m;
    g.kv_rows = n;
    return g;
  }
  const int64_t off = q_row0 - kv_row0;  // local row r sees local key c iff c <= r + off
  g.empty_rows = std::clamp<int64_t>(-off, 0, m);
  g.row0 = g.empty_rows;
  g.rows = m - g.empty_rows;
  if (g.rows == 0) return g;
  const int64_t bound = off + g.empty_rows;  // >= 0 for the first remaining row
  g.kv_rows = std::min(n, bound + g.rows);   // the last row sees keys up to rows - 1 + bound
  g.right_bound = bound >= g.kv_rows - 1 ? -1 : bound;
  return g;
}

}  // namespace dfa::cudnn
