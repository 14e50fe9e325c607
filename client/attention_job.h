// The training flow on top of Client/Session: a job that offloads its attention holds the full
// Q, K, V (and later dO) in host memory; Forward scatters them to the owning workers, runs the
// forward job and gathers O and LSE; Backward sends ONLY dO (the session kept Q, K, V, O, LSE on
// the workers: rematerialisation-aware) and gathers dQ, dK, dV.
//
// Retries: when a job or a transfer fails with UNAVAILABLE (a worker was lost, a peer or the
// coordinator cannot be reached) or NOT_FOUND (a restarted coordinator or worker no longer
// knows the session or its job), the session is re-created on the workers still alive and the
// work is redone from the inputs the client holds (a backward retry re-runs the forward on the
// new placement first), up to max_retries.
//
// Streaming (AttentionJobOptions::stream_inputs, the default): each job is submitted first, with
// inputs_streaming, on a thread of its own, and its inputs are uploaded while it starts, every
// worker's shard on its own thread; a worker's units wait for the rows they read
// (docs/worker.md "Streaming inputs"). An upload that fails cancels the job and its error is the
// answer. false: upload everything, then run.
// Streamed outputs (stream_outputs, the default, with stream_inputs): the job is submitted with
// outputs_streaming too and watched on a thread of its own (the observer sees every state);
// its outputs are downloaded on another thread while its inputs go up and it runs, every
// worker's rows as that worker finishes them (TransferOptions::await; docs/worker.md
// "Streaming outputs"), so on_transfer and transfer.progress may be called from two threads at
// once. A failed transfer cancels the job; the job's own error comes first when it failed, then
// the upload's, then the download's.
//
// Ownership: the AttentionJob keeps pointers to the Client and to the input tensors passed to
// Forward/Backward; they must outlive it. One thread at a time.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "client/client.h"

namespace dfa::client {

struct AttentionJobOptions {
  SessionOptions session;
  TransferOptions transfer;
  int max_retries = 1;
  // After a lost worker: how long to keep trying to place a new session (the coordinator needs
  // up to one lease to drop the lost worker from its registry).
  absl::Duration recovery_timeout = absl::Seconds(15);
  // Job progress, e.g. a progress bar (final state only with stream_inputs but not
  // stream_outputs: one waiting SubmitJob call).
  JobObserver observer;
  // Submit each job before its inputs are uploaded (see above).
  bool stream_inputs = true;
  // With stream_inputs: download the outputs while the job runs (see above).
  bool stream_outputs = true;
  // Streamed outputs: the longest a worker waits for one chunk's rows to become final.
  absl::Duration output_wait_timeout = absl::Minutes(2);
  // Forward gathers LSE too (ForwardOutputs::lse); false leaves it on the workers (the backward
  // uses their copy) and ForwardOutputs::lse empty.
  bool download_lse = true;
  // Told before each tensor transfer starts (e.g. to open a progress bar fed by
  // transfer.progress): tensor kind, total bytes, upload (true) or download.
  std::function<void(v1::TensorKind, int64_t, bool)> on_transfer;
  // Told about each retry (reason), e.g. to print it.
  std::function<void(const absl::Status&)> on_retry;
};

struct ForwardOutputs {
  HostTensor o, lse;
};
struct BackwardOutputs {
  HostTensor dq, dk, dv;
};

// What a new session (from the inputs the client holds) can recover from: UNAVAILABLE and
// NOT_FOUND (see above). Shared by AttentionJob and DeviceAttentionJob (device_attention_job.h).
bool RetryableJobError(const absl::Status& s);
// A session for `options`; after_failure: on the workers still alive, retried until
// `recovery_timeout` while the coordinator still lists the lost worker.
absl::StatusOr<std::unique_ptr<Session>> PlaceSession(Client* client, const SessionOptions& options,
                                                      bool after_failure,
                                                      absl::Duration recovery_timeout);

class AttentionJob {
 public:
  AttentionJob(Client* client, AttentionJobOptions options)
      : client_(client), options_(std::move(options)) {}

  // Uploads q, k, v, runs forward, downloads O and LSE. The job's stats land in *job.
  absl::StatusOr<ForwardOutputs> Forward(const HostTensor& q, const HostTensor& k,
                                         const HostTensor& v, v1::Job* job = nullptr);
  // Uploads dout, runs backward, downloads dQ, dK, dV. FAILED_PRECONDITION before Forward.
  absl::StatusOr<BackwardOutputs> Backward(const HostTensor& dout, v1::Job* job = nullptr);
  // Releases the session (also done on destruction).
  absl::Status Release();

  // Stops a streaming call in flight from another thread (Cancel(): its job is cancelled, the
  // call returns CANCELLED; Reset() before the next call). Ctrl-C in the Python binding.
  RunCancel& run_cancel() { return cancel_; }

  Session* session() { return session_.get(); }
  int retries_done() const { return retries_done_; }
  // Bytes this job has sent to the workers through the data plane, by tensor kind name.
  int64_t bytes_uploaded() const { return bytes_uploaded_; }

 private:
  absl::Status NewSession(bool after_failure);
  absl::StatusOr<v1::Job> ForwardOnce(ForwardOutputs* out);
  absl::StatusOr<v1::Job> BackwardOnce(BackwardOutputs* out);
  using Inputs = std::vector<std::pair<v1::TensorKind, const HostTensor*>>;
  absl::Status Upload(const Inputs& inputs);
  using Outputs = std::vector<std::pair<v1::TensorKind, HostTensor*>>;
  // Uploads `inputs` and runs `kind`: concurrently (stream_inputs) or one after the other.
  absl::StatusOr<v1::Job> RunWithInputs(v1::JobKind kind, const Inputs& inputs);
  // Uploads `inputs`, runs `kind` and downloads `outputs`: RunWithInputs then the downloads, or
  // all while the job runs (stream_outputs).
  absl::StatusOr<v1::Job> RunAndGather(v1::JobKind kind, const Inputs& inputs,
                                       const Outputs& outputs);
  absl::StatusOr<v1::Job> RunStreamed(v1::JobKind kind, const Inputs& inputs,
                                      const Outputs& outputs);
  // `await_job_id`: the job that computes the tensor, possibly still running ("": done).
  absl::Status Download(v1::TensorKind kind, HostTensor* t, const std::string& await_job_id = "");

  Client* client_;
  AttentionJobOptions options_;
  std::unique_ptr<Session> session_;
  const HostTensor* q_ = nullptr;
  const HostTensor* k_ = nullptr;
  const HostTensor* v_ = nullptr;
  const HostTensor* dout_ = nullptr;
  bool forward_done_ = false;
  int retries_done_ = 0;
  int64_t bytes_uploaded_ = 0;
  RunCancel cancel_;
};

}  // namespace dfa::client
