// Zigzag (striped) ring: the sequence is cut into 2P chunks and worker i owns chunks i and
// 2P-1-i, so under the causal mask every worker has the same work in every step. The K/V pair
// of worker i-t reaches worker i at step t, forwarded around the ring (as ring-flash-attention's
// zigzag does); worker i computes every visible (own query chunk, K/V chunk) unit with it.
#include "core/planner/plan_builder.h"
#include "core/planner/planner.h"

namespace dfa {

using planner_internal::AddForwardCompute;
using planner_internal::AddForwardTransfer;

Plan MakeZigzagPlan(const PlanRequest& r) {
  const int P = r.workers;
  Plan plan;
  plan.schedule = "zigzag";
  plan.seq_len = r.seq_len;
  plan.causal = r.causal;
  plan.mask_spec = r.mask_spec;
  plan.workers.resize(P);
  auto chunk = [&](int c) {
    return RowRange{ChunkBoundary(r.seq_len, 2 * P, c), ChunkBoundary(r.seq_len, 2 * P, c + 1)};
  };
  auto chunks_of = [&](int i) { return std::vector<RowRange>{chunk(i), chunk(2 * P - 1 - i)}; };
  for (int i = 0; i < P; ++i) plan.workers[i].owned = chunks_of(i);
  const UnitPairs unit_pairs(plan);
  auto add_units = [&](int t, int i, int j) {
    for (const RowRange& q : chunks_of(i)) {
      for (const RowRange& kv : chunks_of(j)) {
        if (unit_pairs(q, kv) > 0) {
          AddForwardCompute(plan, t, i, q, kv);
        }
      }
    }
  };
  for (int i = 0; i < P; ++i) add_units(0, i, i);
  for (int t = 1; t < P; ++t) {
    for (int j = 0; j < P; ++j) {
      const int from = (j + t - 1) % P, to = (j + t) % P;
      for (const RowRange& kv : chunks_of(j)) {
        AddForwardTransfer(plan, t, from, to, PlanTensor::kKV, kv);
      }
      add_units(t, to, j);
    }
  }
  planner_internal::PruneInvisible(plan);
  return plan;
}

}  // namespace dfa
