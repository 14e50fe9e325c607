// The attention mask and what it lets through: which (query, key) pairs of a unit are visible,
// and the FLOPs that the visible pairs cost. Positions are global token positions.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace dfa {

// kFull: every query sees every key. kCausal: query position i sees key position j iff j <= i.
// kIntervals: any MaskSpec (documents, windows); a kernel reads each row's visible interval
// from MaskIntervals (kernels/attention_backend.h).
enum class MaskKind : int { kFull = 0, kCausal = 1, kIntervals = 2 };

// A job's whole mask: causal or not, an optional sliding window and, per batch row, packed
// documents. Query position i sees key position j (both global positions in [0, seq)) iff
//   doc(j) == doc(i)
//   and (!causal || j <= i)
//   and (window_left  < 0 || j >= i - window_left)
//   and (window_right < 0 || j <= i + window_right)
// so the keys one query sees form one interval [lo(i), hi(i)) with lo and hi non-decreasing in
// i, and likewise the queries that see one key. Every kernel and the planner work from these
// intervals; a row may see nothing (hi <= lo: LSE = -inf, output 0).
struct MaskSpec {
  bool causal = false;
  int64_t window_left = -1;   // tokens to the left a query sees; -1: unbounded
  int64_t window_right = -1;  // tokens to the right; -1: unbounded (causal caps it at 0)
  // Packed documents, flash-attn's cu_seqlens: doc_offsets[b] = {0, o_1, ..., seq}, strictly
  // increasing, for batch row b. Empty: one document per row. One entry: every row the same.
  std::vector<std::vector<int64_t>> doc_offsets;

  // No documents and no window: kFull or kCausal describes it exactly.
  bool IsDense() const;
  // kFull / kCausal when IsDense(), else kIntervals.
  MaskKind Kind() const;
  // The offsets of batch row b (empty: one document).
  const std::vector<int64_t>& OffsetsOf(int b) const;
};

// Checks a MaskSpec against a sequence of `seq` tokens and `batch` rows: offsets start at 0,
// end at seq, strictly increase, at most one entry or `batch` entries, window >= -1.
// INVALID_ARGUMENT naming the field (e.g. "doc_offsets[1][3]") otherwise.
absl::Status ValidateMask(const MaskSpec& mask, int batch, int64_t seq);

// [lo, hi) of global positions.
struct PositionInterval {
  int64_t lo = 0;
  int64_t hi = 0;
  int64_t size() const { return hi > lo ? hi - lo : 0; }
};

// The keys query position i of batch row b sees, and the queries that see key position j.
PositionInterval VisibleKeys(const MaskSpec& mask, int b, int64_t seq, int64_t i);
PositionInterval VisibleQueries(const MaskSpec& mask, int b, int64_t seq, int64_t j);

// The four per-position interval arrays a kernel reads for MaskKind::kIntervals, each
// [batch * seq] int32 (b * seq + p): q_lo/q_hi from VisibleKeys, k_lo/k_hi from VisibleQueries.
struct MaskIntervalArrays {
  int64_t seq = 0;
  std::vector<int32_t> q_lo, q_hi, k_lo, k_hi;
};
MaskIntervalArrays BuildMaskIntervals(const MaskSpec& mask, int batch, int64_t seq);

// Visible pairs of the unit "queries [q_row0, q_row0 + m) attend to keys [kv_row0,
// kv_row0 + n)" of batch row b, summed over rows in O(m) at most (closed forms per document
// where they exist).
int64_t VisiblePairs(const MaskSpec& mask, int b, int64_t seq, int64_t q_row0, int64_t m,
                     int64_t kv_row0, int64_t n);

// Number of (query, key) pairs visible under the mask for the unit
// "queries [q_row0, q_row0 + m) attend to keys [kv_row0, kv_row0 + n)".
int64_t VisiblePairs(int64_t q_row0, int64_t m, int64_t kv_row0, int64_t n, MaskKind mask);

// FLOPs of the unit's forward, counting only visible pairs: 4 * B * H * pairs * D (a causal
// square counts exactly half of the full one). A backward costs 2.5 times its forward.
double ForwardFlops(int batch, int q_heads, int head_dim, int64_t q_row0, int64_t m,
                    int64_t kv_row0, int64_t n, MaskKind mask);

}  // namespace dfa
