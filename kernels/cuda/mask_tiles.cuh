// The kIntervals mask (IntervalParams, flash_params.h) at tile granularity, shared by the
// forward and backward kernels: which key blocks a query tile visits (forward) and which query
// blocks a key tile visits (backward), and which of those need the per-element mask. Because lo
// and hi are non-decreasing in the position, a tile's visible range comes from its first and last
// rows alone: rows [r0, r_last] see keys [q_lo[r0], q_hi[r_last]) between them, and a key block
// [c0, c1) is visible to every row iff q_lo[r_last] <= c0 and c1 <= q_hi[r0]. The blocks that
// are not fully visible form a run at each end of the range ("top": the last blocks, "bottom":
// the first), so a kernel walking the range from the last block to the first masks iterations
// [0, top) and [count - bottom, count) and runs the rest unmasked, as dense blocks.
#pragma once

#include <cstdint>

#include "kernels/cuda/flash_params.h"

namespace dfa::cuda {

__host__ __device__ inline int64_t IvFloorDiv(int64_t a, int64_t b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}
__host__ __device__ inline int64_t IvClamp(int64_t x, int64_t lo, int64_t hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

// The key blocks (of block_n unit-local key rows, n keys in all) that the query rows
// [r0, r_last] (global positions, r_last inclusive) of batch row b visit: blocks
// [first, first + count), of which the last `top` and the first `bottom` need the mask.
struct IvBlockRange {
  int first = 0, count = 0, top = 0, bottom = 0;
};
__host__ __device__ inline IvBlockRange IvKeyBlocks(const IntervalParams& iv, int b, int64_t r0,
                                           int64_t r_last, int64_t kv_row0, int64_t n,
                                           int block_n) {
  const int64_t base = int64_t{b} * iv.seq;
  const int64_t lo_any = iv.q_lo[base + r0] - kv_row0;  // the smallest lo of the tile
  int64_t hi_any = iv.q_hi[base + r_last] - kv_row0;    // the largest hi
  const int64_t lo_all = iv.q_lo[base + r_last] - kv_row0;
  int64_t hi_all = iv.q_hi[base + r0] - kv_row0;
  hi_any = hi_any < n ? hi_any : n;
  hi_all = hi_all < n ? hi_all : n;  // keys past the unit need the mask too
  const int64_t c_lo = lo_any > 0 ? lo_any : 0;
  IvBlockRange r;
  if (hi_any <= c_lo) return r;
  const int64_t first = c_lo / block_n, end = (hi_any + block_n - 1) / block_n;
  r.first = static_cast<int>(first);
  r.count = static_cast<int>(end - first);
  // Block j reaches past some row's hi iff (j + 1) * block_n > hi_all; it starts before some
  // row's lo iff j * block_n < lo_all.
  const int64_t j_top = IvFloorDiv(hi_all, block_n);
  r.top = static_cast<int>(IvClamp(end - (j_top > first ? j_top : first), 0, r.count));
  r.bottom = static_cast<int>(IvClamp(IvFloorDiv(lo_all + block_n - 1, block_n) - first, 0, r.count));
  return r;
}

// The query blocks (of block_m unit-local query rows, m rows in all) that the key rows
// [c0, c_last] (global positions) of batch row b are seen by: blocks [first, end). `lo_all` and
// `hi_all` (unit-local query rows) give the fully visible test of one query block:
// IvQueryBlockFull.
struct IvQueryRange {
  int first = 0, end = 0;
  int64_t lo_all = 0, hi_all = 0;
};
__host__ __device__ inline IvQueryRange IvQueryBlocks(const IntervalParams& iv, int b, int64_t c0,
                                             int64_t c_last, int64_t q_row0, int64_t m,
                                             int block_m) {
  const int64_t base = int64_t{b} * iv.seq;
  const int64_t lo_any = iv.k_lo[base + c0] - q_row0;
  int64_t hi_any = iv.k_hi[base + c_last] - q_row0;
  hi_any = hi_any < m ? hi_any : m;
  const int64_t r_lo = lo_any > 0 ? lo_any : 0;
  IvQueryRange r;
  r.lo_all = iv.k_lo[base + c_last] - q_row0;
  r.hi_all = iv.k_hi[base + c0] - q_row0;
  if (hi_any <= r_lo) return r;
  r.first = static_cast<int>(r_lo / block_m);
  r.end = static_cast<int>((hi_any + block_m - 1) / block_m);
  return r;
}
// True when every key of the tile sees every query row of [m_begin, m_begin + block_m) (rows
// past m count as visible: their P is 0 by their LSE of +inf).
__host__ __device__ inline bool IvQueryBlockFull(const IvQueryRange& r, int64_t m_begin, int block_m,
                                        int64_t m) {
  const int64_t m_end = m_begin + block_m < m ? m_begin + block_m : m;
  return r.lo_all <= m_begin && r.hi_all >= m_end;
}

// Per-row (forward: a query's keys, unit-local) or per-key (backward: a key's queries,
// unit-local) visible interval [lo, hi), clamped to int range; an index past the unit's rows
// (`valid` false) gets the empty interval.
struct IvRow {
  int lo = 0, hi = 0;
};
__host__ __device__ inline IvRow IvQueryRow(const IntervalParams& iv, int b, int64_t q_pos, int64_t kv_row0,
                                   int64_t n, bool valid) {
  IvRow r;
  if (!valid) return r;
  const int64_t base = int64_t{b} * iv.seq;
  const int64_t lo = iv.q_lo[base + q_pos] - kv_row0, hi = iv.q_hi[base + q_pos] - kv_row0;
  r.lo = static_cast<int>(IvClamp(lo, 0, n));
  r.hi = static_cast<int>(IvClamp(hi, 0, n));
  return r;
}
__host__ __device__ inline IvRow IvKeyRow(const IntervalParams& iv, int b, int64_t k_pos, int64_t q_row0,
                                 int64_t m, bool valid) {
  IvRow r;
  if (!valid) return r;
  const int64_t base = int64_t{b} * iv.seq;
  const int64_t lo = iv.k_lo[base + k_pos] - q_row0, hi = iv.k_hi[base + k_pos] - q_row0;
  r.lo = static_cast<int>(IvClamp(lo, 0, m));
  r.hi = static_cast<int>(IvClamp(hi, 0, m));
  return r;
}

}  // namespace dfa::cuda
