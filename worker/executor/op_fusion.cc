#include "worker/executor/op_fusion.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace dfa {
namespace {

// A piece of a source's rows: global rows [global, global + len) at local row `local`.
struct Segment {
  int64_t global, local, len;
};

// The source's segments clipped to local rows [a, b); empty when the layout does not cover them.
std::vector<Segment> SegmentsIn(const std::vector<RowRange>& layout, int64_t a, int64_t b) {
  std::vector<Segment> out;
  int64_t local = 0;
  for (const RowRange& r : layout) {
    const int64_t lo = std::max(a, local), hi = std::min(b, local + r.size());
    if (lo < hi) out.push_back({r.begin + (lo - local), lo, hi - lo});
    local += r.size();
  }
  int64_t covered = 0;
  for (const Segment& s : out) covered += s.len;
  if (covered != b - a) out.clear();
  return out;
}

// Visible pairs of queries [q0, q0 + m) x keys [k0, k0 + n) in every distinct batch row.
int64_t MaskedPairs(const UnitPairs& pairs, int64_t q0, int64_t m, int64_t k0, int64_t n) {
  int64_t total = 0;
  for (int b = 0; b < pairs.rows(); ++b) total += pairs.Row(b, {q0, q0 + m}, {k0, k0 + n});
  return total;
}

// kIntervals: one global range per side, and the ops hold every visible pair of the box.
bool FitsIntervals(const std::vector<ComputeOp>& all, const std::vector<RowPlace>& qp,
                   const std::vector<RowPlace>& kp, const std::vector<int>& ops,
                   const UnitPairs& pairs, FusedCall* call) {
  int64_t qa = INT64_MAX, qb = INT64_MIN, ka = INT64_MAX, kb = INT64_MIN;
  int64_t op_pairs = 0;
  for (int i : ops) {
    qa = std::min(qa, qp[i].local);
    qb = std::max(qb, qp[i].local + all[i].q_rows.size());
    ka = std::min(ka, kp[i].local);
    kb = std::max(kb, kp[i].local + all[i].kv_rows.size());
    op_pairs += MaskedPairs(pairs, all[i].q_rows.begin, all[i].q_rows.size(),
                            all[i].kv_rows.begin, all[i].kv_rows.size());
  }
  const std::vector<Segment> qs = SegmentsIn(*qp[ops[0]].layout, qa, qb);
  const std::vector<Segment> ks = SegmentsIn(*kp[ops[0]].layout, ka, kb);
  if (qs.size() != 1 || ks.size() != 1) return false;
  if (MaskedPairs(pairs, qs[0].global, qs[0].len, ks[0].global, ks[0].len) != op_pairs) {
    return false;
  }
  call->ops = ops;
  call->q = {qp[ops[0]].layout, qa};
  call->kv = {kp[ops[0]].layout, ka};
  call->m = qb - qa;
  call->n = kb - ka;
  call->mask = MaskKind::kIntervals;
  call->q_row0 = qs[0].global;
  call->kv_row0 = ks[0].global;
  return true;
}

// Fills the call's geometry for `ops` (all on the same two sources) and returns whether one
// backend call computes exactly their pairs.
bool Fits(const std::vector<ComputeOp>& all, const std::vector<RowPlace>& qp,
          const std::vector<RowPlace>& kp, const std::vector<int>& ops, MaskKind mask,
          const UnitPairs* pairs, FusedCall* call) {
  if (mask == MaskKind::kIntervals) {
    return pairs != nullptr && FitsIntervals(all, qp, kp, ops, *pairs, call);
  }
  int64_t qa = INT64_MAX, qb = INT64_MIN, ka = INT64_MAX, kb = INT64_MIN;
  int64_t op_pairs = 0;
  for (int i : ops) {
    qa = std::min(qa, qp[i].local);
    qb = std::max(qb, qp[i].local + all[i].q_rows.size());
    ka = std::min(ka, kp[i].local);
    kb = std::max(kb, kp[i].local + all[i].kv_rows.size());
    op_pairs += VisiblePairs(all[i].q_rows.begin, all[i].q_rows.size(), all[i].kv_rows.begin,
                             all[i].kv_rows.size(), mask);
  }
  const std::vector<Segment> qs = SegmentsIn(*qp[ops[0]].layout, qa, qb);
  const std::vector<Segment> ks = SegmentsIn(*kp[ops[0]].layout, ka, kb);
  if (qs.empty() || ks.empty()) return false;
  call->ops = ops;
  call->q = {qp[ops[0]].layout, qa};
  call->kv = {kp[ops[0]].layout, ka};
  call->m = qb - qa;
  call->n = kb - ka;
  call->q_row0 = qs.front().global;
  int64_t plan_pairs = 0;
  for (const Segment& q : qs) {
    for (const Segment& k : ks) plan_pairs += VisiblePairs(q.global, q.len, k.global, k.len, mask);
  }
  if (plan_pairs != op_pairs) return false;  // the ops leave visible pairs of the box out
  if (plan_pairs == call->m * call->n) {
    call->mask = MaskKind::kFull;  // every pair visible: no mask at all
    call->kv_row0 = ks.front().global;
    return true;
  }
  if (mask != MaskKind::kCausal) return false;
  call->mask = mask;
  // Causal: the first key segment at its global position. (A shift that keeps every pair of
  // segments exact can exist at other key positions too, but it makes a diagonal band that
  // cuDNN runs far slower than the plain causal and full calls it would replace: measured
  // 385 vs ~470 TFLOP/s on H200.)
  call->kv_row0 = ks.front().global;
  for (const Segment& q : qs) {
    for (const Segment& k : ks) {
      const int64_t want = VisiblePairs(q.global, q.len, k.global, k.len, mask);
      const int64_t got = VisiblePairs(call->q_row0 + (q.local - qa), q.len,
                                       call->kv_row0 + (k.local - ka), k.len, mask);
      // Within one pair of segments both masks are causal at some shift: the same count means
      // the same pairs.
      if (got != want) return false;
    }
  }
  return true;
}

}  // namespace

