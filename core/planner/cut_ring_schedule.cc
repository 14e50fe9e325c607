// The cut ring: the striped ring for ANY speeds, with steps cut by work instead of by piece.
//
// The striped ring (striped_ring_schedule.cc) is exact only when every worker's piece count is
// proportional to its speed: each step computes one piece against all own queries, so unequal
// piece sizes make unequal steps, and a ring waits for its slowest step (random speeds: 1.1-1.3
// at P = 48-64). Here ownership is exactly proportional to speed (mirrored ranges, as in the
// striped ring: worker i's work against any K/V block is proportional to the block's size), the
// pieces are all about `piece` pairs (n_i = ceil(x_i / piece), any sizes are fine), and each
// worker's work list is cut into T steps of exactly 1/T of its work (query rows split), so
// every worker's step t ends at the same time whatever the speeds.
//
// Work list of worker i: own queries x own K/V, then the pieces of i-1, i-2, ... (each in piece
// order) against the own queries. Worker i-1 meets the same piece x_i/F of the pass earlier, so
// with T >= steps_factor * F / x_min (x_min: the smallest range) it holds it at least one step
// before i needs it and forwards it then: one piece range per link per ~1/pieces_per_step step,
// every K/V row reaches every worker once (and only workers that need it: a range no later
// worker of the chain uses is not forwarded).
//
// Backward (kv_stationary_backward): the same lists with the roles swapped - worker i computes
// the pieces' queries (kGradIn: Q, dO, LSE, D, forwarded around the ring) against its own K/V,
// dK/dV accumulate at home, each piece range's dQ partial returns to its owner in the step after
// its last use. Otherwise the backward is derived from the forward (DeriveBackwardSteps).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/planner/plan_builder.h"
#include "core/planner/planner.h"

