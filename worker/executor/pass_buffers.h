// Buffer lifetimes of one pass (internal to the executor). Two kinds of scratch memory live
// beside the session's storage, all of it from the backend:
//   received buffers  Q, K/V or grad_in rows from a peer (one buffer may hold several adjacent
//                     messages, see step_groups.h); kept until the end of the last step that
//                     computes with them or forwards them (Buffer::free_after);
//   partials          O/LSE, dQ or dK/dV a worker computes for rows it does not own; created
//                     zeroed (LSE -inf) by the first compute on them, kept until their last
//                     rows are sent, and released as soon as that send's group is waited for
//                     (the start of the next step).
// PassBuffers holds both and releases them at the end of each step.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/planner/plan.h"
#include "core/status.h"
#include "kernels/attention_backend.h"
#include "worker/executor/pass_context.h"

namespace dfa::executor_internal {

// Backend memory freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer(AttentionBackend* b, void* p) : backend_(b), p_(p) {}
  ~DeviceBuffer() {
    if (p_ != nullptr) backend_->Free(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }

 private:
  AttentionBackend* backend_;
  void* p_;
};

// A received buffer or a partial: its components (transfer_layout.h), dense over `rows`.
struct Buffer {
  PlanTensor tensor;
  RowRange rows;
  std::vector<RowRange> layout;  // {rows}: the op fusion's view of it (op_fusion.h)
  std::vector<std::unique_ptr<DeviceBuffer>> parts;
  int64_t bytes = 0;
  int free_after = 0;       // step after whose end it is released
  int64_t rows_unsent = 0;  // partials: rows not yet sent to their owner
};

class PassBuffers {
 public:
  explicit PassBuffers(PassContext* ctx) : ctx_(*ctx) {}

  // A new, uninitialised buffer for tensor `t` over `rows` (not kept: see KeepReceived).
  absl::StatusOr<std::unique_ptr<Buffer>> New(PlanTensor t, const RowRange& rows);
  // Keeps a buffer being received until the end of step b->free_after.
  void KeepReceived(std::unique_ptr<Buffer> b);
  // The received buffer of tensor `t` that holds `rows`; nullptr if none.
  Buffer* FindReceived(PlanTensor t, const RowRange& rows);
  // The partial of tensor `t` for the received rows `rows`, created (O and gradients 0, LSE
  // -inf, queued on the compute stream) on first use; kept until its rows are all sent.
  absl::StatusOr<Buffer*> Partial(PlanTensor t, const RowRange& rows);
  // The most recently created partial of tensor `t` whose rows contain `rows`; nullptr if none.
  Buffer* PartialContaining(PlanTensor t, const RowRange& rows);
  // Bytes of the received buffers and partials alive now.
  int64_t LiveBytes() const;
  // Step t's late group was waited for: releases the partials whose last send it carried.
  void ReleaseSent(int t);
  // End of step t: releases the received buffers no later step uses (and any partial whose
  // last send was posted before step t).
  void ReleaseAfterStep(int t);

 private:
  PassContext& ctx_;
  std::vector<std::unique_ptr<Buffer>> received_;
  std::vector<std::unique_ptr<Buffer>> partials_;
};

}  // namespace dfa::executor_internal
