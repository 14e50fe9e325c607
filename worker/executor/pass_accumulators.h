// The accumulators a pass writes its results into (internal to the executor), all in the
// storage's work region (session_storage.h) except the key chunk.
// Forward: O and LSE of the worker's owned rows. O accumulates in fp32 (the work region's o_acc)
// when the session dtype is not fp32, converted into O once at the end of the pass -- unless
// the pass is single-writer (every owned row written by exactly one call, no kOutPartial
// arriving; e.g. a head group of one worker, or P = 1): then the calls write O in the session's
// dtype straight into storage (no fp32 buffer, no conversion; cuDNN writes its bf16 O in place).
// The first call on rows writes them (accumulate = false), so rows are initialised (O = 0,
// LSE = -inf) only where a merge or a second call needs them, never wholesale per pass.
// Backward: D = rowsum(dO * O) first (before any grad_in leaves the worker, and before dQ's
// accumulator overwrites O: all rows at Begin, or, with dO still arriving, range by range in
// PrepareQueries), then fp32 dQ of the owned rows and either fp32 dK, dV of all owned
// rows (the storage's dk_acc, dv_acc) or one key chunk at a time (a chunked backward:
// core/planner/worker_memory.h ChunkedBackward): the chunk's fp32 dK, dV, zeroed when a chunk
// starts and converted into K's and V's slots when it finishes. At the end dQ is converted into
// Q's slot (and the full dK, dV into K's and V's).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/planner/plan.h"
#include "core/status.h"
#include "kernels/attention_backend.h"
#include "worker/executor/output_gate.h"
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
  // become an empty output (O = 0, LSE -inf), and an fp32 accumulator is converted into O;
  // backward gradients are converted into Q's, K's and V's slots (unfinished key chunks: 0).
  absl::Status Finish();
  // Backward, owned query rows `local` (local rows) about to be read (their dO, D) or their dQ
  // written. With dO still arriving (ExecutorOptions::inputs) the pass forms D and zeroes dQ's
  // accumulator lazily, row range by row range: it waits for the rows' dO, forms their D, and
  // before zeroing dQ rows forms D of the O rows their fp32 memory overlays (dq_acc lies over O,
  // session_storage.h), so every O row is read before it is overwritten. Otherwise (all dO
  // present) Begin did all of it and this returns at once.
  absl::Status PrepareQueries(const RowRange& local);
  // Local rows `local` of `side` are final (output_finality.h) before the end of the pass: their
  // outputs go into the session's tensors now (forward: O from an fp32 accumulator; backward:
  // dQ into Q's slot, dK, dV into K's and V's unless chunked), queued on the compute stream, and
  // Finish leaves them alone.
  absl::Status ConvertFinal(OutputSide side, const RowRange& local);

  // Backward: whether owned keys run in chunks, and the chunk size (local key rows).
  bool chunked() const { return chunked_; }
  int64_t chunk_rows() const { return chunk_rows_; }
  int64_t num_chunks() const { return static_cast<int64_t>(chunk_done_.size()); }
  // fp32 dK, dV views over the local key rows [k0, k0 + n) of chunk `c` (which holds them),
  // the chunk started (zeroed) on first use. One chunk is live at a time.
  absl::Status ChunkViews(int64_t c, int64_t k0, int64_t n, TensorView* dk, TensorView* dv);
  // Converts chunk c's dK, dV into K's and V's slots (its keys are done).
  absl::Status FinishChunk(int64_t c);

 private:
  PassContext& ctx_;
  TensorView out_view_;              // forward: the output accumulator (o_acc, or O)
  std::vector<RowRange> acc_ready_;  // local rows of out_view_ (and LSE) written already
  // Lazy D and dQ (PrepareQueries), per linear row b * rows() + local row.
  absl::Status EnsureDelta(int64_t first, int64_t end);
  bool lazy_queries_ = false;
  int64_t overlay_ = 1;  // O rows one fp32 dQ row's memory covers (4 / the dtype's size)
  std::vector<uint8_t> delta_ready_, dq_zeroed_;
  // Local rows converted by ConvertFinal, by side.
  std::vector<RowRange> final_queries_, final_keys_;
  bool chunked_ = false;
  int64_t chunk_rows_ = 0;
  std::unique_ptr<DeviceBuffer> chunk_dk_, chunk_dv_;  // fp32 [B, chunk_rows, Hkv, D]
  int64_t live_chunk_ = -1;
  std::vector<bool> chunk_done_;
};

}  // namespace dfa::executor_internal
