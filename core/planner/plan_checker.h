// CheckPlan: proves a Plan (plan.h) is executable and exact, without running it.
//
// Verified for the forward and the backward pass:
//  - ownership: the workers' owned ranges are sorted, non-empty and partition [0, seq_len);
//  - exactness: every visible (query, key) pair is computed exactly once (no pair twice, none
//    missed), checked exactly on a compressed grid of the plan's row boundaries;
//  - matching: every send in step t is matched by one recv in step t on the peer (same tensor
//    and rows) and vice versa; no transfer to oneself;
//  - availability: a send carries owned rows, a buffer received in an earlier step, or a partial
//    completed by earlier computes; a compute uses owned rows or buffers received by its step;
//  - partials: each is sent exactly once, whole, to the owner of its rows, and never written
//    after it was sent; a worker never receives overlapping rows of the same tensor twice in one
//    pass (no K/V chunk sent to the same worker twice) nor rows it owns.
//  - no deadlock: with per-step matching and data dependencies only on earlier steps, every wait
//    of step t depends only on steps < t of other workers, so the waits form no cycle; within a
//    step the canonical per-pair order (CanonicalTransferLess) is the same on both sides.
//  - memory: peak bytes of transfer buffers and partials alive at once per worker (a buffer lives
//    from the step before its receive step, when the executor posts the receive, to its last
//    use; a partial from its first compute to its send step),
//    bounded by `max_buffer_bytes` when given.
//  - virtual ranks (plan.h): rank_workers, when set, has one entry per rank and maps the ranks
//    onto workers 0..W-1, each running at least one; every check above is per rank ("worker" in
//    the messages and the report is the rank).
// Errors: FAILED_PRECONDITION naming the worker, pass, step and what is wrong.
#pragma once

#include <cstdint>
#include <vector>

#include "core/planner/plan.h"
#include "core/status.h"

namespace dfa {

struct CheckOptions {
  AttentionShape shape;          // for the memory figures
  int64_t max_buffer_bytes = 0;  // 0: no bound
};

struct CheckReport {
  std::vector<int64_t> peak_forward_bytes;   // per worker
  std::vector<int64_t> peak_backward_bytes;  // per worker
  int64_t max_peak_bytes = 0;
};

absl::StatusOr<CheckReport> CheckPlan(const Plan& plan, const CheckOptions& options = {});

}  // namespace dfa
