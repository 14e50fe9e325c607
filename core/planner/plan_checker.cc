#include "core/planner/plan_checker.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "core/planner/planner.h"

namespace dfa {
namespace {

std::string Rows(const RowRange& r) { return absl::StrCat("[", r.begin, ", ", r.end, ")"); }

absl::Status Fail(int w, bool fwd, int t, absl::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat("worker ", w, fwd ? " forward" : " backward",
                                                    " step ", t, ": ", what));
}

// The workers of one head group (all workers for a plan without head ranges) and, for error
// texts, its name ("" for the single all-heads group).
struct Group {
  std::vector<int> members;
  std::string name;
};

absl::Status GroupFail(const Group& g, absl::Status s) {
  if (g.name.empty() || s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(g.name, ": ", s.message()));
}

absl::Status CheckOwnership(const Plan& plan, const Group& group) {
  std::vector<RowRange> all;
  for (int w : group.members) {
    const auto& owned = plan.workers[w].owned;
    if (owned.empty()) return absl::FailedPreconditionError(absl::StrCat("worker ", w, " owns no rows"));
    for (size_t i = 0; i < owned.size(); ++i) {
      if (owned[i].size() <= 0 || (i > 0 && owned[i].begin < owned[i - 1].end)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "worker ", w, ": owned ranges must be non-empty, sorted and disjoint"));
      }
      all.push_back(owned[i]);
    }
  }
  std::sort(all.begin(), all.end(), [](auto& a, auto& b) { return a.begin < b.begin; });
  int64_t at = 0;
  for (const RowRange& r : all) {
    if (r.begin != at) {
      return absl::FailedPreconditionError(absl::StrCat(
          "owned ranges do not partition [0, ", plan.seq_len, "): gap or overlap at row ", at));
    }
    at = r.end;
  }
  if (at != plan.seq_len) {
    return absl::FailedPreconditionError(absl::StrCat("owned ranges end at ", at, ", not at seq_len ",
                                                      plan.seq_len));
  }
  return absl::OkStatus();
}

std::string Heads(const HeadRange& h) { return absl::StrCat("[", h.begin, ", ", h.end, ")"); }

// The head groups (plan.h "Head groups"): head ranges inside [0, kv_heads), the groups' ranges
// partitioning it, no transfer between groups.
absl::StatusOr<std::vector<Group>> HeadGroups(const Plan& plan, int kv_heads) {
  bool any = false;
  for (const WorkerPlan& w : plan.workers) any |= !w.kv_heads.empty();
  std::vector<Group> groups;
  std::vector<int> group_of(plan.num_workers(), 0);
  if (!any) {
    groups.push_back({});
    for (int w = 0; w < plan.num_workers(); ++w) groups[0].members.push_back(w);
  } else {
    std::map<std::pair<int, int>, int> index;  // (begin, end) -> group
    std::vector<HeadRange> ranges;
    for (int w = 0; w < plan.num_workers(); ++w) {
      const HeadRange h = WorkerKvHeads(plan.workers[w], kv_heads);
      if (h.begin < 0 || h.end > kv_heads || h.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "worker ", w, ": kv_heads ", Heads(h), " is not a non-empty range inside [0, ",
            kv_heads, ") (the shape's kv_heads)"));
      }
      auto [it, added] = index.try_emplace({h.begin, h.end}, static_cast<int>(groups.size()));
      if (added) {
        groups.push_back({{}, absl::StrCat("head group ", Heads(h))});
        ranges.push_back(h);
      }
      groups[it->second].members.push_back(w);
      group_of[w] = it->second;
    }
    // index is sorted by (begin, end): consecutive groups must tile [0, kv_heads).
    int at = 0;
    for (const auto& [range, g] : index) {
      if (range.first != at) {
        const int first = groups[g].members.front();
        if (range.first > at) {
          return absl::FailedPreconditionError(absl::StrCat(
              "no worker holds kv heads [", at, ", ", range.first, ") (head groups must ",
              "partition [0, ", kv_heads, "))"));
        }
        return absl::FailedPreconditionError(absl::StrCat(
            "worker ", first, ": kv_heads ", Heads(ranges[g]), " overlaps another head group's ",
            "range ending at ", at, " (head groups must partition [0, ", kv_heads, "))"));
      }
      at = range.second;
    }
    if (at != kv_heads) {
      return absl::FailedPreconditionError(absl::StrCat(
          "no worker holds kv heads [", at, ", ", kv_heads, ") (head groups must partition [0, ",
          kv_heads, "))"));
    }
  }
  // Transfers stay inside a group (peers outside [0, P) are reported by CheckWorker).
  for (int w = 0; w < plan.num_workers(); ++w) {
    for (bool fwd : {true, false}) {
      const auto& pass = fwd ? plan.workers[w].forward : plan.workers[w].backward;
      for (size_t t = 0; t < pass.size(); ++t) {
        for (const auto* list : {&pass[t].sends, &pass[t].recvs}) {
          for (const Transfer& x : *list) {
            if (x.peer >= 0 && x.peer < plan.num_workers() && group_of[x.peer] != group_of[w]) {
              return Fail(w, fwd, static_cast<int>(t), absl::StrCat(
                  list == &pass[t].sends ? "sends to" : "receives from", " worker ", x.peer,
                  " of another head group (", groups[group_of[w]].name, " vs ",
                  groups[group_of[x.peer]].name, ")"));
            }
          }
        }
      }
    }
  }
  return groups;
}

