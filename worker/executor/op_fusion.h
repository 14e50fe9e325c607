// Op fusion: the compute ops of one plan step that read the same query-side and the same
// key/value-side storage are issued as ONE backend call when that call computes exactly the
// ops' (query, key) pairs and nothing else. Plans cut the work at shard and transfer
// boundaries (a zigzag shard's two chunks, K/V arriving as two messages), and on a GPU every
// extra call costs a launch, a merge pass over its output and a smaller, less efficient kernel:
// at 16K tokens on 2 GPUs the 5 ops of a worker's forward become 2 calls.
//
// Exactness: a call over local rows [q_local, q_local + m) x [kv_local, kv_local + n) of two
// sources masks with the positions q_row0 + i and kv_row0 + j (causal) or not at all (full).
// Each source stores global row ranges back to back (its `layout`), so within every pair of
// segments the call's positions are the global ones shifted; the call is accepted only when,
// for every pair of segments, the call's mask sees exactly the pairs the plan's mask sees, and
// the ops (which a valid plan makes disjoint) cover all of them. Otherwise the ops are issued
// one by one, as the plan says. Pure functions; no backend, no allocation beyond the result.
#pragma once

#include <cstdint>
#include <vector>

#include "core/planner/plan.h"
#include "kernels/attention_backend.h"

namespace dfa {

// Where an op's rows live on this worker: in a source storing the global ranges `layout`
// back to back (owned storage: the worker's owned ranges; a received buffer: its one range),
// starting at local row `local`. Sources are told apart by the layout's address.
struct RowPlace {
  const std::vector<RowRange>* layout = nullptr;
  int64_t local = 0;
};

struct FusedCall {
  std::vector<int> ops;  // indices into the step's computes, in plan order
  RowPlace q, kv;        // first local row of each side
  int64_t m = 0, n = 0;  // rows of each side
  MaskKind mask = MaskKind::kCausal;
  int64_t q_row0 = 0, kv_row0 = 0;  // the positions the kernel masks with
};

// `q_places[i]` / `kv_places[i]`: where ops[i]'s rows live. Returns calls covering every op once,
// in the order of their first op. `mask` is the plan's. kIntervals (documents, windows): the
// kernels read each position's visible interval, so a call must see the global positions
// themselves: ops fuse only into calls whose rows are one global range on each side, and only
// when the ops hold every pair of the call that `pairs` (the plan's mask, required then)
// counts as visible; every call keeps mask kIntervals.
std::vector<FusedCall> FuseStepOps(const std::vector<ComputeOp>& ops,
                                   const std::vector<RowPlace>& q_places,
                                   const std::vector<RowPlace>& kv_places, MaskKind mask,
                                   const UnitPairs* pairs = nullptr);

}  // namespace dfa
