// What the parts of one PlanExecutor pass share (internal to the executor): the backend,
// transport and storage it runs on, the plan and which worker of it this is, and the statistics
// the pass fills in. PassRunner (plan_executor.cc) owns it and hands it to the buffer lifetimes
// (pass_buffers.h), the group scheduling (step_groups.h), the accumulators (pass_accumulators.h)
// and the step compute (step_compute.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/planner/plan.h"
#include "core/status.h"
#include "kernels/attention_backend.h"
#include "worker/executor/plan_executor.h"
#include "worker/executor/session_storage.h"
#include "core/transport.h"

namespace dfa::executor_internal {

class PassAccumulators;  // pass_accumulators.h

struct PassContext {
  PassContext(AttentionBackend* b, Transport* t, SessionStorage* s, const ExecutorOptions& o,
              const Plan& p, bool forward)
      : backend(b), transport(t), storage(s), options(o), plan(p), fwd(forward),
        shape(s->shape()) {}

  // This worker's steps of the pass (valid once `rank` is set).
  const std::vector<PlanStep>& steps() const {
    const WorkerPlan& w = plan.workers[rank];
    return fwd ? w.forward : w.backward;
  }

  AttentionBackend* const backend;
  Transport* const transport;
  SessionStorage* const storage;
  const ExecutorOptions& options;
  const Plan& plan;
  const bool fwd;                // forward pass (else backward)
  const AttentionShape shape;    // the storage's (local) shape
  int rank = 0;                  // transport->rank()
  float scale = 0;               // softmax scale in use
  void* stream = nullptr;        // the compute stream (options.compute_stream)
  PassStats stats;               // stats.steps sized to the pass's steps
  StepStats* cur = nullptr;      // the step running now; stays on the last step after the loop
  double input_wait = 0;         // seconds the running step waited for streamed inputs
  // The pass's accumulators (set by its runner): sends of owned grad_in rows prepare their D
  // (PassAccumulators::PrepareQueries) before they are packed.
  PassAccumulators* acc = nullptr;

  // Waits for rows of an input still arriving (ExecutorOptions::inputs; OK at once without a
  // gate), counting the wait as the running step's idle time.
  absl::Status WaitInput(InputTensor t, const RowRange& rows);
};

inline absl::Status PassContext::WaitInput(InputTensor t, const RowRange& rows) {
  if (options.inputs == nullptr || rows.size() <= 0) return absl::OkStatus();
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status st = options.inputs->WaitRows(t, rows, options.step_timeout, options.cancel);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  input_wait += waited;
  if (cur != nullptr) cur->idle_seconds += waited;
  return st;
}

// Counts one backend call in *counter and passes its status through.
inline absl::Status Launch(int64_t* counter, absl::Status s) {
  ++*counter;
  return s;
}

inline std::string Rows(const RowRange& r) { return absl::StrCat("[", r.begin, ", ", r.end, ")"); }

}  // namespace dfa::executor_internal