bool InsideOwned(const WorkerPlan& w, const RowRange& r) {
  for (const RowRange& o : w.owned) {
    if (o.Contains(r)) return true;
  }
  return false;
}
bool OverlapsOwned(const WorkerPlan& w, const RowRange& r) {
  for (const RowRange& o : w.owned) {
    if (o.begin < r.end && r.begin < o.end) return true;
  }
  return false;
}

// Masked plans: whether some query row of `q` (in some batch row) sees a key of `keys`. The keys
// a row sees form one interval [lo(i), hi(i)) with lo and hi non-decreasing in i (core/mask.h),
// so the rows whose interval reaches into [a, b) lie between the first row with hi > a and the
// last with lo < b; VisiblePairs over those rows decides exactly (rows that see nothing).
bool AnySees(const MaskSpec& mask, int rows, int64_t seq, const RowRange& q,
             const RowRange& keys) {
  if (q.size() <= 0 || keys.size() <= 0) return false;
  for (int b = 0; b < rows; ++b) {
    int64_t lo = q.begin, hi = q.end;  // first row with hi(i) > keys.begin
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (VisibleKeys(mask, b, seq, mid).hi > keys.begin) hi = mid; else lo = mid + 1;
    }
    const int64_t first = lo;
    lo = first;
    hi = q.end;  // first row with lo(i) >= keys.end
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (VisibleKeys(mask, b, seq, mid).lo >= keys.end) hi = mid; else lo = mid + 1;
    }
    if (lo > first &&
        VisiblePairs(mask, b, seq, first, lo - first, keys.begin, keys.size()) > 0) {
      return true;
    }
  }
  return false;
}

// Masked plans, one segment of query rows (the same ops cover all its rows): the key ranges may
// overlap or leave gaps only where none of the segment's rows sees a key.
absl::Status CheckMaskedSegment(const Plan& plan, const MaskSpec& mask, int rows,
                                const RowRange& seg, std::vector<RowRange> kvs, const char* pass) {
  std::sort(kvs.begin(), kvs.end(), [](auto& a, auto& b) { return a.begin < b.begin; });
  // Sweep [0, seq_len): regions covered 0 times (gaps) and >= 2 times (overlaps).
  std::vector<std::pair<int64_t, int>> events;
  for (const RowRange& kv : kvs) {
    events.push_back({kv.begin, +1});
    events.push_back({kv.end, -1});
  }
  std::sort(events.begin(), events.end());
  int64_t at = 0;
  int depth = 0;
  size_t e = 0;
  while (at < plan.seq_len) {
    while (e < events.size() && events[e].first <= at) depth += events[e++].second;
    const int64_t next = e < events.size() ? std::min(events[e].first, plan.seq_len) : plan.seq_len;
    if (depth != 1 && next > at && AnySees(mask, rows, plan.seq_len, seg, RowRange{at, next})) {
      if (depth == 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            pass, ": query rows ", Rows(seg), " never attend to keys ", Rows({at, next}),
            ", which the mask lets them see"));
      }
      return absl::FailedPreconditionError(absl::StrCat(
          pass, ": query rows ", Rows(seg), " attend to keys ", Rows({at, next}), " ", depth,
          " times"));
    }
    at = next;
  }
  return absl::OkStatus();
}

