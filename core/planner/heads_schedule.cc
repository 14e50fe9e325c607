// Schedule "heads" (DeepSpeed-Ulysses-style head parallelism, plan.h "Head groups") and
// schedule "auto" (the cheaper of "balanced" and "heads" under the request's cost profile).
//
// "heads": the P workers form g head groups of P/g workers (g = the largest divisor of P with
// g <= kv_heads): consecutive workers, or, with unequal speeds when that evens the load better,
// workers dealt by speed. Group i holds the key/value heads [h_i, h_i + n_i) (n_i >= 1, the
// counts as equal as the speeds allow: each next head goes to the group with the least
// (n + 1) / summed speed), and its P/g workers run the "balanced" sequence plan for the group's
// local shape over all S rows. With P = g every worker holds all rows of its heads and the plan
// moves nothing between workers: one S x S unit per pass (docs/planner.md, "Schedules").
#include <algorithm>
#include <limits>
#include <map>
#include <tuple>
#include <utility>

#include "core/planner/cost_model.h"
#include "core/planner/plan_builder.h"
#include "core/planner/planner.h"

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

// Speed-balanced groups of any worker counts (SpeedBalancedHeadGroups): how even a membership
// is once the heads are dealt by the groups' summed speeds (HeadCounts): the largest
// heads / speed first, then the squared distance of the groups' speed shares from their head
// shares (to move towards an exact split while the largest load does not change).
struct Evenness {
  double max_load = std::numeric_limits<double>::infinity();
  double spread = std::numeric_limits<double>::infinity();
};

Evenness Measure(int kv_heads, const std::vector<double>& sums, double total) {
  const std::vector<int> counts = HeadCounts(kv_heads, sums);
  Evenness e{0, 0};
  for (size_t i = 0; i < sums.size(); ++i) {
    e.max_load = std::max(e.max_load, counts[i] / sums[i]);
    const double d = sums[i] / total - static_cast<double>(counts[i]) / kv_heads;
    e.spread += d * d;
  }
  return e;
}

bool MoreEven(const Evenness& a, const Evenness& b) {
  if (a.max_load < b.max_load * (1 - 1e-12)) return true;
  return a.max_load <= b.max_load * (1 + 1e-12) && a.spread < b.spread * (1 - 1e-9) - 1e-15;
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

HeadGroupSplit SpeedBalancedHeadGroups(const PlanRequest& r, int groups) {
  const int P = r.workers, K = r.shape.kv_heads;
  if (groups < 2 || groups > std::min(P, K)) return HeadGroupSplit{};
  auto speed = [&](int w) { return r.speeds.empty() ? 1.0 : r.speeds[w]; };
  double total = 0;
  for (int w = 0; w < P; ++w) total += speed(w);
  // Heads as even as g allows; each group's speed target follows its heads.
  std::vector<double> target(groups);
  for (int i = 0; i < groups; ++i) target[i] = total * (K / groups + (i < K % groups)) / K;
  std::vector<int> order(P);
  for (int w = 0; w < P; ++w) order[w] = w;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return speed(a) > speed(b); });
  std::vector<std::vector<int>> members(groups);
  std::vector<double> sum(groups, 0);
  for (int w : order) {  // largest first into the group with the most capacity left
    int best = 0;
    for (int i = 1; i < groups; ++i) {
      if (target[i] - sum[i] > target[best] - sum[best]) best = i;
    }
    members[best].push_back(w);
    sum[best] += speed(w);
  }
  for (int i = 0; i < groups; ++i) {  // no empty group: take the slowest of the largest group
    if (!members[i].empty()) continue;
    int from = 0;
    for (int j = 1; j < groups; ++j) {
      if (members[j].size() > members[from].size()) from = j;
    }
    members[i].push_back(members[from].back());  // dealt largest first: the slowest is last
    members[from].pop_back();
    sum[i] = speed(members[i][0]);
    sum[from] -= sum[i];
  }
  // Single moves and pairwise swaps while they make the groups more even (bounded).
  Evenness now = Measure(K, sum, total);
  for (int round = 0; round < 4 * P; ++round) {
    bool improved = false;
    for (int a = 0; a < groups && !improved; ++a) {
      for (int b = 0; b < groups && !improved; ++b) {
        if (a == b) continue;
        for (size_t x = 0; x < members[a].size() && !improved; ++x) {
          const double sx = speed(members[a][x]);
          if (members[a].size() > 1) {  // move x from a to b
            std::vector<double> next = sum;
            next[a] -= sx;
            next[b] += sx;
            const Evenness e = Measure(K, next, total);
            if (MoreEven(e, now)) {
              members[b].push_back(members[a][x]);
              members[a].erase(members[a].begin() + static_cast<long>(x));
              sum = std::move(next);
              now = e;
              improved = true;
              break;
            }
          }
          for (size_t y = 0; y < members[b].size(); ++y) {  // swap x (in a) and y (in b)
            const double sy = speed(members[b][y]);
            if (sy >= sx) continue;  // each unordered swap once: the faster one leaves a
            std::vector<double> next = sum;
            next[a] += sy - sx;
            next[b] += sx - sy;
            const Evenness e = Measure(K, next, total);
            if (MoreEven(e, now)) {
              std::swap(members[a][x], members[b][y]);
              sum = std::move(next);
              now = e;
              improved = true;
              break;
            }
          }
        }
      }
    }
    if (!improved) break;
  }
  HeadGroupSplit out;
  out.kv_heads = HeadCounts(K, sum);
  for (std::vector<int>& m : members) std::sort(m.begin(), m.end());
  out.members = std::move(members);
  return out;
}

