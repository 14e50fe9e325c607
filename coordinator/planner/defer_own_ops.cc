// planner_internal::DeferOwnOps (plan_builder.h).
#include <vector>

#include "coordinator/planner/plan_builder.h"

namespace dfa::planner_internal {
namespace {

bool Owned(const std::vector<RowRange>& owned, const RowRange& rows) {
  for (const RowRange& r : owned) {
    if (r.Contains(rows)) return true;
  }
  return false;
}

}  // namespace

bool DeferOwnOps(Plan& plan, bool forward, int keep) {
  bool moved = false;
  for (WorkerPlan& w : plan.workers) {
    std::vector<PlanStep>& pass = forward ? w.forward : w.backward;
    const int last = static_cast<int>(pass.size()) - 1;
    int first = 0;
    while (first <= last && pass[first].computes.empty()) ++first;
    if (first >= last) continue;  // one computing step (or none): nothing to overlap
    std::vector<ComputeOp> stay, defer;
    int own = 0;
    for (const ComputeOp& op : pass[first].computes) {
      const bool own_only = Owned(w.owned, op.q_rows) && Owned(w.owned, op.kv_rows);
      if (own_only && own++ >= keep) {
        defer.push_back(op);
      } else {
        stay.push_back(op);
      }
    }
    if (defer.empty()) continue;
    pass[first].computes = std::move(stay);
    for (const ComputeOp& op : defer) pass[last].computes.push_back(op);
    moved = true;
  }
  return moved;
}

}  // namespace dfa::planner_internal
