// Memory a session holds on one worker, for admission control. The coordinator reserves this
// much on every placed worker before it opens the session there; the worker enforces its own
// limit again in OpenSession (RESOURCE_EXHAUSTED).
//
// The count is SessionStorageBytes (core/shape.h: Q, K, V,
// O, dO, LSE, D, dQ, dK, dV for the worker's owned rows, at the heads it holds) plus the plan's
// peak in-flight buffers (transfer buffers and partials alive at once, from CheckPlan's report).
#pragma once

#include <cstdint>

#include "core/planner/plan.h"
#include "core/spec_validation.h"  // ShapeOf
#include "dfa/v1/attention.pb.h"

namespace dfa {

// An upper estimate, in double precision (no overflow), of the bytes the whole session holds
// over all workers: every tensor of SessionStorageBytes plus one copy of K/V in flight.
double SessionBytesEstimate(const v1::AttentionSpec& spec);

// Storage for `owned_rows` rows of all heads + `scratch_bytes` of plan buffers.
int64_t SessionBytes(const v1::AttentionSpec& spec, int64_t owned_rows, int64_t scratch_bytes);
// The same for a worker that holds only the key/value heads `kv_heads` (and their query
// groups) of its rows: a head-split plan's WorkerPlan::kv_heads; empty = all heads.
int64_t SessionBytes(const v1::AttentionSpec& spec, const HeadRange& kv_heads, int64_t owned_rows,
                     int64_t scratch_bytes);

}  // namespace dfa
