// Checks of an AttentionSpec sent by a client, before any placement. Every error is
// INVALID_ARGUMENT and its message starts with the offending field ("spec.head_dim: ...").
#pragma once

#include "absl/strings/string_view.h"
#include "coordinator/options.h"
#include "dfa/v1/attention.pb.h"
#include "kernels/status.h"

namespace dfa {

// Shape, dtype, scale and limits; backend-independent (head_dim in [1, 512]).
absl::Status ValidateSpec(const v1::AttentionSpec& spec, const CoordinatorLimits& limits);

// Constraints of a backend once workers are chosen: "cuda" takes head_dim 64 or 128;
// seq_len must be at least the number of workers.
absl::Status ValidateSpecForPlacement(const v1::AttentionSpec& spec, absl::string_view backend,
                                      int num_workers);

// The schedule names the planner accepts; empty means "balanced".
absl::Status ValidateSchedule(absl::string_view schedule);

// Softmax scale the workers use: spec.softmax_scale, or 1/sqrt(head_dim) when it is 0.
float EffectiveScale(const v1::AttentionSpec& spec);

}  // namespace dfa
