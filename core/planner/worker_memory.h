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

// How the executor cuts a pass's transfers into steps (CutTransfers). A worker receives at
// most bound = clamp(ceil(owned rows / shard_fraction), min_rows, max_rows) rows of Q, K/V or
// grad_in per step of the cut plan, so its receive buffers and the partials computed on them
// are bounded by a fraction of its shard and by max_rows, never by a peer's shard. Every
// worker of a session must cut with the same figures (the executor and PlanWorkerMemory take
// the defaults; tests pass smaller ones to both).
struct TransferCut {
  int64_t shard_fraction = 16;
  int64_t min_rows = 1024;
  int64_t max_rows = kDefaultStepTokens;
};

// The plan the executor runs for `plan` (both passes), equivalent to it: the same owned rows
// and the same units, each worker's data arriving in the same step of `plan`, but
//  - every Q, K/V and grad_in row comes straight from its owner (no forwarding: a forwarded
//    buffer would live until it is passed on);
//  - step t is cut into k_t steps, k_t = the most any worker's receives of step t need at its
//    bound (TransferCut): every receive of step t in k_t nearly equal pieces, piece j arriving
//    for cut step j of t, and each unit on a received piece computed in the piece's step
//    (units split at the pieces' boundaries; parts without a visible pair dropped);
//  - each partial (of one received piece) goes to its owner in the step after the last unit
//    on it, and pieces no unit uses are not sent.
// Uncut steps keep their transfers' posting time (leads translated); cut steps post each piece
// one step ahead (lead 0). A plan without receives comes back unchanged. `plan` must have
// passed CheckPlan; the result passes it too.
Plan CutTransfers(const Plan& plan, const TransferCut& cut = {});

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
  // A masked plan's interval arrays (worker/session_mask.h: q_lo, q_hi, k_lo, k_hi, int32 per
  // position per batch row: 16·B·S bytes, all S positions); 0 for a dense plan.
  int64_t mask = 0;
  // The most the session holds on the worker at once: storage, mask arrays and the larger
  // pass's scratch.
  int64_t peak() const {
    const int64_t bwd = backward_buffers + key_chunk;
    return storage.total + mask + (forward_buffers > bwd ? forward_buffers : bwd);
  }
};

// INVALID_ARGUMENT for a rank outside the plan or step_tokens < 1. `local` is the worker's
// shape (LocalShape for head-split plans); `report` CheckPlan's for the plan (the plan must
// have passed it; its step-sampled buffer peaks are below the executor's, which are used).
// The scratch is the executor's for CutTransfers(plan, cut), the plan it runs.
absl::StatusOr<WorkerMemory> PlanWorkerMemory(const Plan& plan, int rank,
                                              const AttentionShape& local,
                                              const CheckReport& report, int64_t step_tokens,
                                              const TransferCut& cut = {});

}  // namespace dfa
