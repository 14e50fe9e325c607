// Schedule "heads" (DeepSpeed-Ulysses-style head parallelism, plan.h "Head groups") and
// schedule "auto" (the cheaper of "balanced" and "heads" under the request's cost profile).
//
// "heads": the P workers form g head groups of P/g workers (g = the largest divisor of P with
// g <= kv_heads): consecutive workers, or, with unequal speeds when that evens the load better,
// workers dealt by speed. Group i holds the key/value heads [h_i, h_i + n_i) (n_i >= 1, the
// counts as equal as the speeds allow: each next head goes to the group with the least
// (n + 1) / summed speed), and its P/g workers run the "balanced" sequence plan for the group's
// local shape over all S rows. With P = g every worker holds all rows of its heads and the plan
// moves nothing between workers: one S x S unit per pass (docs/planner.md, "Head groups").
#include <algorithm>
#include <limits>
#include <map>
#include <utility>

#include "coordinator/planner/cost_model.h"
#include "coordinator/planner/plan_builder.h"
#include "coordinator/planner/planner.h"

namespace dfa {
namespace {

// Head counts per group (each >= 1, sum kv_heads), minimising max(count / group speed).
std::vector<int> HeadCounts(int kv_heads, const std::vector<double>& group_speeds) {
  const size_t g = group_speeds.size();
  std::vector<int> n(g, 1);
  for (int left = kv_heads - static_cast<int>(g); left > 0; --left) {
    size_t best = 0;
    for (size_t i = 1; i < g; ++i) {
      if ((n[i] + 1) / group_speeds[i] < (n[best] + 1) / group_speeds[best] * (1 - 1e-12)) best = i;
    }
    ++n[best];
  }
  return n;
}

// The workers of each head group (ascending), the groups' kv head counts and the largest
// heads / summed speed of a group (the compute bound the grouping gives).
struct Grouping {
  std::vector<std::vector<int>> members;
  std::vector<int> counts;
  double max_load = 0;
};

Grouping Finish(const PlanRequest& r, std::vector<std::vector<int>> members) {
  Grouping g;
  std::vector<double> speed(members.size(), 0);
  for (size_t i = 0; i < members.size(); ++i) {
    std::sort(members[i].begin(), members[i].end());
    for (int w : members[i]) speed[i] += r.speeds.empty() ? 1.0 : r.speeds[w];
  }
  g.counts = HeadCounts(r.shape.kv_heads, speed);
  for (size_t i = 0; i < members.size(); ++i) {
    g.max_load = std::max(g.max_load, g.counts[i] / speed[i]);
  }
  g.members = std::move(members);
  return g;
}

// Groups of consecutive workers (the default: a host's GPUs stay together).
Grouping ConsecutiveGroups(const PlanRequest& r, int groups) {
  const int per_group = r.workers / groups;
  std::vector<std::vector<int>> members(groups);
  for (int w = 0; w < r.workers; ++w) members[w / per_group].push_back(w);
  return Finish(r, std::move(members));
}

// Unequal speeds: workers dealt fastest first to the group with the least summed speed that has
// room, so that the groups' speeds (and head counts) come out as even as they can.
Grouping SpeedDealtGroups(const PlanRequest& r, int groups) {
  const int per_group = r.workers / groups;
  std::vector<int> order(r.workers);
  for (int w = 0; w < r.workers; ++w) order[w] = w;
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return r.speeds[a] > r.speeds[b]; });
  std::vector<std::vector<int>> members(groups);
  std::vector<double> sum(groups, 0);
  for (int w : order) {
    int best = -1;
    for (int i = 0; i < groups; ++i) {
      if (static_cast<int>(members[i].size()) < per_group && (best < 0 || sum[i] < sum[best])) {
        best = i;
      }
    }
    members[best].push_back(w);
    sum[best] += r.speeds[w];
  }
  return Finish(r, std::move(members));
}

// Forward + backward makespan under the request's profile; the cpu profile charges
// kSearchOpOverheadSeconds per op, as the balanced search does.
double TrueSeconds(const Plan& plan, const PlanRequest& r) {
  absl::StatusOr<CostParams> params = CostParamsForProfile(r.profile, r.shape, r.speeds);
  if (!params.ok()) return std::numeric_limits<double>::infinity();
  if (r.profile == "cpu") params->op_overhead_seconds = kSearchOpOverheadSeconds;
  absl::StatusOr<PlanCost> cost = EstimateCost(plan, *params);
  if (!cost.ok()) return std::numeric_limits<double>::infinity();
  return cost->forward.makespan_seconds + cost->backward.makespan_seconds;
}

}  // namespace

