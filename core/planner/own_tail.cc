// OwnTailBackward (plan_builder.h): a share of each worker's backward work on its own rows moved
// to the step whose partials end the pass, so that they travel while it computes.
#include <algorithm>
#include <vector>

#include "core/planner/plan_builder.h"

namespace dfa::planner_internal {

void OwnTailBackward(Plan& plan, double fraction) {
  if (!plan.rank_workers.empty() || !(fraction > 0)) return;
  const UnitPairs visible(plan);
  for (WorkerPlan& w : plan.workers) {
    auto owned = [&](const RowRange& x) {
      for (const RowRange& o : w.owned) {
        if (o.Contains(x)) return true;
      }
      return false;
    };
    std::vector<PlanStep>& pass = w.backward;
    int last = -1;  // the last step with computes
    double total = 0;
    for (size_t t = 0; t < pass.size(); ++t) {
      for (const ComputeOp& c : pass[t].computes) {
        last = static_cast<int>(t);
        if (owned(c.q_rows) && owned(c.kv_rows)) total += visible(c.q_rows, c.kv_rows);
      }
    }
    if (last < 0 || total <= 0) continue;
    // Taken from the latest own computes first (the tail of the last one cut by query rows).
    double move = std::min(1.0, fraction) * total;
    std::vector<ComputeOp> moved;
    for (int t = last; t >= 0 && move > 0; --t) {
      std::vector<ComputeOp>& ops = pass[t].computes;
      for (int k = static_cast<int>(ops.size()) - 1; k >= 0 && move > 0; --k) {
        const ComputeOp c = ops[k];
        if (!owned(c.q_rows) || !owned(c.kv_rows)) continue;
        const double work = visible(c.q_rows, c.kv_rows);
        if (work <= move) {
          moved.push_back(c);
          ops.erase(ops.begin() + k);
          move -= work;
          continue;
        }
        const int64_t cut = CutRowNear(c.q_rows, c.kv_rows, visible, work - move);
        move = 0;
        if (cut <= c.q_rows.begin || cut >= c.q_rows.end) break;
        const RowRange head{c.q_rows.begin, cut}, tail{cut, c.q_rows.end};
        ops.erase(ops.begin() + k);
        for (const RowRange& q : {head, tail}) {
          const RowRange kv = visible.KeysSeen(q, c.kv_rows);
          if (kv.size() <= 0) continue;
          // (KeysSeen narrows a dense op only where no key is visible: the pairs are the same.)
          const ComputeOp piece{q, visible.dense() ? c.kv_rows : kv};
          if (q.begin == cut) {
            moved.push_back(piece);
          } else {
            ops.insert(ops.begin() + k, piece);
          }
        }
      }
    }
    if (moved.empty()) continue;
    // The step after the last compute: the one whose partials (sent after the last computes)
    // end the pass; a new one where the last compute step is the pass's last.
    const size_t to = static_cast<size_t>(last) + 1;
    if (to >= pass.size()) pass.resize(to + 1);
    std::reverse(moved.begin(), moved.end());
    for (const ComputeOp& c : moved) pass[to].computes.push_back(c);
  }
  size_t steps = 0;  // (every worker's backward as long again)
  for (const WorkerPlan& w : plan.workers) steps = std::max(steps, w.backward.size());
  for (WorkerPlan& w : plan.workers) w.backward.resize(steps);
}

}  // namespace dfa::planner_internal
