// The accumulators a pass writes its results into (internal to the executor).
// Forward: O and LSE of the worker's owned rows. O accumulates in fp32: in a buffer of its own
// when the session dtype is not fp32, converted into storage once at the end of the pass --
// unless the pass is single-writer (every owned row written by exactly one call, no kOutPartial
// arriving; e.g. a head group of one worker, or P = 1): then the calls write O in the session's
// dtype straight into storage (no fp32 buffer, no conversion; cuDNN writes its bf16 O in place).
// The first call on rows writes them (accumulate = false), so rows are initialised (O = 0,
// LSE = -inf) only where a merge or a second call needs them, never wholesale per pass.
// Backward: dQ, dK, dV of the owned rows (fp32 in storage), zeroed at the start, and
// D = rowsum(dO * O), computed before any grad_in leaves the worker.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/planner/plan.h"
#include "core/status.h"
#include "kernels/attention_backend.h"
#include "worker/executor/pass_buffers.h"
#include "worker/executor/pass_context.h"

namespace dfa::executor_internal {

class PassAccumulators {
 public:
  explicit PassAccumulators(PassContext* ctx) : ctx_(*ctx) {}

  // Start of the pass (after the context's rank and stream are set).
  absl::Status Begin();
  // Forward: the output accumulator over all local rows (fp32, or the session's O in a
  // single-writer pass).
  const TensorView& out() const { return out_view_; }
  // Forward, local rows [a, a + m) about to be written: *fresh = none of them was written yet
  // (then they count as written now); otherwise the unwritten ones are initialised so that a
  // call can merge into them.
  absl::Status PrepareRows(int64_t a, int64_t m, bool* fresh);
  // Forward: O = 0, LSE = -inf on local rows `local` (counted on the running step).
  absl::Status InitRows(const RowRange& local);
  // End of the pass, after the last merge: forward rows no call wrote (no plan leaves any)
  // become an empty output (O = 0, LSE -inf), and an fp32 accumulator is converted into O.
  absl::Status Finish();

 private:
  bool SingleWriterForward() const;

  PassContext& ctx_;
  std::unique_ptr<DeviceBuffer> out_acc_;  // forward fp32 output accumulator (dtype != f32)
  TensorView out_view_;                    // fp32 [B, rows, Hq, D] accumulator view
  std::vector<RowRange> acc_ready_;        // local rows of out_view_ (and LSE) written already
};

}  // namespace dfa::executor_internal
