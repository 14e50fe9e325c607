// Straddled head groups (docs/planner.md "Schedules"): head groups whose summed speeds follow
// their head counts exactly. Laid end to end in worker order, the workers' speeds fill g
// intervals, group i the next total_speed · h_i / K of it; a worker on a boundary gives part of
// its speed to each of the two groups and runs one rank in each (plan.h "Virtual ranks"). Each
// group runs the "balanced" plan of its local shape at its ranks' speeds, so every worker's work
// is its share of the total, where whole-worker head groups are off by the rounding of workers
// to heads (33 workers, 32 heads: at best 1.031). At P = 33 with g = 2 each group is 16 heads
// over 16.5 workers, worker 16 half in each; the second group's plan is the first's read
// backwards, so worker 16 is the same half-speed slot in both and its two ranks take as long
// per step as that slot does in each group's plan (the cost model runs them in lock-step).
#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "core/planner/cost_model.h"
#include "core/planner/plan_builder.h"
#include "core/planner/planner.h"
#include "core/planner/rank_parts.h"

namespace dfa {
namespace {

// A boundary this close (as a fraction of the worker's speed) to a worker's edge snaps to it:
// no rank with a sliver of work (its messages would cost more than its compute saves).
constexpr double kMinStraddleShare = 0.05;

// The "balanced" plan of `heads` heads over workers at `shares` of speed (no workers: none).
Plan MakeGroup(const PlanRequest& r, int heads, const std::vector<double>& shares) {
  absl::StatusOr<Plan> sub =
      MakePlan(planner_internal::PartRequest(r, static_cast<int>(shares.size()), heads, shares));
  if (!sub.ok() || !sub->rank_workers.empty()) return Plan{};
  return *std::move(sub);
}

// `plan` with its workers in reverse order (worker k becomes n - 1 - k).
Plan Reversed(Plan plan) {
  const int n = plan.num_workers();
  std::vector<int> reversed(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) reversed[k] = n - 1 - k;
  planner_internal::PermuteWorkers(plan, reversed);
  return plan;
}

// Whether two groups' shares are the same up to rounding (a share is a difference of sums).
bool SameShares(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k) {
    if (std::abs(a[k] - b[k]) > 1e-9 * std::max(std::abs(a[k]), std::abs(b[k]))) return false;
  }
  return true;
}

}  // namespace

Plan MakeStraddledHeadsPlan(const PlanRequest& r, int groups) {
  const int P = r.workers, K = r.shape.kv_heads;
  if (groups < 2 || groups > std::min(P, K)) return Plan{};
  std::vector<double> speed(P, 1.0);
  if (!r.speeds.empty()) speed = r.speeds;
  // Worker w covers [edge[w], edge[w + 1]) of the speed line; group i covers [cut[i], cut[i+1]).
  std::vector<double> edge(P + 1, 0);
  for (int w = 0; w < P; ++w) edge[w + 1] = edge[w] + speed[w];
  std::vector<int> heads(groups, K / groups);
  for (int i = 0; i < K % groups; ++i) ++heads[i];
  std::vector<double> cut(groups + 1, 0);
  bool straddled = false;
  int before = 0;
  for (int i = 1; i <= groups; ++i) {
    before += heads[i - 1];
    cut[i] = edge[P] * before / K;
    if (i == groups) break;
    const int w =
        static_cast<int>(std::upper_bound(edge.begin(), edge.end(), cut[i]) - edge.begin()) -
        1;  // the worker the cut falls in
    if (cut[i] - edge[w] < kMinStraddleShare * speed[w]) {
      cut[i] = edge[w];
    } else if (edge[w + 1] - cut[i] < kMinStraddleShare * speed[w]) {
      cut[i] = edge[w + 1];
    } else {
      straddled = true;
    }
    if (cut[i] <= cut[i - 1]) return Plan{};  // a group with no worker
  }
  if (!straddled) return Plan{};  // whole-worker head groups (MakeHeadsPlan)
  // Per group its members and their shares of speed.
  std::vector<std::vector<int>> members(groups);
  std::vector<std::vector<double>> shares(groups);
  for (int i = 0; i < groups; ++i) {
    for (int w = 0; w < P; ++w) {
      const double share = std::min(edge[w + 1], cut[i + 1]) - std::max(edge[w], cut[i]);
      if (share <= 1e-9 * speed[w]) continue;
      members[i].push_back(w);
      shares[i].push_back(share);
    }
  }
  // One search per distinct (heads, shares), kept across both orientations.
  std::map<std::pair<int, std::vector<double>>, Plan> searched;
  auto search = [&](int h, const std::vector<double>& x) -> const Plan& {
    auto [it, added] = searched.try_emplace({h, x});
    if (added) it->second = MakeGroup(r, h, x);
    return it->second;
  };
  // The plan with each group's sub-plan made for its shares (flip false) or as the reverse of
  // the plan for its shares read backwards (flip true); a group whose shares read backwards are
  // an earlier group's (the two sides of a half-and-half straddler) gets that group's plan read
  // backwards, so the straddler's two ranks are the same slot of one plan: its steps take as
  // long in both, and with the two ranks together it runs at that slot's pace in each group.
  auto build = [&](bool flip) -> Plan {
    std::vector<Plan> made(groups);
    std::vector<planner_internal::RankPart> parts;
    int head = 0;
    for (int i = 0; i < groups; ++i) {
      const std::vector<double> mirrored(shares[i].rbegin(), shares[i].rend());
      int twin = -1;
      for (int j = 0; j < i && !SameShares(mirrored, shares[i]); ++j) {
        if (heads[j] == heads[i] && SameShares(shares[j], mirrored)) twin = j;
      }
      if (twin >= 0) {
        made[i] = Reversed(made[twin]);
      } else {
        const Plan& m = search(heads[i], flip ? mirrored : shares[i]);
        if (m.workers.empty()) return Plan{};
        made[i] = flip ? Reversed(m) : m;
      }
      planner_internal::RankPart part;
      part.members = members[i];
      part.head = head;
      part.heads = heads[i];
      head += heads[i];
      part.plan = made[i];
      parts.push_back(std::move(part));
    }
    return planner_internal::PlanOfRankParts(r, std::move(parts));
  };
  // Both orientations, the better under the request's profile (worse pass; gpu: total time).
  absl::StatusOr<CostParams> params = CostParamsForProfile(r.profile, r.shape, speed);
  if (!params.ok()) return Plan{};
  Plan best;
  double best_score = 0;
  for (bool flip : {false, true}) {
    Plan plan = build(flip);
    if (plan.workers.empty()) continue;
    absl::StatusOr<PlanCost> c = EstimateCost(plan, *params);
    if (!c.ok()) continue;
    const double score = r.profile == "gpu"
                             ? c->forward.makespan_seconds + c->backward.makespan_seconds
                             : std::max(c->forward.makespan_ratio, c->backward.makespan_ratio);
    if (best.workers.empty() || score < best_score) {
      best = std::move(plan);
      best_score = score;
    }
  }
  return best;
}

}  // namespace dfa
