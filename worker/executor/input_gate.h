// InputGate: the inputs of a pass that may still be arriving while it runs (a job submitted
// with inputs_streaming, docs/worker.md "Streaming inputs"). The executor asks the gate before
// every unit on owned query or key/value rows and before every send of owned rows; a pass run
// without a gate (ExecutorOptions::inputs == nullptr) reads its inputs as they are.
//
// Threads: WaitRows is called by the executor's thread; an implementation is woken by whoever
// writes the rows (worker/session_input_gate.h: every upload path of the session).
#pragma once

#include <atomic>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/planner/plan.h"

namespace dfa {

// The uploaded tensors a pass reads: Q, K, V (forward) and dO (backward).
enum class InputTensor { kQ, kK, kV, kDout };

class InputGate {
 public:
  virtual ~InputGate() = default;
  // Returns OK once rows `rows` (global positions inside one owned range) of `t` have arrived for
  // every batch index; DEADLINE_EXCEEDED naming the tensor and the missing rows when they have
  // not within `timeout`; CANCELLED once *cancel (optional) is set.
  virtual absl::Status WaitRows(InputTensor t, const RowRange& rows, absl::Duration timeout,
                                const std::atomic<bool>* cancel) = 0;
};

}  // namespace dfa
