// Memory a session holds on one worker, for admission control. The coordinator reserves this
// much on every placed worker before it opens the session there; the worker enforces its own
// limit again in OpenSession (RESOURCE_EXHAUSTED) with the same count at its own --step_tokens,
// and answers the bytes it reserved (the coordinator keeps the larger).
//
// The count is PlanWorkerMemory (core/planner/worker_memory.h; docs/memory.md): the storage
// (Q, K, V, dO in the session dtype, LSE, D, and a work region for O and the passes' fp32
// accumulators, as the plan needs it), the chunked backward's key chunk, and the executor's peak
// transfer buffers and partials: what the session will peak at.
#pragma once

#include <cstdint>

#include "core/planner/plan.h"
#include "core/planner/plan_checker.h"
#include "core/planner/worker_memory.h"
#include "core/spec_validation.h"  // ShapeOf
#include "dfa/v1/attention.pb.h"

namespace dfa {

// An upper estimate, in double precision (no overflow), of the bytes the whole session holds
// over all workers: Q, K, V, dO, LSE, D, the widest work region (fp32 dQ, dK, dV) and one copy
// of K/V in flight.
double SessionBytesEstimate(const v1::AttentionSpec& spec);

// What rank `rank` of `plan` holds for the session at `step_tokens` (its local shape: the
// spec's, cut to the rank's key/value heads). `report`: CheckPlan's for the plan.
absl::StatusOr<WorkerMemory> SessionWorkerMemory(const v1::AttentionSpec& spec, const Plan& plan,
                                                 int rank, const CheckReport& report,
                                                 int64_t step_tokens = kDefaultStepTokens);

}  // namespace dfa
