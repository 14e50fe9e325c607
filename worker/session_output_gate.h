// The outputs of a running job on one WorkerSession, both ends of them:
// - SessionOutputGate, the OutputGate (worker/executor/output_gate.h) of a job submitted with
//   outputs_streaming: the executor marks owned rows final in the session's OutputProgress and
//   notifies `outputs_changed`;
// - BeginJobOutputs / EndJobOutputs, called by the JobRunner when a job starts and ends (every
//   row final when it succeeded; its outcome remembered for the last few jobs);
// - OutputRowsReady / AwaitOutputRows, for the download paths (gRPC Download, shared memory):
//   rows of an output kind may be read under DownloadRequest.await_job_id once they are final,
//   while the job still runs, or once the job has succeeded; the job's failure or cancellation,
//   or a timeout, ends the wait with an error naming the tensor and the rows.
//
// Threads: RowsFinal and AwaitOutputRows take the session's mutex (call them without it); the
// other functions expect it held.
#pragma once

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/executor/output_gate.h"
#include "worker/worker_session.h"

namespace dfa {

class SessionOutputGate final : public OutputGate {
 public:
  explicit SessionOutputGate(WorkerSession* s) : s_(s) {}
  void RowsFinal(OutputSide side, const RowRange& rows) override;

 private:
  WorkerSession* const s_;
};

// Job `job_id` of `kind` starts on the session: none of its output rows is final yet.
void BeginJobOutputs(WorkerSession* s, const std::string& job_id, v1::JobKind kind);
// Job `job_id` ended with `outcome` (also a job refused before it ran): remembered for the
// downloads that await it; the running job's progress is dropped.
void EndJobOutputs(WorkerSession* s, const std::string& job_id, const absl::Status& outcome);

// Whether rows `rows` (global, inside one owned range) of `kind` may be read now by a download
// awaiting `job_id`: true (read them, mu still held), false (not yet: the job runs and has not
// finished them, or it has not started on this worker), or the error that ends the download.
// An empty job_id: the rules of a plain download (no job runs; the kind has been computed).
absl::StatusOr<bool> OutputRowsReady(const WorkerSession& s, const std::string& job_id,
                                     v1::TensorKind kind, const RowRange& rows);

// The wait a request asks for: `await_timeout_ms` (the request field), 0 meaning `fallback`;
// INVALID_ARGUMENT naming the field when negative or over a day.
absl::StatusOr<absl::Duration> AwaitTimeout(int64_t await_timeout_ms, absl::Duration fallback);

// Waits until OutputRowsReady is true (OK) or an error; DEADLINE_EXCEEDED naming the tensor,
// the rows and the job after `timeout`; CANCELLED once gone(). gone() is asked every 20 ms
// (the gRPC path also keeps its stream's idle clock from running out there) and the caller
// notifies outputs_changed when it becomes true.
absl::Status AwaitOutputRows(WorkerSession* s, const std::string& job_id, v1::TensorKind kind,
                             const RowRange& rows, absl::Duration timeout,
                             const std::function<bool()>& gone);

}  // namespace dfa
