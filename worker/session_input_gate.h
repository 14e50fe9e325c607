// SessionInputGate: the InputGate (worker/executor/input_gate.h) of a streaming job on one
// WorkerSession. WaitRows waits on the session's `rows_arrived` (notified by every upload path
// after it marks rows: gRPC chunks and shared memory in tensor_io, CUDA IPC in
// gpu/device_transfer, NCCL client groups) until the rows have arrived since the last job that
// read the tensor (RowCoverage::ArrivedAll), the job is cancelled, or the timeout passes.
//
// Threads: WaitRows takes the session's mutex; call it without holding it.
#pragma once

#include "worker/executor/input_gate.h"
#include "worker/worker_session.h"

namespace dfa {

class SessionInputGate final : public InputGate {
 public:
  explicit SessionInputGate(WorkerSession* s) : s_(s) {}
  absl::Status WaitRows(InputTensor t, const RowRange& rows, absl::Duration timeout,
                        const std::atomic<bool>* cancel) override;

 private:
  WorkerSession* const s_;
};

}  // namespace dfa
