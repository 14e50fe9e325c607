#include "core/mask.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dfa {
namespace {

const std::vector<int64_t>& NoOffsets() {
  static const std::vector<int64_t>* empty = new std::vector<int64_t>();
  return *empty;
}

// The document [begin, end) holding position p of a row with offsets `off` (empty: [0, seq)).
struct Doc {
  int64_t begin, end;
  size_t index;  // of `begin` in off (0 without offsets)
};
Doc DocAt(const std::vector<int64_t>& off, int64_t seq, int64_t p) {
  if (off.size() < 2) return {0, seq, 0};
  // The last offset <= p.
  auto it = std::upper_bound(off.begin(), off.end(), p);
  size_t i = static_cast<size_t>(it - off.begin());
  i = i == 0 ? 0 : i - 1;
  if (i + 1 >= off.size()) i = off.size() - 2;
  return {off[i], off[i + 1], i};
}

// Distance a query sees to its right: min over causal (0) and window_right; -1 = unbounded.
int64_t RightReach(const MaskSpec& m) {
  if (m.causal) return m.window_right >= 0 ? std::min<int64_t>(m.window_right, 0) : 0;
  return m.window_right;
}

// sum over i in [i0, i1) of max(0, a + s * i), s in {-1, 0, 1}.
int64_t SumPositive(int64_t a, int s, int64_t i0, int64_t i1) {
  if (i1 <= i0) return 0;
  if (s == 0) return a > 0 ? a * (i1 - i0) : 0;
  if (s > 0) {  // a + i > 0 <=> i >= 1 - a
    const int64_t lo = std::max(i0, 1 - a);
    if (lo >= i1) return 0;
    const int64_t first = a + lo, last = a + i1 - 1;
    return (first + last) * (i1 - lo) / 2;
  }
  const int64_t hi = std::min(i1, a);  // a - i > 0 <=> i < a
  if (hi <= i0) return 0;
  const int64_t first = a - i0, last = a - (hi - 1);
  return (first + last) * (hi - i0) / 2;
}

}  // namespace

bool MaskSpec::IsDense() const {
  for (const std::vector<int64_t>& row : doc_offsets) {
    if (row.size() > 2) return false;
  }
  if (window_left >= 0) return false;
  if (!causal && window_right >= 0) return false;
  return true;
}

MaskKind MaskSpec::Kind() const {
  if (!IsDense()) return MaskKind::kIntervals;
  return causal ? MaskKind::kCausal : MaskKind::kFull;
}

const std::vector<int64_t>& MaskSpec::OffsetsOf(int b) const {
  if (doc_offsets.empty()) return NoOffsets();
  if (doc_offsets.size() == 1) return doc_offsets[0];
  if (b < 0 || static_cast<size_t>(b) >= doc_offsets.size()) return NoOffsets();
  return doc_offsets[static_cast<size_t>(b)];
}

absl::Status ValidateMask(const MaskSpec& mask, int batch, int64_t seq) {
  if (mask.window_left < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "window_left: must be >= 0 (or -1: unbounded), got ", mask.window_left));
  }
  if (mask.window_right < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "window_right: must be >= 0 (or -1: unbounded), got ", mask.window_right));
  }
  const size_t rows = mask.doc_offsets.size();
  if (rows > 1 && rows != static_cast<size_t>(batch)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "doc_offsets: must have 0, 1 or batch (", batch, ") entries, got ", rows));
  }
  for (size_t b = 0; b < rows; ++b) {
    const std::vector<int64_t>& off = mask.doc_offsets[b];
    if (off.size() < 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "doc_offsets[", b, "]: must hold at least 2 offsets {0, ..., seq_len = ", seq,
          "}, got ", off.size()));
    }
    if (off.front() != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("doc_offsets[", b, "][0]: must be 0, got ", off.front()));
    }
    for (size_t i = 1; i < off.size(); ++i) {
      if (off[i] <= off[i - 1]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "doc_offsets[", b, "][", i, "]: must be greater than doc_offsets[", b, "][", i - 1,
            "] = ", off[i - 1], ", got ", off[i]));
      }
      if (i + 1 < off.size() && off[i] >= seq) {  // an inner offset at or past the end
        return absl::InvalidArgumentError(absl::StrCat("doc_offsets[", b, "][", i,
                                                       "]: must be less than seq_len = ", seq,
                                                       ", got ", off[i]));
      }
    }
    if (off.back() != seq) {
      return absl::InvalidArgumentError(absl::StrCat("doc_offsets[", b, "][", off.size() - 1,
                                                     "]: must be seq_len = ", seq, ", got ",
                                                     off.back()));
    }
  }
  return absl::OkStatus();
}

PositionInterval VisibleKeys(const MaskSpec& mask, int b, int64_t seq, int64_t i) {
  const Doc d = DocAt(mask.OffsetsOf(b), seq, i);
  int64_t lo = d.begin, hi = d.end;
  if (mask.window_left >= 0) lo = std::max(lo, i - mask.window_left);
  const int64_t right = RightReach(mask);
  if (right >= 0) hi = std::min(hi, i + right + 1);
  return {lo, std::max(lo, hi)};
}

