// Plans with virtual ranks (plan.h "Virtual ranks") assembled from parts: each part a head
// range over all rows run by some workers, one rank per member (internal to the planner; used
// by shared_heads_schedule.cc and straddled_heads_schedule.cc).
#pragma once

#include <vector>

#include "core/planner/plan.h"
#include "core/planner/planner.h"

namespace dfa::planner_internal {

// One part: kv heads [head, head + heads) over all rows, run by `members` (workers, each at most
// once). `plan`: the part's plan over its members (worker k of it is members[k]; made at the
// ranks' shares of their workers' speeds), or no workers: a one-member part whose rank computes
// all rows of its heads in pieces of equal work per step.
struct RankPart {
  std::vector<int> members;
  int head = 0, heads = 0;
  Plan plan;
};

// The request for one part: `workers` workers at `speeds` (its ranks' shares of their workers'
// speeds), `kv_heads` heads of the request's shape, all rows, schedule "balanced", no head
// groups (session_shape unset).
PlanRequest PartRequest(const PlanRequest& request, int workers, int kv_heads,
                        std::vector<double> speeds);

// The plan of `parts` (schedule "balanced", Plan::rank_workers set): per worker its ranks in
// part order, peers mapped to ranks, every rank's passes at the longest part's step count T. A
// shorter part's step i of n goes to step i (T - 1) / (n - 1) with its transfers (a non-partial
// keeps its post step: its lead grows by the steps put between, so it travels behind as much
// compute as before) and its computes cut by query rows into pieces of about equal visible work
// over the steps up to the next one (what they read has arrived; what they produce is sent
// later), so every worker step has compute; a one-member part's rank computes its heads in T
// pieces of equal visible work (twice that in the forward's first step and the backward's last,
// where the first K/V and the last partials travel). The caller makes the parts valid (heads
// partitioning [0, kv_heads), every worker in some part).
Plan PlanOfRankParts(const PlanRequest& request, std::vector<RankPart> parts);

}  // namespace dfa::planner_internal