std::vector<FusedCall> FuseStepOps(const std::vector<ComputeOp>& ops,
                                   const std::vector<RowPlace>& q_places,
                                   const std::vector<RowPlace>& kv_places, MaskKind mask,
                                   const UnitPairs* pairs) {
  std::vector<FusedCall> calls;
  for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
    bool joined = false;
    for (FusedCall& c : calls) {
      if (q_places[c.ops[0]].layout != q_places[i].layout ||
          kv_places[c.ops[0]].layout != kv_places[i].layout) {
        continue;
      }
      std::vector<int> with = c.ops;
      with.push_back(i);
      FusedCall bigger;
      if (Fits(ops, q_places, kv_places, with, mask, pairs, &bigger)) {
        c = std::move(bigger);
        joined = true;
        break;
      }
    }
    if (joined) continue;
    FusedCall single;
    single.ops = {i};
    single.q = q_places[i];
    single.kv = kv_places[i];
    single.m = ops[i].q_rows.size();
    single.n = ops[i].kv_rows.size();
    single.mask = mask;
    single.q_row0 = ops[i].q_rows.begin;
    single.kv_row0 = ops[i].kv_rows.begin;
    calls.push_back(std::move(single));
  }
  // Ops that fit together only with a third (an L-shape and its missing corner) join here.
  for (bool merged = true; merged;) {
    merged = false;
    for (size_t a = 0; a < calls.size() && !merged; ++a) {
      for (size_t b = a + 1; b < calls.size() && !merged; ++b) {
        if (q_places[calls[a].ops[0]].layout != q_places[calls[b].ops[0]].layout ||
            kv_places[calls[a].ops[0]].layout != kv_places[calls[b].ops[0]].layout) {
          continue;
        }
        std::vector<int> with = calls[a].ops;
        with.insert(with.end(), calls[b].ops.begin(), calls[b].ops.end());
        std::sort(with.begin(), with.end());
        FusedCall bigger;
        if (Fits(ops, q_places, kv_places, with, mask, pairs, &bigger)) {
          calls[a] = std::move(bigger);
          calls.erase(calls.begin() + static_cast<std::ptrdiff_t>(b));
          merged = true;
        }
      }
    }
  }
  return calls;
}

}  // namespace dfa
