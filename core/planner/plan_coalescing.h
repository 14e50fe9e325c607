// CoalesceTransfers: one message instead of several for adjacent rows. Plans cut K/V and
// query-side data at shard and chunk boundaries (a zigzag shard's two chunks, a striped ring's
// pieces), so one step often moves [a, b) and [b, c) of the same tensor between the same two
// workers. Merged, the receiver holds them in one buffer, and the executor can run the step's
// ops on them as one backend call (worker/executor/op_fusion.h): at 16K tokens on 2 GPUs the
// backward's two 4096-row helper units become one.
//
// Merges each worker's adjacent owned ranges, and, per worker, pass and step, sends (and the
// matching receives, by the same rule) to/from the same peer over adjacent rows of K/V, grad_in
// and the dQ / dK / dV partials they produce (Q and output partials stay apart). Only for batch
// 1 (where every component's row slices are contiguous). Returns the merged plan when CheckPlan
// accepts it (e.g. a partial is then produced and sent as one buffer), else the plan unchanged.
#pragma once

#include "core/planner/plan.h"

namespace dfa {

Plan CoalesceTransfers(const Plan& plan, const AttentionShape& shape);

}  // namespace dfa
