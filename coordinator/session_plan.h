// The one place where a session's plan is made: the coordinator calls MakeSessionPlan with the
// spec, the schedule the client asked for and the relative speeds of the placed workers. It
// runs the planner (coordinator/planner/), proves the plan with CheckPlan, and returns it as
// the protocol's dfa.v1.Plan together with each rank's memory need.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "dfa/v1/attention.pb.h"
#include "core/status.h"

namespace dfa {

struct SessionPlan {
  v1::Plan plan;
  // Per rank: what the session will peak at there (SessionWorkerMemory at the default
  // step_tokens: storage, key chunk, the executor's peak buffers; docs/memory.md).
  std::vector<int64_t> bytes_per_rank;
};

// speeds[r]: relative speed of rank r (1.0 nominal), one entry per placed worker (>= 1).
// schedule "" means "balanced". `backend`: the placed workers' backend as they register it
// ("cuda" for GPU workers, "cpu"): "cuda" makes "balanced" rank its candidates with the GPU cost
// profile (GpuCostParams: least true time with per-op overhead, for the session's shape),
// anything else with the CPU profile (coordinator/planner/planner.h, PlanRequest::profile).
// "heads" (head groups, plan.h) and "auto" (the cheaper of balanced and heads under that
// profile) plan with the spec's real head counts; a head-split rank's bytes_per_rank counts the
// storage of its own heads only (all rows of fewer heads).
// INVALID_ARGUMENT (message starting with "schedule: ") when the planner cannot make that
// schedule for these inputs (e.g. distflash with an odd worker count); INTERNAL if the
// planner's plan fails its check.
absl::StatusOr<SessionPlan> MakeSessionPlan(const v1::AttentionSpec& spec,
                                            absl::string_view schedule,
                                            const std::vector<double>& speeds,
                                            absl::string_view backend = "cpu");

// Plan steps of one kind summed over all workers (progress denominator of a job).
int TotalSteps(const v1::Plan& plan, bool backward);

}  // namespace dfa
