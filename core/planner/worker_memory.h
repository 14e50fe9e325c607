// What one worker holds for one session, from its plan: the storage (core/shape.h
// SessionStorageLayout) with the work region the plan needs, the backward's key chunk, and the
// plan's peak transfer buffers and partials (CheckPlan). The coordinator admits with
// WorkerMemory::peak (coordinator/session_plan.cc), the worker reserves it (worker/
// session_registry.cc) and allocates exactly this (worker/executor/); `dfa plan` reports it.
// The formula per tensor and schedule: docs/memory.md.
#pragma once

#include <cstdint>

#include "core/planner/plan.h"
#include "core/planner/plan_checker.h"
#include "core/shape.h"
#include "core/status.h"

namespace dfa {

// Key rows per chunk of a chunked backward (dfa-worker --step_tokens): the fp32 dK, dV of one
// chunk are what the backward adds into (KeyChunkBytes), converted into K's and V's slots as
// each chunk completes.
inline constexpr int64_t kDefaultStepTokens = 262144;

// Whether worker `rank`'s forward writes every owned row with exactly one call and receives no
// output partial: then it writes O in the session dtype straight into storage (no fp32
// accumulator).
bool SingleWriterForward(const Plan& plan, int rank);

// Whether worker `rank`'s backward can run its owned keys in chunks: no dK/dV partial arrives
// for them, no owned K/V leaves in the backward, and every compute on owned keys is in one step
// (so a chunk is finished once that step has run its calls on it).
bool ChunkedBackward(const Plan& plan, int rank);

// The most scratch worker `rank`'s executor holds at once in one pass beyond its storage,
// starting from `start_bytes` already held (a chunked backward's key chunk): receive buffers,
// packed sends, partials and received partials with the lifetimes worker/executor/ gives them
// (step_groups.h, pass_buffers.h). Exact for the executor's host and pool allocations.
int64_t ExecutorPassScratch(const Plan& plan, int rank, const AttentionShape& local, bool forward,
                            int64_t start_bytes);

struct WorkerMemory {
  StorageLayout layout;
  StorageBytes storage;          // the session storage (persistent)
  int64_t step_tokens = 0;       // key rows per chunk (chunked backward)
  int64_t key_chunk = 0;         // fp32 dK, dV of one chunk (0 unless chunked)
  int64_t forward_buffers = 0;   // the forward's peak scratch (ExecutorPassScratch)
  int64_t backward_buffers = 0;  // the backward's, beside the key chunk
  // The most the session holds on the worker at once: storage + the larger pass's scratch.
  int64_t peak() const {
    const int64_t bwd = backward_buffers + key_chunk;
    return storage.total + (forward_buffers > bwd ? forward_buffers : bwd);
  }
};

// INVALID_ARGUMENT for a rank outside the plan or step_tokens < 1. `local` is the worker's
// shape (LocalShape for head-split plans); `report` CheckPlan's for the plan (the plan must
// have passed it; its step-sampled buffer peaks are below the executor's, which are used).
absl::StatusOr<WorkerMemory> PlanWorkerMemory(const Plan& plan, int rank,
                                              const AttentionShape& local,
                                              const CheckReport& report, int64_t step_tokens);

}  // namespace dfa
