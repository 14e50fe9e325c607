// The per-token shape of an attention session: everything but the sequence length. One type for
// the planner (bytes of a plan's rows), the coordinator (admission) and the workers (storage).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/status.h"

namespace dfa {

// The largest head_dim any backend computes.
inline constexpr int kMaxHeadDim = 512;

struct AttentionShape {
  int batch = 1;
  int q_heads = 1;
  int kv_heads = 1;
  int head_dim = 128;
  DType dtype = DType::kBF16;

  // INVALID_ARGUMENT worded as ValidateSpec's (core/spec_validation.h) without the "spec."
  // prefix, "<field>: <what>, got <value>": batch/heads/head_dim < 1, q_heads % kv_heads != 0,
  // head_dim > kMaxHeadDim.
  absl::Status Validate() const;
};

// Bytes a worker's session storage holds for `rows` owned rows of `shape`: Q, O, dO, K, V in
// the session's dtype, dQ, dK, dV and the per-row LSE and D in fp32. Admission control counts
// with it before anything is allocated; the worker's storage allocates exactly this.
int64_t SessionStorageBytes(const AttentionShape& shape, int64_t rows);

}  // namespace dfa
