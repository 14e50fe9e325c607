#include "client/attention_job.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace dfa::client {
namespace {

// Blocks of rows a streamed forward's inputs go up in (TransferOptions::row_blocks).
constexpr int kStreamRowBlocks = 4;

}  // namespace

// Everything else (bad input, PERMISSION_DENIED, RESOURCE_EXHAUSTED, a failed kernel) would fail
// the same way again.
bool RetryableJobError(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kNotFound;
}

absl::StatusOr<std::unique_ptr<Session>> PlaceSession(Client* client, const SessionOptions& options,
                                                      bool after_failure,
                                                      absl::Duration recovery_timeout) {
  if (!after_failure) return client->CreateSession(options);
  // Place on the workers still alive. Until the coordinator's lease drops the lost worker it may
  // still be listed, and a placement on it fails with UNAVAILABLE: try again until the deadline.
  const absl::Time deadline = absl::Now() + recovery_timeout;
  while (true) {
    SessionOptions o = options;
    auto workers = client->ListWorkers();
    if (workers.ok()) {
      int alive = 0;
      for (const auto& w : workers->workers()) alive += w.alive() ? 1 : 0;
      if (o.num_workers == 0 || o.num_workers > alive) o.num_workers = alive;
    }
    auto s = client->CreateSession(o);
    if (s.ok()) return s;
    const bool transient = s.status().code() == absl::StatusCode::kUnavailable ||
                           s.status().code() == absl::StatusCode::kResourceExhausted;
    if (!transient || absl::Now() > deadline) return s.status();
    absl::SleepFor(absl::Milliseconds(200));
  }
}

absl::Status AttentionJob::NewSession(bool after_failure) {
  if (session_) {
    (void)session_->Release();  // best effort: the lost worker may not answer
    session_.reset();
  }
  ASSIGN_OR_RETURN(session_, PlaceSession(client_, options_.session, after_failure,
                                          options_.recovery_timeout));
  return absl::OkStatus();
}

