// Plain ring over contiguous shards: at step t, worker i computes its queries against the K/V
// chunk of worker i-t, which worker i-1 forwards to it. Causal: chunks travel only "up" (a chunk
// j is forwarded while a later worker still needs it), so worker P-1 does P units of work and
// worker 0 half of one: makespan/ideal -> (2P-1)/P.
#include "core/planner/plan_builder.h"
#include "core/planner/planner.h"

namespace dfa {

using planner_internal::AddForwardCompute;
using planner_internal::AddForwardTransfer;

Plan MakeRingPlan(const PlanRequest& r) {
  const int P = r.workers;
  Plan plan;
  plan.schedule = "ring";
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
  for (int t = 1; t < P; ++t) {
    for (int j = 0; j < P; ++j) {
      if (r.causal && j + t >= P) continue;  // nobody after P-1 needs chunk j
      const int from = (j + t - 1) % P, to = (j + t) % P;
      AddForwardTransfer(plan, t, from, to, PlanTensor::kKV, chunk(j));
      AddForwardCompute(plan, t, to, chunk(to), chunk(j));
    }
  }
  planner_internal::PruneInvisible(plan);
  return plan;
}

}  // namespace dfa