PositionInterval VisibleQueries(const MaskSpec& mask, int b, int64_t seq, int64_t j) {
  const Doc d = DocAt(mask.OffsetsOf(b), seq, j);
  int64_t lo = d.begin, hi = d.end;
  // Query i sees j iff j >= i - window_left (i <= j + window_left) and j <= i + right
  // (i >= j - right).
  const int64_t right = RightReach(mask);
  if (right >= 0) lo = std::max(lo, j - right);
  if (mask.window_left >= 0) hi = std::min(hi, j + mask.window_left + 1);
  return {lo, std::max(lo, hi)};
}

MaskIntervalArrays BuildMaskIntervals(const MaskSpec& mask, int batch, int64_t seq) {
  MaskIntervalArrays a;
  a.seq = seq;
  const size_t total = static_cast<size_t>(batch) * static_cast<size_t>(seq);
  a.q_lo.resize(total);
  a.q_hi.resize(total);
  a.k_lo.resize(total);
  a.k_hi.resize(total);
  const int64_t right = RightReach(mask);
  for (int b = 0; b < batch; ++b) {
    const std::vector<int64_t>& off = mask.OffsetsOf(b);
    const size_t base = static_cast<size_t>(b) * static_cast<size_t>(seq);
    size_t doc = 0;  // index of the current document's first offset
    for (int64_t p = 0; p < seq; ++p) {
      int64_t begin = 0, end = seq;
      if (off.size() >= 2) {
        while (doc + 2 < off.size() && off[doc + 1] <= p) ++doc;
        begin = off[doc];
        end = off[doc + 1];
      }
      int64_t qlo = begin, qhi = end, klo = begin, khi = end;
      if (mask.window_left >= 0) {
        qlo = std::max(qlo, p - mask.window_left);
        khi = std::min(khi, p + mask.window_left + 1);
      }
      if (right >= 0) {
        qhi = std::min(qhi, p + right + 1);
        klo = std::max(klo, p - right);
      }
      const size_t at = base + static_cast<size_t>(p);
      a.q_lo[at] = static_cast<int32_t>(qlo);
      a.q_hi[at] = static_cast<int32_t>(std::max(qlo, qhi));
      a.k_lo[at] = static_cast<int32_t>(klo);
      a.k_hi[at] = static_cast<int32_t>(std::max(klo, khi));
    }
  }
  return a;
}

int64_t VisiblePairs(const MaskSpec& mask, int b, int64_t seq, int64_t q_row0, int64_t m,
                     int64_t kv_row0, int64_t n) {
  if (m <= 0 || n <= 0) return 0;
  const std::vector<int64_t>& off = mask.OffsetsOf(b);
  const int64_t q_end = q_row0 + m, k_end = kv_row0 + n;
  const int64_t right = RightReach(mask);
  const int64_t wl = mask.window_left;
  int64_t total = 0;
  // One document at a time: its rows [r0, r1) inside the unit's queries see keys
  // [max(c_lo, i - wl), min(c_hi, i + right + 1)) with c_lo, c_hi the document clipped to the
  // unit's keys. Each bound switches once between constant and slope 1; between the switches
  // the count is linear in i and sums in closed form.
  Doc d = DocAt(off, seq, q_row0);
  while (true) {
    const int64_t r0 = std::max(q_row0, d.begin), r1 = std::min(q_end, d.end);
    if (r0 >= r1) break;
    const int64_t c_lo = std::max(d.begin, kv_row0), c_hi = std::min(d.end, k_end);
    if (c_lo < c_hi) {
      // lo(i) = c_lo for i < lo_switch, i - wl from there; hi(i) = i + right + 1 for
      // i < hi_switch, c_hi from there.
      const int64_t lo_switch = wl >= 0 ? c_lo + wl : INT64_MAX;
      const int64_t hi_switch = right >= 0 ? c_hi - right - 1 : INT64_MIN;
      int64_t cuts[4] = {r0, std::clamp(lo_switch, r0, r1), std::clamp(hi_switch, r0, r1), r1};
      std::sort(cuts, cuts + 4);
      for (int k = 0; k < 3; ++k) {
        const int64_t a0 = cuts[k], a1 = cuts[k + 1];
        if (a0 >= a1) continue;
        // On [a0, a1) each bound is one linear piece: evaluate at a0 to pick it.
        const bool lo_slides = a0 >= lo_switch;
        const bool hi_slides = a0 < hi_switch;
        // count(i) = hi(i) - lo(i) = const + s * i.
        int64_t c = (hi_slides ? right + 1 : c_hi) - (lo_slides ? -wl : c_lo);
        int s = (hi_slides ? 1 : 0) - (lo_slides ? 1 : 0);
        total += SumPositive(c, s, a0, a1);
      }
    }
    if (off.size() < 2 || d.index + 2 >= off.size()) break;
    d = {off[d.index + 1], off[d.index + 2], d.index + 1};
  }
  return total;
}


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