namespace dfa {

using planner_internal::StepAt;

namespace {

// One range of a piece as it travels: its global index, owner and rows.
struct Range {
  int owner = 0;
  RowRange rows;
};

// Where one worker's pass touches each range: first step (when it reaches the range in its work
// list; -1: never reached, own) and last compute step (-1: no compute).
struct Touch {
  int first = -1;
  int last = -1;
};

// Cuts worker w's work list into `T` steps of equal work; appends the computes to `pass` and
// returns its touches per range. `fwd`: own queries x ranges as K/V; else ranges as queries x
// own K/V. `order`: the ranges in work-list order (own ranges excluded).
std::vector<Touch> CutList(const Plan& plan, int w, bool fwd, const std::vector<Range>& ranges,
                           const std::vector<int>& order, int T, std::vector<PlanStep>& pass) {
  const UnitPairs pairs_of(plan);
  const std::vector<RowRange>& own = plan.workers[w].owned;
  // The list: group -1 = own x own, then one group per range.
  struct Item {
    int range;  // -1: own
    RowRange q, kv;
  };
  std::vector<Item> items;
  for (const RowRange& q : own) {
    for (const RowRange& kv : own) {
      if (pairs_of(q, kv) > 0) items.push_back(Item{-1, q, kv});
    }
  }
  for (int g : order) {
    bool any = false;
    for (const RowRange& mine : own) {
      const RowRange& q = fwd ? mine : ranges[g].rows;
      const RowRange& kv = fwd ? ranges[g].rows : mine;
      if (pairs_of(q, kv) > 0) {
        items.push_back(Item{g, q, kv});
        any = true;
      }
    }
    if (!any) items.push_back(Item{g, RowRange{}, RowRange{}});  // reached, nothing to compute
  }
  double total = 0;
  for (const Item& it : items) {
    if (it.q.size() > 0) total += pairs_of(it.q, it.kv);
  }
  std::vector<double> target(T);
  for (int t = 0; t < T; ++t) target[t] = total * (t + 1) / T;
  std::vector<Touch> touch(ranges.size());
  int t = 0;
  double done = 0;
  auto skip_full = [&] {
    while (t + 1 < T && done >= target[t] - 0.5) ++t;
  };
  for (const Item& it : items) {
    skip_full();
    if (it.range >= 0 && touch[it.range].first < 0) touch[it.range].first = t;
    RowRange q = it.q;
    while (q.size() > 0) {
      skip_full();
      int64_t cut = q.end;
      if (t + 1 < T && done + pairs_of(q, it.kv) > target[t] + 0.5) {
        cut = planner_internal::CutRowNear(q, it.kv, pairs_of, target[t] - done);
      }
      if (cut > q.begin) {
        const RowRange part{q.begin, cut};
        const double work = pairs_of(part, it.kv);
        if (work > 0) {  // masks: a part may see none of kv
          StepAt(pass, t).computes.push_back(ComputeOp{part, it.kv});
          if (it.range >= 0) touch[it.range].last = t;
        }
        done += work;
        q.begin = cut;
      } else {
        ++t;  // less than one row fits: the step is full
      }
    }
  }
  return touch;
}

}  // namespace

bool CutRingApplies(const PlanRequest& r, const CutRingOptions& o) {
  return r.workers >= 2 && r.seq_len / 2 >= 4 * int64_t{r.workers} && o.steps_factor >= 1 &&
         o.steps_factor <= 8 && o.pieces_per_step > 0 && o.pieces_per_step <= 8;
}

Plan MakeCutRingPlan(const PlanRequest& r, const CutRingOptions& o) {
  const int P = r.workers;
  const int64_t S = r.seq_len;
  const int64_t F = S / 2, B = S - F;
  Plan plan;
  plan.schedule = "balanced";
  plan.seq_len = S;
  plan.causal = r.causal;
  plan.mask_spec = r.mask_spec;
  plan.workers.resize(P);
  std::vector<double> speeds = r.speeds;
  if (speeds.empty()) speeds.assign(P, 1.0);
  const std::vector<int64_t> fc = planner_internal::ProportionalCuts(F, speeds, 1);
  const std::vector<int64_t> bc = planner_internal::ProportionalCuts(B, speeds, 1);
  int64_t x_min = F;
  for (int i = 0; i < P; ++i) {
    plan.workers[i].owned = {RowRange{fc[i], fc[i + 1]}, RowRange{S - bc[i + 1], S - bc[i]}};
    x_min = std::min(x_min, fc[i + 1] - fc[i]);
  }
  const int T = static_cast<int>(std::clamp<double>(
      std::ceil(o.steps_factor * static_cast<double>(F) / static_cast<double>(x_min)), 2, 4096));
  const double piece = std::max(1.0, static_cast<double>(F) / (T * o.pieces_per_step));
  // Ranges (front and back of each piece), grouped by owner in piece order.
  std::vector<Range> ranges;
  std::vector<std::vector<int>> of_owner(P);
  for (int i = 0; i < P; ++i) {
    const int64_t x = fc[i + 1] - fc[i];
    const int64_t n = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(x / piece)), 1, x);
    for (int64_t k = 0; k < n; ++k) {
      const RowRange front{fc[i] + x * k / n, fc[i] + x * (k + 1) / n};
      const int64_t y = bc[i + 1] - bc[i];
      const RowRange back{S - (bc[i] + y * (k + 1) / n), S - (bc[i] + y * k / n)};
      for (const RowRange& rr : {front, back}) {
        if (rr.size() <= 0) continue;
        of_owner[i].push_back(static_cast<int>(ranges.size()));
        ranges.push_back(Range{i, rr});
      }
    }
  }
  auto order_of = [&](int i) {
    std::vector<int> order;
    for (int d = 1; d < P; ++d) {
      const int j = (i - d + P) % P;
      order.insert(order.end(), of_owner[j].begin(), of_owner[j].end());
    }
    return order;
  };
  // Routes one pass: range g travels owner -> owner+1 -> ... up to the last worker of its chain
  // that computes with it; worker i receives it from i-1 when it reaches it in its list. Returns
  // false when i-1 would not hold it by then (T too small).
  auto route = [&](bool fwd) {
    std::vector<std::vector<Touch>> touch(P);
    for (int i = 0; i < P; ++i) {
      touch[i] = CutList(plan, i, fwd, ranges, order_of(i), T,
                         fwd ? plan.workers[i].forward : plan.workers[i].backward);
    }
    const PlanTensor tensor = fwd ? PlanTensor::kKV : PlanTensor::kGradIn;
    for (size_t g = 0; g < ranges.size(); ++g) {
      const int j = ranges[g].owner;
      int last_needed = 0;  // distance along the chain of the last worker that computes with it
      for (int d = 1; d < P; ++d) {
        if (touch[(j + d) % P][g].last >= 0) last_needed = d;
      }
      for (int d = 1; d <= last_needed; ++d) {
        const int i = (j + d) % P, pred = (i + P - 1) % P;
        const int step = touch[i][g].first;
        if (d > 1 && touch[pred][g].first >= step) return false;
        auto& to = fwd ? plan.workers[i].forward : plan.workers[i].backward;
        auto& from = fwd ? plan.workers[pred].forward : plan.workers[pred].backward;
        StepAt(from, step).sends.push_back(Transfer{i, tensor, ranges[g].rows});
        StepAt(to, step).recvs.push_back(Transfer{pred, tensor, ranges[g].rows});
        if (!fwd && touch[i][g].last >= 0) {  // dQ partial home after its last use
          const int home = touch[i][g].last + 1;
          StepAt(plan.workers[i].backward, home)
              .sends.push_back(Transfer{j, PlanTensor::kDqPartial, ranges[g].rows});
          StepAt(plan.workers[j].backward, home)
              .recvs.push_back(Transfer{i, PlanTensor::kDqPartial, ranges[g].rows});
        }
      }
    }
    return true;
  };
  bool ok = route(/*fwd=*/true);
  if (ok && o.kv_stationary_backward) ok = route(/*fwd=*/false);
  if (!ok) return Plan{};
  planner_internal::EqualizeSteps(plan);
  if (o.kv_stationary_backward) {
    size_t n = 0;
    for (const WorkerPlan& w : plan.workers) n = std::max(n, w.backward.size());
    for (WorkerPlan& w : plan.workers) w.backward.resize(n);
  }
  return plan;
}

}  // namespace dfa
