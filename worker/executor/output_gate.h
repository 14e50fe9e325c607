// OutputGate: where a pass announces outputs that are final while it still runs (a job submitted
// with outputs_streaming, docs/worker.md "Streaming outputs"), so a download can send them
// before the job ends. The executor calls it after the step that last writes the rows
// (output_finality.h), once the rows hold their final values in the session dtype (converted
// from the fp32 accumulators, the compute stream synchronised); a pass run without a gate
// (ExecutorOptions::outputs == nullptr) announces nothing and the job's end makes every row
// final.
//
// Threads: RowsFinal is called by the executor's thread; an implementation wakes the downloads
// waiting for the rows (worker/session_output_gate.h).
#pragma once

#include "core/planner/plan.h"

namespace dfa {

// Which outputs of owned rows: a forward's O and LSE, or a backward's dQ (the query side); a
// backward's dK and dV (the key side).
enum class OutputSide { kQueries, kKeys };

class OutputGate {
 public:
  virtual ~OutputGate() = default;
  // Rows `rows` (global positions inside one owned range) of `side` are final for every batch
  // index; they are not written again by this pass.
  virtual void RowsFinal(OutputSide side, const RowRange& rows) = 0;
};

}  // namespace dfa