double HeadGroupsLoad(const PlanRequest& r, const HeadGroupSplit& groups) {
  double total = 0, worst = 0;
  for (size_t i = 0; i < groups.members.size(); ++i) {
    double sum = 0;
    for (int w : groups.members[i]) sum += r.speeds.empty() ? 1.0 : r.speeds[w];
    total += sum;
    if (i < groups.kv_heads.size() && sum > 0) worst = std::max(worst, groups.kv_heads[i] / sum);
  }
  return total > 0 && r.shape.kv_heads > 0 ? worst * total / r.shape.kv_heads : 0;
}

int HeadGroupCount(const PlanRequest& r) {
  for (int g = std::min(r.workers, r.shape.kv_heads); g > 1; --g) {
    if (r.workers % g == 0) return g;
  }
  return 1;
}

Plan MakeHeadsPlan(const PlanRequest& r, int groups) {
  if (groups <= 1 || r.workers % groups != 0 || groups > r.shape.kv_heads) {
    PlanRequest balanced = r;
    balanced.schedule = "balanced";
    balanced.session_shape = PlanRequest{}.session_shape;
    absl::StatusOr<Plan> plan = MakePlan(balanced);
    if (!plan.ok()) return Plan{};
    plan->schedule = "heads";
    return *std::move(plan);
  }
  Grouping grouping = ConsecutiveGroups(r, groups);
  if (!r.speeds.empty()) {
    Grouping dealt = SpeedDealtGroups(r, groups);
    if (dealt.max_load < grouping.max_load * (1 - 1e-9)) grouping = std::move(dealt);
  }
  return MakeHeadsPlan(r, HeadGroupSplit{std::move(grouping.members), std::move(grouping.counts)});
}

Plan MakeHeadsPlan(const PlanRequest& r, const HeadGroupSplit& groups) {
  const size_t g = groups.members.size();
  if (g == 0 || groups.kv_heads.size() != g) return Plan{};
  {  // Every worker in exactly one group, every group with workers and >= 1 head, all heads.
    std::vector<int> seen(r.workers, 0);
    int heads = 0;
    for (size_t i = 0; i < g; ++i) {
      if (groups.members[i].empty() || groups.kv_heads[i] < 1) return Plan{};
      heads += groups.kv_heads[i];
      for (int m : groups.members[i]) {
        if (m < 0 || m >= r.workers || seen[m]++ > 0) return Plan{};
      }
    }
    if (heads != r.shape.kv_heads ||
        std::count(seen.begin(), seen.end(), 1) != static_cast<long>(r.workers)) {
      return Plan{};
    }
  }
  PlanRequest balanced = r;
  balanced.schedule = "balanced";
  balanced.session_shape = PlanRequest{}.session_shape;  // the groups' plans are sequence plans
  const std::vector<int>& counts = groups.kv_heads;
  const int q_per_kv = r.shape.q_heads / r.shape.kv_heads;
  Plan plan;
  plan.schedule = "heads";
  plan.seq_len = r.seq_len;
  plan.causal = r.causal;
  plan.mask_spec = r.mask_spec;
  plan.workers.resize(r.workers);
  // Groups with the same worker count, speeds and head count get the same sub-plan: searched
  // once. (Without explicit speeds, sub.speeds is empty for every group: the count keeps
  // groups of different sizes apart.)
  std::map<std::tuple<int, int, std::vector<double>>, Plan> made;
  int head = 0;
  for (size_t i = 0; i < g; ++i) {
    const std::vector<int>& members = groups.members[i];
    const int per_group = static_cast<int>(members.size());
    PlanRequest sub = balanced;
    sub.workers = per_group;
    if (!r.speeds.empty()) {
      sub.speeds.clear();
      for (int m : members) sub.speeds.push_back(r.speeds[m]);
    }
    sub.shape.kv_heads = counts[i];
    sub.shape.q_heads = counts[i] * q_per_kv;
    auto [it, added] = made.try_emplace({counts[i], per_group, sub.speeds});
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
  // Every head split whose groups each get >= 1 head: g | P, 2 <= g <= kv_heads. A split as
  // fast as "balanced" wins the tie ("balanced" with session_shape may itself pick head groups;
  // the named split is the same plan under its own schedule).
  for (int g = 2; g <= std::min(r.workers, r.shape.kv_heads); ++g) {
    if (r.workers % g != 0) continue;
    Plan heads = MakeHeadsPlan(r, g);
    if (heads.workers.empty()) continue;
    const double seconds = TrueSeconds(heads, r);
    if (seconds <= best_seconds * (1 + 1e-9)) {
      best = std::move(heads);
      best_seconds = seconds;
    }
  }
  return *std::move(best);
}

}  // namespace dfa
