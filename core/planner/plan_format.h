// Human- and machine-readable renderings of a plan and its cost (used by `dfa plan`).
#pragma once

#include <string>

#include "core/planner/cost_model.h"
#include "core/planner/plan.h"
#include "core/planner/plan_checker.h"

namespace dfa {

// One line per worker per step: computes, sends, recvs. `backward` selects the pass.
std::string FormatSteps(const Plan& plan, bool backward);
// A table per pass: busy/idle seconds and units, bytes sent/received per worker, the ratios.
std::string FormatCost(const Plan& plan, const PlanCost& cost, const CheckReport& check);
// Everything as one JSON object: schedule, workers, seq_len, causal, makespan_ratio (forward),
// forward{...}, backward{...} with per-worker figures, and (with_steps) the steps; a non-empty
// `profile` (the cost profile's name) comes first as "profile".
std::string FormatJson(const Plan& plan, const PlanCost& cost, const CheckReport& check,
                       bool with_steps, const std::string& profile = "");

}  // namespace dfa
