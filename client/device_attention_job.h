// The training flow of attention_job.h for CUDA tensors of a process on the workers' host: the
// inputs go to the workers and the outputs come back by CUDA IPC (cuda_tensor_io.h), device to
// device, never through host memory. Forward hands Q, K, V over, runs the forward job and writes
// O (and LSE) into the caller's device tensors; Backward hands over ONLY dO (the session kept
// Q, K, V, O, LSE on the workers) and writes dQ, dK, dV. The tensors are bound to the session's
// jobs (DeviceBindings): the workers copy the inputs in as each job starts and write the outputs
// before its reply, so a call is one job through the coordinator and no transfer rpc — a
// binding request goes to the workers only when the tensors (their memory) changed. The job is
// one rpc: SubmitJob with `wait` (Session::Run with RunOptions::wait), answered when it is
// final; the observer sees that final state only.
//
//   DeviceAttentionJob job(client, options);
//   RETURN_IF_ERROR(job.Forward(q, k, v, &o).status());     // q, k, v, o: DeviceTensor
//   RETURN_IF_ERROR(job.Backward(dout, dq, dk, dv).status());
//
// Retries as AttentionJob: UNAVAILABLE or NOT_FOUND re-creates the session on the live workers
// and redoes the work from the caller's tensors (a backward retry re-runs the forward first,
// without writing O), up to max_retries. A handle the workers cannot open is FAILED_PRECONDITION
// and is not retried.
// Ownership: the tensors passed to Forward (q, k, v) must stay allocated until the next Forward
// or Release (a retry re-reads them; the workers keep their allocations mapped for the
// session's life). The workers touch a bound tensor only inside a call that passes it (each
// call rebinds what changed before its job). One thread at a time.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "client/attention_job.h"
#include "client/cuda_tensor_io.h"

namespace dfa::client {

// Where the time of the last Forward or Backward went, as the client saw it (seconds): the
// device transfers (the binding requests it had to send, usually none, plus the workers' CUDA
// IPC copies inside the jobs: the largest worker's), the job's run (submit + watch through the
// coordinator) and, inside it, the job's own wall time on the workers (Job.wall_seconds, which
// holds the in-job copies); control = run - job (the submit rpc and its answer); inside the job,
// engine = the slowest worker's own time in it (WorkerJobStats busy + idle: the plan's kernels
// and waits, without the copies) and dispatch = compute - engine (the coordinator's RunJob
// calls to the workers and their replies, the worker's job setup).
struct DevicePhaseTimes {
  double transfer = 0;
  double run = 0;
  double job = 0;
  double job_transfer = 0;  // the part of `job` (and of `transfer`) that the copies took
  double engine = 0;        // the part of `job` the workers' executors took (slowest worker)
  int64_t bytes = 0;        // moved by CUDA IPC
  int64_t requests = 0;     // transfer / binding rpcs sent
  double control() const { return run > job ? run - job : 0; }
  double compute() const { return job > job_transfer ? job - job_transfer : 0; }
  double dispatch() const { return compute() > engine ? compute() - engine : 0; }
};

class DeviceAttentionJob {
 public:
  DeviceAttentionJob(Client* client, AttentionJobOptions options)
      : client_(client), options_(std::move(options)) {}

  // `o` (and `lse`, fp32 [B, Hq, S]) null: not written (the forward state stays on the workers).
  absl::StatusOr<v1::Job> Forward(const DeviceTensor& q, const DeviceTensor& k,
                                  const DeviceTensor& v, const DeviceTensor* o,
                                  const DeviceTensor* lse = nullptr);
  // FAILED_PRECONDITION before a Forward. dq/dk/dv may be fp32 (unrounded gradients).
  absl::StatusOr<v1::Job> Backward(const DeviceTensor& dout, const DeviceTensor& dq,
                                   const DeviceTensor& dk, const DeviceTensor& dv);
  absl::Status Release();

  // Stops a call in flight from another thread (Cancel(): its job is cancelled, the call
  // returns CANCELLED; Reset() before the next call). Ctrl-C in the Python binding.
  RunCancel& run_cancel() { return cancel_; }

  Session* session() { return session_.get(); }
  int retries_done() const { return retries_done_; }
  const DevicePhaseTimes& last_times() const { return times_; }
  // Bytes moved by CUDA IPC over this object's life (both directions).
  int64_t ipc_bytes() const { return ipc_bytes_; }

 private:
  absl::Status NewSession(bool after_failure);
  absl::Status Bind(v1::JobKind kind, const std::vector<DeviceBinding>& bindings);
  absl::StatusOr<v1::Job> RunJob(v1::JobKind kind);
  absl::StatusOr<v1::Job> ForwardOnce(const DeviceTensor* o, const DeviceTensor* lse);
  absl::StatusOr<v1::Job> BackwardOnce(const DeviceTensor& dq, const DeviceTensor& dk,
                                       const DeviceTensor& dv);

  Client* client_;
  AttentionJobOptions options_;
  std::unique_ptr<Session> session_;
  DeviceBindings bindings_;
  std::optional<DeviceTensor> q_, k_, v_, dout_;
  bool forward_done_ = false;
  int retries_done_ = 0;
  int64_t ipc_bytes_ = 0;
  DevicePhaseTimes times_;
  RunCancel cancel_;
};

}  // namespace dfa::client