// Every visible pair exactly once: per segment of query rows between consecutive boundaries,
// the key ranges (clipped to what the segment's last row sees) must tile [0, visible end).
// Masked plans (documents, window): the key ranges may overlap or leave gaps only where the
// mask hides every pair (CheckMaskedSegment). Every compute op must hold a visible pair.
absl::Status CheckCoverage(const Plan& plan, const Group& group, bool fwd) {
  std::vector<std::pair<RowRange, RowRange>> ops;
  std::vector<int64_t> cuts = {0, plan.seq_len};
  const UnitPairs unit_pairs(plan);
  for (int m : group.members) {
    const WorkerPlan& w = plan.workers[m];
    const auto& steps = fwd ? w.forward : w.backward;
    for (size_t t = 0; t < steps.size(); ++t) {
      for (const ComputeOp& c : steps[t].computes) {
        if (!(unit_pairs(c.q_rows, c.kv_rows) > 0)) {
          return Fail(m, fwd, static_cast<int>(t), absl::StrCat(
              "computes query rows ", Rows(c.q_rows), " x keys ", Rows(c.kv_rows),
              ", which holds no visible pair (units the mask hides are not planned)"));
        }
        ops.push_back({c.q_rows, c.kv_rows});
        cuts.push_back(c.q_rows.begin);
        cuts.push_back(c.q_rows.end);
      }
    }
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<std::vector<RowRange>> per_seg(cuts.size() - 1);
  for (const auto& [q, kv] : ops) {
    const size_t first = std::lower_bound(cuts.begin(), cuts.end(), q.begin) - cuts.begin();
    for (size_t s = first; s + 1 < cuts.size() && cuts[s] < q.end; ++s) per_seg[s].push_back(kv);
  }
  const char* pass = fwd ? "forward" : "backward";
  if (!plan.dense()) {
    const MaskSpec mask = plan.Mask();
    for (size_t s = 0; s + 1 < cuts.size(); ++s) {
      RETURN_IF_ERROR(CheckMaskedSegment(plan, mask, unit_pairs.rows(), {cuts[s], cuts[s + 1]},
                                         per_seg[s], pass));
    }
    return absl::OkStatus();
  }
  for (size_t s = 0; s + 1 < cuts.size(); ++s) {
    const int64_t visible_end = plan.causal ? cuts[s + 1] : plan.seq_len;
    std::vector<RowRange> kvs;
    for (RowRange kv : per_seg[s]) {
      kv.end = std::min(kv.end, visible_end);
      if (kv.size() > 0) kvs.push_back(kv);
    }
    std::sort(kvs.begin(), kvs.end(), [](auto& a, auto& b) { return a.begin < b.begin; });
    int64_t at = 0;
    for (const RowRange& kv : kvs) {
      if (kv.begin < at) {
        return absl::FailedPreconditionError(absl::StrCat(
            pass, ": query rows ", Rows({cuts[s], cuts[s + 1]}), " attend to keys ", Rows(kv),
            " more than once"));
      }
      if (kv.begin > at) break;
      at = kv.end;
    }
    if (at != visible_end) {
      return absl::FailedPreconditionError(absl::StrCat(
          pass, ": query rows ", Rows({cuts[s], cuts[s + 1]}), " never attend to keys from row ",
          at, " (visible up to ", visible_end, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckMatching(const Plan& plan, const Group& group, bool fwd) {
  size_t steps = 0;
  for (int w : group.members) {
    steps = std::max(steps, (fwd ? plan.workers[w].forward : plan.workers[w].backward).size());
  }
  using Key = std::tuple<int, int, int, int64_t, int64_t, int>;  // from, to, tensor, rows, lead
  for (size_t t = 0; t < steps; ++t) {
    std::vector<Key> sends, recvs;
    for (int w : group.members) {
      const auto& pass = fwd ? plan.workers[w].forward : plan.workers[w].backward;
      if (t >= pass.size()) continue;
      for (const Transfer& x : pass[t].sends) {
        sends.emplace_back(w, x.peer, static_cast<int>(x.tensor), x.rows.begin, x.rows.end, x.lead);
      }
      for (const Transfer& x : pass[t].recvs) {
        recvs.emplace_back(x.peer, w, static_cast<int>(x.tensor), x.rows.begin, x.rows.end, x.lead);
      }
    }
    std::sort(sends.begin(), sends.end());
    std::sort(recvs.begin(), recvs.end());
    if (sends != recvs) {
      std::vector<Key> diff;
      std::set_symmetric_difference(sends.begin(), sends.end(), recvs.begin(), recvs.end(),
                                    std::back_inserter(diff));
      const Key& k = diff.front();
      const bool unmatched_send = std::binary_search(sends.begin(), sends.end(), k);
      return Fail(unmatched_send ? std::get<0>(k) : std::get<1>(k), fwd, static_cast<int>(t),
                  absl::StrCat(unmatched_send ? "send to " : "recv from ",
                               unmatched_send ? std::get<1>(k) : std::get<0>(k), " of ",
                               PlanTensorName(static_cast<PlanTensor>(std::get<2>(k))), " rows ",
                               Rows({std::get<3>(k), std::get<4>(k)}), " (lead ", std::get<5>(k),
                               ") has no matching ", unmatched_send ? "recv" : "send"));
    }
  }
  return absl::OkStatus();
}

struct Buffer {
  PlanTensor tensor;
  RowRange rows;
  int born = 0;      // receive step (partials: first compute step)
  int posted = 0;    // received buffers: the step whose start posts the receive (-1: before)
  int last_use = 0;  // last step that reads it (partials: the send step)
  bool sent = false;
};

// Availability, partials and memory of one worker's pass; returns its peak buffer bytes.
absl::StatusOr<int64_t> CheckWorker(const Plan& plan, int w, bool fwd, const AttentionShape& shape) {
  const WorkerPlan& me = plan.workers[w];
  const auto& pass = fwd ? me.forward : me.backward;
  const PlanTensor q_side = fwd ? PlanTensor::kQ : PlanTensor::kGradIn;
  const PlanTensor q_partial = fwd ? PlanTensor::kOutPartial : PlanTensor::kDqPartial;
  std::vector<Buffer> received, partials;
  std::vector<std::pair<int, int64_t>> transient;  // (step, bytes) of partials received
  auto find = [](std::vector<Buffer>& list, PlanTensor t, const RowRange& r, int by_step,
                 bool exact) -> Buffer* {
    for (Buffer& b : list) {
      if (b.tensor == t && b.born <= by_step && (exact ? b.rows == r : b.rows.Contains(r))) return &b;
    }
    return nullptr;
  };
  for (int t = 0; t < static_cast<int>(pass.size()); ++t) {
    const PlanStep& step = pass[t];
    for (const auto* list : {&step.sends, &step.recvs}) {
      for (const Transfer& x : *list) {
        const bool ok_tensor =
            fwd ? (x.tensor == PlanTensor::kQ || x.tensor == PlanTensor::kKV ||
                   x.tensor == PlanTensor::kOutPartial)
                : (x.tensor == PlanTensor::kKV || x.tensor == PlanTensor::kGradIn ||
                   x.tensor == PlanTensor::kDqPartial || x.tensor == PlanTensor::kDkvPartial);
        if (!ok_tensor) return Fail(w, fwd, t, absl::StrCat("tensor ", PlanTensorName(x.tensor), " does not belong in this pass"));
        if (x.peer < 0 || x.peer >= plan.num_workers() || x.peer == w) {
          return Fail(w, fwd, t, absl::StrCat("bad peer ", x.peer));
        }
        if (x.rows.size() <= 0 || x.rows.begin < 0 || x.rows.end > plan.seq_len) {
          return Fail(w, fwd, t, absl::StrCat("bad rows ", Rows(x.rows)));
        }
        if (x.lead < 0 || x.lead > t || (x.lead > 0 && IsPartial(x.tensor))) {
          return Fail(w, fwd, t, absl::StrCat("bad lead ", x.lead, " for ", PlanTensorName(x.tensor),
                                              " (non-partials only, at most the step index)"));
        }
      }
    }
    for (const Transfer& x : step.sends) {
      if (IsPartial(x.tensor)) {
        Buffer* b = find(partials, x.tensor, x.rows, t - 1, true);
        if (b == nullptr || b->sent) {
          return Fail(w, fwd, t, absl::StrCat("sends ", PlanTensorName(x.tensor), " ", Rows(x.rows),
                                              " that no earlier compute produced (or sent twice)"));
        }
        if (!InsideOwned(plan.workers[x.peer], x.rows)) {
          return Fail(w, fwd, t, absl::StrCat("partial ", Rows(x.rows), " sent to worker ", x.peer,
                                              " which does not own those rows"));
        }
        b->sent = true;
        b->last_use = t;
      } else if (!InsideOwned(me, x.rows)) {
        // Posted at the start of step t-1-lead: what it forwards must have arrived by then.
        Buffer* b = find(received, x.tensor, x.rows, t - 1 - x.lead, false);
        if (b == nullptr) {
          return Fail(w, fwd, t, absl::StrCat("sends ", PlanTensorName(x.tensor), " ", Rows(x.rows),
                                              " which it neither owns nor received by step ",
                                              t - 1 - x.lead, " (its post step, lead ", x.lead, ")"));
        }
        b->last_use = std::max(b->last_use, t);
      }
    }
    for (const Transfer& x : step.recvs) {
      if (IsPartial(x.tensor)) {
        if (!InsideOwned(me, x.rows)) {
          return Fail(w, fwd, t, absl::StrCat("receives partial ", Rows(x.rows), " it does not own"));
        }
        transient.push_back({t, TransferBytes(shape, x.tensor, x.rows.size())});
        continue;
      }
      if (OverlapsOwned(me, x.rows)) {
        return Fail(w, fwd, t, absl::StrCat("receives ", PlanTensorName(x.tensor), " ", Rows(x.rows), " which it owns"));
      }
      for (const Buffer& b : received) {
        if (b.tensor == x.tensor && b.rows.begin < x.rows.end && x.rows.begin < b.rows.end) {
          return Fail(w, fwd, t, absl::StrCat("receives ", PlanTensorName(x.tensor), " ", Rows(x.rows),
                                              " a second time in this pass"));
        }
      }
      received.push_back(Buffer{x.tensor, x.rows, t, t - 1 - x.lead, t, false});
    }
    for (const ComputeOp& c : step.computes) {
      if (c.q_rows.size() <= 0 || c.kv_rows.size() <= 0 || c.q_rows.begin < 0 ||
          c.kv_rows.begin < 0 || c.q_rows.end > plan.seq_len || c.kv_rows.end > plan.seq_len) {
        return Fail(w, fwd, t, absl::StrCat("compute with bad rows q ", Rows(c.q_rows), " kv ", Rows(c.kv_rows)));
      }
      auto use = [&](PlanTensor tensor, const RowRange& r, PlanTensor partial_kind,
                     bool needs_partial) -> absl::Status {
        if (InsideOwned(me, r)) return absl::OkStatus();
        Buffer* b = find(received, tensor, r, t, false);
        if (b == nullptr) {
          return Fail(w, fwd, t, absl::StrCat("computes with ", PlanTensorName(tensor), " rows ", Rows(r),
                                              " it neither owns nor has received"));
        }
        b->last_use = std::max(b->last_use, t);
        if (!needs_partial) return absl::OkStatus();
        Buffer* p = find(partials, partial_kind, b->rows, t, true);
        if (p == nullptr) {
          partials.push_back(Buffer{partial_kind, b->rows, t, t, t, false});
        } else if (p->sent) {
          return Fail(w, fwd, t, absl::StrCat("writes partial ", Rows(b->rows), " after sending it"));
        }
        return absl::OkStatus();
      };
      RETURN_IF_ERROR(use(q_side, c.q_rows, q_partial, true));
      RETURN_IF_ERROR(use(PlanTensor::kKV, c.kv_rows, PlanTensor::kDkvPartial, !fwd));
    }
  }
  for (const Buffer& p : partials) {
    if (!p.sent) {
      return Fail(w, fwd, static_cast<int>(pass.size()) - 1,
                  absl::StrCat("partial ", PlanTensorName(p.tensor), " ", Rows(p.rows),
                               " is never sent to its owner"));
    }
  }
  int64_t peak = 0;
  for (int t = 0; t < static_cast<int>(pass.size()); ++t) {
    int64_t live = 0;
    for (const auto* list : {&received, &partials}) {
      for (const Buffer& b : *list) {
        // A received buffer is allocated when its receive is posted (lead + 1 steps early).
        const int from = list == &received ? b.posted : b.born;
        if (from <= t && t <= b.last_use) live += TransferBytes(shape, b.tensor, b.rows.size());
      }
    }
    for (const auto& [s, bytes] : transient) {
      if (s == t) live += bytes;
    }
    peak = std::max(peak, live);
  }
  return peak;
}

// Virtual ranks (plan.h): one worker per rank, every worker in [0, W) running at least one.
absl::Status CheckRankWorkers(const Plan& plan) {
  if (plan.rank_workers.empty()) return absl::OkStatus();
  if (plan.rank_workers.size() != plan.workers.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank_workers: ", plan.rank_workers.size(), " entries for ", plan.workers.size(),
        " ranks (one per rank, or none)"));
  }
  for (size_t r = 0; r < plan.rank_workers.size(); ++r) {
    const int w = plan.rank_workers[r];
    if (w < 0 || w >= plan.num_workers()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank_workers[", r, "] = ", w, ": must be in [0, ", plan.num_workers(), ")"));
    }
  }
  const int W = plan.physical_workers();
  std::vector<int> ranks_on(W, 0);
  for (int w : plan.rank_workers) ++ranks_on[w];
  for (int w = 0; w < W; ++w) {
    if (ranks_on[w] == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank_workers: worker ", w, " runs no rank (workers must be 0..", W - 1,
          ", each with one rank or more)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CheckReport> CheckPlan(const Plan& plan, const CheckOptions& options) {
  if (plan.num_workers() < 1) return absl::FailedPreconditionError("plan has no workers");
  if (plan.seq_len < 1) return absl::FailedPreconditionError("plan seq_len must be >= 1");
  RETURN_IF_ERROR(CheckRankWorkers(plan));
  ASSIGN_OR_RETURN(const std::vector<Group> groups, HeadGroups(plan, options.shape.kv_heads));
  for (const Group& g : groups) RETURN_IF_ERROR(GroupFail(g, CheckOwnership(plan, g)));
  CheckReport report;
  report.peak_forward_bytes.assign(plan.num_workers(), 0);
  report.peak_backward_bytes.assign(plan.num_workers(), 0);
  for (bool fwd : {true, false}) {
    for (const Group& g : groups) {
      RETURN_IF_ERROR(GroupFail(g, CheckMatching(plan, g, fwd)));
      RETURN_IF_ERROR(GroupFail(g, CheckCoverage(plan, g, fwd)));
      for (int w : g.members) {
        ASSIGN_OR_RETURN(int64_t peak,
                         CheckWorker(plan, w, fwd, LocalShape(options.shape, plan.workers[w])));
        (fwd ? report.peak_forward_bytes : report.peak_backward_bytes)[w] = peak;
        report.max_peak_bytes = std::max(report.max_peak_bytes, peak);
        if (options.max_buffer_bytes > 0 && peak > options.max_buffer_bytes) {
          return absl::FailedPreconditionError(absl::StrCat(
              "worker ", w, fwd ? " forward" : " backward", ": peak buffer memory ", peak,
              " bytes exceeds the bound of ", options.max_buffer_bytes));
        }
      }
    }
  }
  return report;
}

}  // namespace dfa