absl::Status AttentionJob::Upload(const Inputs& inputs) {
  if (!options_.stream_inputs && inputs.size() > 1) {
    // One tensor at a time, each announced as it starts (on_transfer: a progress bar each).
    for (const auto& input : inputs) RETURN_IF_ERROR(Upload({input}));
    return absl::OkStatus();
  }
  if (options_.on_transfer) {
    for (const auto& [kind, t] : inputs) options_.on_transfer(kind, t->size_bytes(), true);
  }
  TransferOptions transfer = options_.transfer;
  // Streaming: the rows in blocks, so a worker's first query blocks compute while the rest
  // arrives (docs/worker.md "Streaming inputs").
  if (options_.stream_inputs && inputs.size() > 1) transfer.row_blocks = kStreamRowBlocks;
  ASSIGN_OR_RETURN(TransferStats stats, session_->Upload(inputs, transfer));
  bytes_uploaded_ += stats.bytes;
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> AttentionJob::RunWithInputs(v1::JobKind kind, const Inputs& inputs) {
  if (!options_.stream_inputs) {
    RETURN_IF_ERROR(Upload(inputs));
    return session_->Run(kind, options_.observer);
  }
  RunOptions run;
  run.wait = true;  // one call holds the job; cancelling it cancels the job
  run.cancel = &cancel_;
  run.inputs_streaming = true;
  absl::StatusOr<v1::Job> job = absl::UnknownError("the job was not run");
  std::thread runner([&] { job = session_->Run(kind, options_.observer, run); });
  const absl::Status uploaded = Upload(inputs);
  // A failed upload: the job would wait for rows that never come. The cancel is ours only for
  // this call (a retry must be able to run); one asked for by the caller stays.
  const bool ours = !uploaded.ok() && !cancel_.cancelled();
  if (ours) cancel_.Cancel();
  runner.join();
  if (ours) cancel_.Reset();
  if (!uploaded.ok()) return uploaded;
  return job;
}

absl::StatusOr<v1::Job> AttentionJob::RunStreamed(v1::JobKind kind, const Inputs& inputs,
                                                  const Outputs& outputs) {
  if (cancel_.cancelled()) return absl::CancelledError("the job was cancelled before it started");
  ASSIGN_OR_RETURN(const v1::Job submitted,
                   session_->Submit(kind, /*inputs_streaming=*/true, /*outputs_streaming=*/true));
  const std::string& id = submitted.job_id();
  absl::StatusOr<v1::Job> job = absl::UnknownError("the job was not watched");
  std::thread watcher([&] {
    job = session_->Watch(id, options_.observer, &cancel_);
    // Cancelled by the caller: the job goes too (its waiting downloads end with it).
    if (!job.ok() && cancel_.cancelled()) (void)client_->CancelJob(id);
  });
  // The outputs are awaited from the start, on a thread of their own (Session allows one
  // Upload and one Download at once): a worker whose rows are final early sends them while
  // later rows still go up.
  absl::Status downloaded;
  std::thread gatherer([&] {
    for (const auto& [out_kind, t] : outputs) {
      downloaded = Download(out_kind, t, id);
      if (!downloaded.ok()) break;
    }
    if (!downloaded.ok()) (void)client_->CancelJob(id);  // results no one reads
  });
  const absl::Status uploaded = Upload(inputs);
  // A failed upload leaves the job waiting for rows that never come.
  if (!uploaded.ok()) (void)client_->CancelJob(id);
  gatherer.join();
  watcher.join();
  // The job's own error comes first, except the CANCELLED that a failed transfer's cancel above
  // caused: the transfer's error is the cause (an UNAVAILABLE worker is retried).
  const bool we_cancelled = (!uploaded.ok() || !downloaded.ok()) && !cancel_.cancelled();
  if (!job.ok() && !(we_cancelled && absl::IsCancelled(job.status()))) return job.status();
  RETURN_IF_ERROR(uploaded);
  RETURN_IF_ERROR(downloaded);
  return job;
}

absl::StatusOr<v1::Job> AttentionJob::RunAndGather(v1::JobKind kind, const Inputs& inputs,
                                                   const Outputs& outputs) {
  if (options_.stream_inputs && options_.stream_outputs) {
    return RunStreamed(kind, inputs, outputs);
  }
  ASSIGN_OR_RETURN(v1::Job job, RunWithInputs(kind, inputs));
  for (const auto& [out_kind, t] : outputs) RETURN_IF_ERROR(Download(out_kind, t));
  return job;
}

absl::Status AttentionJob::Download(v1::TensorKind kind, HostTensor* t,
                                    const std::string& await_job_id) {
  if (options_.on_transfer) {
    ASSIGN_OR_RETURN(HostTensor shape, MakeTensor(session_->spec(), kind));
    options_.on_transfer(kind, shape.size_bytes(), false);
  }
  TransferOptions transfer = options_.transfer;
  transfer.await.job_id = await_job_id;
  transfer.await.timeout = options_.output_wait_timeout;
  return session_->Download(kind, t, transfer).status();
}

absl::StatusOr<v1::Job> AttentionJob::ForwardOnce(ForwardOutputs* out) {
  Outputs outputs = {{v1::TENSOR_O, &out->o}};
  if (options_.download_lse) outputs.push_back({v1::TENSOR_LSE, &out->lse});
  // K, V first: a worker's first sends carry its own K/V rows.
  return RunAndGather(v1::JOB_FORWARD, {{v1::TENSOR_K, k_}, {v1::TENSOR_V, v_}, {v1::TENSOR_Q, q_}},
                      outputs);
}

absl::StatusOr<v1::Job> AttentionJob::BackwardOnce(BackwardOutputs* out) {
  return RunAndGather(
      v1::JOB_BACKWARD, {{v1::TENSOR_DO, dout_}},
      {{v1::TENSOR_DQ, &out->dq}, {v1::TENSOR_DK, &out->dk}, {v1::TENSOR_DV, &out->dv}});
}

absl::StatusOr<ForwardOutputs> AttentionJob::Forward(const HostTensor& q, const HostTensor& k,
                                                     const HostTensor& v, v1::Job* job) {
  q_ = &q;
  k_ = &k;
  v_ = &v;
  forward_done_ = false;
  if (!session_) RETURN_IF_ERROR(NewSession(false));
  ForwardOutputs out;
  for (int attempt = 0;; ++attempt) {
    auto r = ForwardOnce(&out);
    if (r.ok()) {
      forward_done_ = true;
      if (job) *job = *r;
      return out;
    }
    if (!RetryableJobError(r.status()) || attempt >= options_.max_retries) return r.status();
    if (options_.on_retry) options_.on_retry(r.status());
    ++retries_done_;
    RETURN_IF_ERROR(NewSession(true));
  }
}

absl::StatusOr<BackwardOutputs> AttentionJob::Backward(const HostTensor& dout, v1::Job* job) {
  if (!forward_done_ || !session_) {
    return absl::FailedPreconditionError("backward: run Forward first (the session keeps its "
                                         "Q, K, V, O and LSE for the backward)");
  }
  dout_ = &dout;
  BackwardOutputs out;
  for (int attempt = 0;; ++attempt) {
    auto r = BackwardOnce(&out);
    if (r.ok()) {
      if (job) *job = *r;
      return out;
    }
    if (!RetryableJobError(r.status()) || attempt >= options_.max_retries) return r.status();
    if (options_.on_retry) options_.on_retry(r.status());
    ++retries_done_;
    // A new placement has no forward state: redo the forward there from the held inputs.
    RETURN_IF_ERROR(NewSession(true));
    ForwardOutputs fwd;
    auto f = ForwardOnce(&fwd);
    if (!f.ok()) return f.status();
  }
}

absl::Status AttentionJob::Release() {
  if (!session_) return absl::OkStatus();
  absl::Status s = session_->Release();
  session_.reset();
  forward_done_ = false;
  return s;
}

}  // namespace dfa::client
