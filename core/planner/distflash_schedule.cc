// The DistFlashAttn paper's Algorithm 2 (load-balanced causal schedule), even P, contiguous
// shards, P/2+1 forward steps:
//   step 0: every worker computes its diagonal unit (r, r).
//   step t in 1..P/2: worker r >= t computes (r, r-t) with K/V sent to it by worker r-t;
//     a worker r < t is a helper (for t < P/2): worker r+P-t sends it its Q, the helper computes
//     (r+P-t, r) against its own K/V and returns the partial (O, LSE) at step t+1.
//     At t = P/2 the helpers idle (their unit (r+P/2, r) is the owner's unit at distance P/2).
// Full (non-causal) attention: the same routing for the lower triangle, mirrored for the upper
// one (worker r computes (r, r+t) with K/V from r+t, helpers r >= P-t take Q of r+t-P), which
// is the paper's scheme applied to both triangles.
#include "core/planner/plan_builder.h"
#include "core/planner/planner.h"

namespace dfa {

using planner_internal::AddForwardCompute;
using planner_internal::AddForwardTransfer;

Plan MakeDistFlashPlan(const PlanRequest& r) {
  const int P = r.workers;
  Plan plan;
  plan.schedule = "distflash";
  plan.seq_len = r.seq_len;
  plan.causal = r.causal;
  plan.mask_spec = r.mask_spec;
  plan.workers.resize(P);
  auto chunk = [&](int i) {
    return RowRange{ChunkBoundary(r.seq_len, P, i), ChunkBoundary(r.seq_len, P, i + 1)};
  };
  for (int i = 0; i < P; ++i) {
    plan.workers[i].owned = {chunk(i)};
    AddForwardCompute(plan, 0, i, chunk(i), chunk(i));
  }
  // `mirror` maps worker index x to P-1-x: the upper triangle of full attention is the lower
  // triangle of the reversed sequence.
  const int triangles = r.causal ? 1 : 2;
  for (int tri = 0; tri < triangles; ++tri) {
    auto m = [&](int x) { return tri == 0 ? x : P - 1 - x; };
    for (int t = 1; t <= P / 2; ++t) {
      for (int x = t; x < P; ++x) {  // owner computes (x, x-t)
        AddForwardTransfer(plan, t, m(x - t), m(x), PlanTensor::kKV, chunk(m(x - t)));
        AddForwardCompute(plan, t, m(x), chunk(m(x)), chunk(m(x - t)));
      }
      if (t == P / 2) continue;
      for (int h = 0; h < t; ++h) {  // helper h computes (h+P-t, h)
        const int q = h + P - t;
        AddForwardTransfer(plan, t, m(q), m(h), PlanTensor::kQ, chunk(m(q)));
        AddForwardCompute(plan, t, m(h), chunk(m(q)), chunk(m(h)));
        AddForwardTransfer(plan, t + 1, m(h), m(q), PlanTensor::kOutPartial, chunk(m(q)));
      }
    }
  }
  planner_internal::PruneInvisible(plan);
  return plan;
}

}  // namespace dfa
