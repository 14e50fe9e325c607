// Lower-case names of job kinds and states, as metric label values and in the command line's
// human-readable output: "forward" / "backward"; "queued" / "running" / "succeeded" /
// "failed" / "cancelled" ("unspecified" for an unset state).
#pragma once

#include <string>

#include "dfa/v1/coordinator.pb.h"

namespace dfa {

std::string JobKindLabel(v1::JobKind kind);
std::string JobStateLabel(v1::JobState state);

}  // namespace dfa
