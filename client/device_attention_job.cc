#include "client/device_attention_job.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace dfa::client {

absl::Status DeviceAttentionJob::NewSession(bool after_failure) {
  if (session_) {
    (void)session_->Release();  // best effort: the lost worker may not answer
    session_.reset();
  }
  bindings_.Forget();  // a new session holds no bindings
  ASSIGN_OR_RETURN(session_, PlaceSession(client_, options_.session, after_failure,
                                          options_.recovery_timeout));
  return absl::OkStatus();
}

absl::Status DeviceAttentionJob::Bind(v1::JobKind kind,
                                      const std::vector<DeviceBinding>& bindings) {
  const absl::Time start = absl::Now();
  absl::StatusOr<TransferStats> stats = bindings_.Bind(*session_, kind, bindings);
  times_.transfer += absl::ToDoubleSeconds(absl::Now() - start);
  RETURN_IF_ERROR(stats.status());
  times_.requests += stats->chunks;
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> DeviceAttentionJob::RunJob(v1::JobKind kind) {
  const absl::Time start = absl::Now();
  RunOptions run;
  run.wait = true;  // one rpc per job: no watch stream
  run.cancel = &cancel_;
  absl::StatusOr<v1::Job> job = session_->Run(kind, options_.observer, run);
  times_.run += absl::ToDoubleSeconds(absl::Now() - start);
  if (!job.ok()) return job;
  times_.job += job->wall_seconds();
  // The workers copy in parallel: the job waited for the slowest one's copies.
  double copies = 0, engine = 0;
  int64_t bytes = 0;
  for (const v1::WorkerJobStats& w : job->workers()) {
    copies = std::max(copies, w.device_transfer_seconds());
    engine = std::max(engine, w.busy_seconds() + w.idle_seconds());
    bytes += w.device_transfer_bytes();
  }
  times_.engine += engine;
  times_.job_transfer += copies;
  times_.transfer += copies;
  times_.bytes += bytes;
  ipc_bytes_ += bytes;
  return job;
}

absl::StatusOr<v1::Job> DeviceAttentionJob::ForwardOnce(const DeviceTensor* o,
                                                        const DeviceTensor* lse) {
  std::vector<DeviceBinding> b = {
      {v1::TENSOR_Q, &*q_, true}, {v1::TENSOR_K, &*k_, true}, {v1::TENSOR_V, &*v_, true}};
  if (o != nullptr) b.push_back({v1::TENSOR_O, o, false});
  if (lse != nullptr) b.push_back({v1::TENSOR_LSE, lse, false});
  RETURN_IF_ERROR(Bind(v1::JOB_FORWARD, b));
  return RunJob(v1::JOB_FORWARD);
}

absl::StatusOr<v1::Job> DeviceAttentionJob::BackwardOnce(const DeviceTensor& dq,
                                                         const DeviceTensor& dk,
                                                         const DeviceTensor& dv) {
  RETURN_IF_ERROR(Bind(v1::JOB_BACKWARD, {{v1::TENSOR_DO, &*dout_, true},
                                          {v1::TENSOR_DQ, &dq, false},
                                          {v1::TENSOR_DK, &dk, false},
                                          {v1::TENSOR_DV, &dv, false}}));
  return RunJob(v1::JOB_BACKWARD);
}

absl::StatusOr<v1::Job> DeviceAttentionJob::Forward(const DeviceTensor& q, const DeviceTensor& k,
                                                    const DeviceTensor& v, const DeviceTensor* o,
                                                    const DeviceTensor* lse) {
  q_ = q;
  k_ = k;
  v_ = v;
  forward_done_ = false;
  times_ = DevicePhaseTimes{};
  if (!session_) RETURN_IF_ERROR(NewSession(false));
  for (int attempt = 0;; ++attempt) {
    absl::StatusOr<v1::Job> r = ForwardOnce(o, lse);
    if (r.ok()) {
      forward_done_ = true;
      return r;
    }
    if (!RetryableJobError(r.status()) || attempt >= options_.max_retries) return r.status();
    if (options_.on_retry) options_.on_retry(r.status());
    ++retries_done_;
    RETURN_IF_ERROR(NewSession(true));
  }
}

absl::StatusOr<v1::Job> DeviceAttentionJob::Backward(const DeviceTensor& dout,
                                                     const DeviceTensor& dq,
                                                     const DeviceTensor& dk,
                                                     const DeviceTensor& dv) {
  if (!forward_done_ || !session_) {
    return absl::FailedPreconditionError("backward: run Forward first (the session keeps its "
                                         "Q, K, V, O and LSE for the backward)");
  }
  dout_ = dout;
  times_ = DevicePhaseTimes{};
  for (int attempt = 0;; ++attempt) {
    absl::StatusOr<v1::Job> r = BackwardOnce(dq, dk, dv);
    if (r.ok()) return r;
    if (!RetryableJobError(r.status()) || attempt >= options_.max_retries) return r.status();
    if (options_.on_retry) options_.on_retry(r.status());
    ++retries_done_;
    // A new placement has no forward state: redo the forward there (O is not written again).
    RETURN_IF_ERROR(NewSession(true));
    RETURN_IF_ERROR(ForwardOnce(nullptr, nullptr).status());
  }
}

absl::Status DeviceAttentionJob::Release() {
  forward_done_ = false;
  q_.reset();
  k_.reset();
  v_.reset();
  dout_.reset();
  bindings_.Forget();
  if (!session_) return absl::OkStatus();
  absl::Status s = session_->Release();
  session_.reset();
  return s;
}

}  // namespace dfa::client
