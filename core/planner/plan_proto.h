// Plan (plan.h) <-> dfa.v1.Plan (proto/dfa/v1/attention.proto). Library dfa_plan_proto.
#pragma once

#include "core/planner/plan.h"
#include "dfa/v1/attention.pb.h"
#include "core/status.h"

namespace dfa {

// dfa.v1.Plan has no rank map (plan.h "Virtual ranks"): a plan with rank_workers set converts
// rank by rank, as if every rank were a worker; MakeSessionPlan never sends one.
void PlanToProto(const Plan& plan, v1::Plan* out);
// INVALID_ARGUMENT naming the field for an unknown tensor kind, a negative peer or an
// inverted row range. Does not run CheckPlan (do that before executing a received plan).
absl::StatusOr<Plan> PlanFromProto(const v1::Plan& proto);

}  // namespace dfa
