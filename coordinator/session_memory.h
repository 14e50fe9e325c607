// Memory a session holds on one worker, for admission control. The coordinator reserves this
// much on every placed worker before it opens the session there; the worker enforces its own
// limit again in OpenSession (RESOURCE_EXHAUSTED).
//
// The count is the executor's SessionStorageBytes (worker/executor/session_storage.h: Q, K, V,
// O, dO, LSE, D, dQ, dK, dV for the worker's owned rows) plus the plan's in-flight buffers:
// for each pass, the largest step's received rows (Q, K/V, partials in fp32), counted twice
// for double buffering.
#pragma once

#include <cstdint>

#include "dfa/v1/attention.pb.h"

namespace dfa {

// Bytes of the in-flight buffers of one worker's plan (see the header comment).
int64_t PlanBufferBytes(const v1::AttentionSpec& spec, const v1::WorkerPlan& plan);

// Storage for the worker's owned rows + PlanBufferBytes.
int64_t SessionBytesForWorker(const v1::AttentionSpec& spec, const v1::WorkerPlan& plan);

}  // namespace dfa
