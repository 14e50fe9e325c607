// Small helpers the schedule files share to build a Plan (internal to the planner).
#pragma once

#include "core/planner/cost_model.h"
#include "core/planner/plan.h"

namespace dfa::planner_internal {

// The step `t` of a worker's pass, growing the pass as needed.
inline PlanStep& StepAt(std::vector<PlanStep>& pass, int t) {
  if (static_cast<int>(pass.size()) <= t) pass.resize(t + 1);
  return pass[t];
}

// Adds a matched send (on `from`) and recv (on `to`) at forward step t.
inline void AddForwardTransfer(Plan& plan, int t, int from, int to, PlanTensor tensor,
                               RowRange rows) {
  StepAt(plan.workers[from].forward, t).sends.push_back(Transfer{to, tensor, rows});
  StepAt(plan.workers[to].forward, t).recvs.push_back(Transfer{from, tensor, rows});
}

inline void AddForwardCompute(Plan& plan, int t, int worker, RowRange q, RowRange kv) {
  StepAt(plan.workers[worker].forward, t).computes.push_back(ComputeOp{q, kv});
}

// Relabels a plan made for workers in "slot" order: slot k becomes worker worker_of_slot[k]
// (a permutation of 0..P-1), peers included. A plan built for speeds s'[k] = s[worker_of_slot[k]]
// is then the same plan with the ring (and the layout) visiting the workers in that order.
void PermuteWorkers(Plan& plan, const std::vector<int>& worker_of_slot);

// A ring order of the workers that interleaves the slower half with the faster half (sorted by
// speed: s_(0), s_(h), s_(1), s_(h+1), ..., h = ceil(P/2)), so that no run of slow workers returns
// many partials to one fast owner in the same step (the striped ring's K/V-stationary
// backward). Returns worker_of_slot for PermuteWorkers.
std::vector<int> InterleavedRingOrder(const std::vector<double>& speeds);

// Cuts of [0, total) into parts proportional to `weights`: boundaries b[0] = 0 .. b[n] = total,
// each part >= `min_part` where total allows (0: parts may be empty).
std::vector<int64_t> ProportionalCuts(int64_t total, const std::vector<double>& weights,
                                      int64_t min_part);

// The row r in [q.begin, q.end] where the visible pairs of [q.begin, r) x kv are nearest to
// `need` (binary search; ties to the smaller r).
int64_t CutRowNear(const RowRange& q, const RowRange& kv, const UnitPairs& pairs, double need);

// Masked plans (Plan::dense() false): removes forward computes without a visible pair, then
// the partials they would have sent and the Q and K/V transfers their receiver neither uses nor
// forwards (repeated until none is left), so that fixed schedules (ring, distflash, zigzag) stay
// exact and plan no unit the mask hides. No-op for dense plans and plans with backward steps.
void PruneInvisible(Plan& plan);

// Pads every worker's forward pass to the same number of steps (empty steps are free).
void EqualizeSteps(Plan& plan);

// Replaces plan's backward steps with backward_source's (derived from its forward first when it
// has none), when both have the same workers, sequence, mask and layout (every worker's owned
// ranges); pads plan's forward steps. Returns false (plan unchanged) otherwise. Each pass reads
// only what its workers own (forward: Q, K/V; backward: Q, K/V, dO and the forward's O/LSE of
// the own rows) and moves everything else itself, so a valid forward and a valid backward over
// one layout make a valid plan (CheckPlan checks each pass on its own).
bool TakeBackwardFrom(Plan& plan, Plan backward_source);

// Moves transfers of one pass (forward or backward) to less loaded steps: owned Q/KV sends up to
// `window` steps earlier, partials up to `window` steps later, each to the step whose transfer
// window (one step's compute, as the executor overlaps them) is least full on both its links
// (transfer_balance.cc). Keeps a CheckPlan-valid plan valid; pads the pass's steps to equal
// length. No-op for window < 1, P < 2 or free communication.
void BalanceTransfers(Plan& plan, const CostParams& params, int window, bool forward);

// Moves `fraction` (<= 1) of each worker's backward work on its own rows only (queries and keys
// it owns: nothing awaited, no partial produced), from its latest such computes (the last one
// cut by query rows), to the step after its last compute: the step whose partials (the last
// dK/dV or dQ partials, sent after the last computes) end the pass, which then travel while it
// computes instead of after (own_tail.cc). Keeps a CheckPlan-valid plan valid (those computes
// read only owned data and add only into the worker's own accumulators). No-op for plans with
// virtual ranks.
void OwnTailBackward(Plan& plan, double fraction);

}  // namespace dfa::planner_internal
