#include "coordinator/session_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/planner/plan_coalescing.h"
#include "core/planner/plan_checker.h"
#include "core/planner/plan_proto.h"
#include "core/planner/planner.h"
#include "coordinator/session_memory.h"
#include "core/spec_validation.h"

namespace dfa {

absl::StatusOr<SessionPlan> MakeSessionPlan(const v1::AttentionSpec& spec,
                                            absl::string_view schedule,
                                            const std::vector<double>& speeds,
                                            absl::string_view backend) {
  RETURN_IF_ERROR(ValidateSchedule(schedule));
  if (speeds.empty()) return absl::InvalidArgumentError("num_workers: no workers to plan for");
  PlanRequest request;
  request.schedule = schedule.empty() ? "balanced" : std::string(schedule);
  request.workers = static_cast<int>(speeds.size());
  request.seq_len = spec.seq_len();
  request.causal = spec.causal();
  request.speeds = speeds;
  if (backend == "cuda" || backend == "cudnn") {
    request.profile = "gpu";
    request.shape = ShapeOf(spec);  // the CPU profile keeps the search's reference shape
  }
  // "heads" and "auto" split the session's kv heads: they need its real head counts.
  if (request.schedule == "heads" || request.schedule == "auto") request.shape = ShapeOf(spec);
  // Documents and window: the planner plans (and balances) only the visible pairs; per-row
  // documents are checked against the session's batch.
  request.mask_spec = MaskSpecOf(spec);
  if (spec.doc_offsets_size() > 1) request.shape.batch = spec.batch();
  absl::StatusOr<Plan> plan = MakePlan(request);
  if (!plan.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("schedule: ", request.schedule,
                                                   " cannot be planned for ", request.workers,
                                                   " workers: ", plan.status().message()));
  }
  // One message (and one backend call) instead of several for adjacent rows.
  *plan = CoalesceTransfers(*plan, ShapeOf(spec));
  CheckOptions check;
  check.shape = ShapeOf(spec);
  absl::StatusOr<CheckReport> report = CheckPlan(*plan, check);
  if (!report.ok()) {
    return absl::InternalError(absl::StrCat("planner made an invalid ", request.schedule,
                                            " plan: ", report.status().message()));
  }
  if (!plan->rank_workers.empty()) {  // (never: session_shape is not set; plan.h "Virtual ranks")
    return absl::InternalError(absl::StrCat("planner made a ", request.schedule,
                                            " plan with virtual ranks, which sessions cannot run"));
  }
  SessionPlan out;
  PlanToProto(*plan, &out.plan);
  for (int r = 0; r < plan->num_workers(); ++r) {
    ASSIGN_OR_RETURN(const WorkerMemory m, SessionWorkerMemory(spec, *plan, r, *report));
    out.bytes_per_rank.push_back(m.peak());
  }
  return out;
}

int TotalSteps(const v1::Plan& plan, bool backward) {
  int total = 0;
  for (const v1::WorkerPlan& w : plan.workers()) {
    total += backward ? w.backward_steps_size() : w.forward_steps_size();
  }
  return total;
}

}  // namespace dfa