int HeadGroupCount(const PlanRequest& r) {
  for (int g = std::min(r.workers, r.shape.kv_heads); g > 1; --g) {
    if (r.workers % g == 0) return g;
  }
  return 1;
}

Plan MakeHeadsPlan(const PlanRequest& r, int groups) {
  PlanRequest balanced = r;
  balanced.schedule = "balanced";
  if (groups <= 1 || r.workers % groups != 0 || groups > r.shape.kv_heads) {
    absl::StatusOr<Plan> plan = MakePlan(balanced);
    if (!plan.ok()) return Plan{};
    plan->schedule = "heads";
    return *std::move(plan);
  }
  const int per_group = r.workers / groups;
  Grouping grouping = ConsecutiveGroups(r, groups);
  if (!r.speeds.empty()) {
    Grouping dealt = SpeedDealtGroups(r, groups);
    if (dealt.max_load < grouping.max_load * (1 - 1e-9)) grouping = std::move(dealt);
  }
  const std::vector<int>& counts = grouping.counts;
  const int q_per_kv = r.shape.q_heads / r.shape.kv_heads;
  Plan plan;
  plan.schedule = "heads";
  plan.seq_len = r.seq_len;
  plan.causal = r.causal;
  plan.workers.resize(r.workers);
  // Groups with the same speeds and head count get the same sub-plan: searched once.
  std::map<std::pair<int, std::vector<double>>, Plan> made;
  int head = 0;
  for (int i = 0; i < groups; ++i) {
    const std::vector<int>& members = grouping.members[i];
    PlanRequest sub = balanced;
    sub.workers = per_group;
    if (!r.speeds.empty()) {
      sub.speeds.clear();
      for (int m : members) sub.speeds.push_back(r.speeds[m]);
    }
    sub.shape.kv_heads = counts[i];
    sub.shape.q_heads = counts[i] * q_per_kv;
    auto [it, added] = made.try_emplace({counts[i], sub.speeds});
    if (added) {
      absl::StatusOr<Plan> part = MakePlan(sub);
      if (!part.ok()) return Plan{};
      it->second = *std::move(part);
    }
    const Plan& part = it->second;
    for (int k = 0; k < per_group; ++k) {
      WorkerPlan w = part.workers[k];
      w.kv_heads = HeadRange{head, head + counts[i]};
      for (auto* pass : {&w.forward, &w.backward}) {
        for (PlanStep& s : *pass) {
          for (auto* list : {&s.sends, &s.recvs}) {
            for (Transfer& x : *list) x.peer = members[x.peer];
          }
        }
      }
      plan.workers[members[k]] = std::move(w);
    }
    head += counts[i];
  }
  // Groups may have made different step counts: pad every worker's passes alike.
  size_t fwd = 0, bwd = 0;
  for (const WorkerPlan& w : plan.workers) {
    fwd = std::max(fwd, w.forward.size());
    bwd = std::max(bwd, w.backward.size());
  }
  for (WorkerPlan& w : plan.workers) {
    w.forward.resize(fwd);
    w.backward.resize(bwd);
  }
  return plan;
}

Plan MakeHeadsPlan(const PlanRequest& r) { return MakeHeadsPlan(r, HeadGroupCount(r)); }

Plan MakeAutoPlan(const PlanRequest& r) {
  PlanRequest balanced = r;
  balanced.schedule = "balanced";
  absl::StatusOr<Plan> best = MakePlan(balanced);
  if (!best.ok()) return Plan{};
  double best_seconds = TrueSeconds(*best, r);
  // Every head split whose groups each get >= 1 head: g | P, 2 <= g <= kv_heads.
  for (int g = 2; g <= std::min(r.workers, r.shape.kv_heads); ++g) {
    if (r.workers % g != 0) continue;
    Plan heads = MakeHeadsPlan(r, g);
    if (heads.workers.empty()) continue;
    const double seconds = TrueSeconds(heads, r);
    if (seconds < best_seconds * (1 - 1e-9)) {
      best = std::move(heads);
      best_seconds = seconds;
    }
  }
  return *std::move(best);
}

}  // namespace dfa
