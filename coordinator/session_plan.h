// The one place where a session's plan is made: the coordinator calls MakeSessionPlan with the
// spec, the schedule the client asked for and the relative speeds of the placed workers.
// It delegates to the planner (coordinator/planner/); until the planner library is available
// it builds the seed ring schedule itself (contiguous shards, K/V rotating around the ring).
#pragma once

#include <vector>

#include "absl/strings/string_view.h"
#include "dfa/v1/attention.pb.h"
#include "kernels/status.h"

namespace dfa {

// speeds[r]: relative speed of rank r (1.0 nominal), one entry per placed worker (>= 1).
// INVALID_ARGUMENT for an unknown schedule or a schedule the planner cannot make for these
// inputs (the message names "schedule").
absl::StatusOr<v1::Plan> MakeSessionPlan(const v1::AttentionSpec& spec, absl::string_view schedule,
                                         const std::vector<double>& speeds);

// The seed ring plan (exposed for tests): P contiguous shards; forward and backward rotate K/V
// one hop per step; backward returns dK/dV partials to their owners one step later.
v1::Plan FallbackRingPlan(int64_t seq_len, bool causal, int num_workers);

// Plan steps of one kind summed over all workers (progress denominator of a job).
int TotalSteps(const v1::Plan& plan, bool backward);

}  // namespace dfa
