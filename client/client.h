// The C++ client library of the DistFlashAttn Service (public API).
//
//   ASSIGN_OR_RETURN(auto client, Client::Connect("127.0.0.1:7000"));
//   SessionOptions so;  so.spec = spec;
//   ASSIGN_OR_RETURN(auto session, client->CreateSession(so));
//   RETURN_IF_ERROR(session->Upload(v1::TENSOR_Q, q));   // ... K, V: straight to the workers
//   ASSIGN_OR_RETURN(v1::Job job, session->Run(v1::JOB_FORWARD));
//   RETURN_IF_ERROR(session->Download(v1::TENSOR_O, &o));
//
// Client talks to the coordinator (control plane); Session holds one session's placement and
// moves tensor rows to and from the workers that own them (data plane; never via the
// coordinator), in parallel across workers. AttentionJob (attention_job.h) adds the training
// flow with retries on top.
//
// Access: CreateSession's answer carries the session's capability, a secret; the Session sends
// it with every call about the session (coordinator and workers, metadata
// "x-dfa-session-capability"), and the Client remembers it for the jobs its sessions submitted,
// so GetJob / CancelJob by job id work for those. The client id is only a label.
//
// Lease: the first CreateSession opens the Client's lease on the coordinator (one stream,
// beaten by a background thread: client/lease_holder.h) and every session is created under
// it, so that if this process dies its sessions are released within the coordinator's grace
// (--client_lease_grace_ms) instead of at their time-to-live. ClientOptions::hold_lease = false
// creates sessions without one. Destroying the Client closes the lease cleanly.
//
// Threads: Client is thread-safe (its channels and stubs are). A Session may be used by one
// thread at a time, except that one Upload and one Download may run at once (a download that
// awaits a job while its inputs go up: AttentionJob's streamed outputs); it runs one thread
// per worker inside transfers. Ownership: a Session keeps
// a pointer to its Client, which must outlive it. A Session is released on destruction unless
// Release() ran already.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "client/host_tensor.h"
#include "client/lease_holder.h"
#include "client/worker_data_client.h"
#include "dfa/v1/coordinator.grpc.pb.h"
#include "core/rpc_security.h"

namespace dfa::client {

struct ClientOptions {
  std::string coordinator;  // host:port of dfa-coordinator
  std::string client_id;    // a label for logs; empty: "dfa-client-<host>-<pid>-<n>"
  absl::Duration rpc_timeout = absl::Seconds(30);   // control calls and each transfer call
  absl::Duration job_timeout = absl::Minutes(30);   // a job's whole run
  // mTLS files and the bearer token, for the coordinator and the workers alike
  // (docs/security.md). Empty: insecure, no token.
  RpcSecurityOptions security;
  // Create sessions under a client lease (released soon after this process dies). false: the
  // sessions' time-to-live alone.
  bool hold_lease = true;
};

struct SessionOptions {
  v1::AttentionSpec spec;
  int num_workers = 0;        // 0: all live workers
  std::string schedule;       // empty: the coordinator's default ("balanced")
  int ttl_seconds = 0;
};

enum class TransferPath { kAuto, kGrpc, kSharedMemory };

struct TransferOptions {
  // kAuto: shared memory for workers on this host (falling back to gRPC when it fails to set
  // up), gRPC otherwise.
  TransferPath path = TransferPath::kAuto;
  int64_t chunk_bytes = kDefaultChunkBytes;       // gRPC chunk payload
  int64_t segment_bytes = int64_t{64} << 20;      // shared-memory segment per worker
  ProgressFn progress;                            // bytes moved, from any thread
  // Upload of several tensors: each worker's rows go in this many blocks of rows, every
  // tensor's rows of a block before the next block's (a streaming forward computes the first
  // blocks while the rest arrives). 1: each tensor whole, one after the other.
  int row_blocks = 1;
  // Download: the job whose outputs these are, which may still be running (OutputAwait in
  // worker_data_client.h): each worker sends its rows as they become final.
  OutputAwait await;
};

// Called on every state change of a watched job.
using JobObserver = std::function<void(const v1::Job&)>;

// Stops a Session::Run from another thread (the Python binding's Ctrl-C). Cancel() cancels the
// waiting SubmitJob call in flight, which makes the coordinator cancel its job; a Run that
// starts after Cancel() fails CANCELLED without submitting, until Reset(). (A Run that watches
// its job instead, RunOptions::wait = false, is cancelled by job id: Client::CancelJob.)
// Thread-safe.
class RunCancel {
 public:
  void Cancel();
  void Reset();
  bool cancelled();

 private:
  friend class Session;
  // The waiting call of a Run; false (and nothing registered) when cancelled already.
  bool Enter(grpc::ClientContext* ctx);
  void Leave();

  std::mutex mu_;
  grpc::ClientContext* ctx_ = nullptr;
  bool cancelled_ = false;
};

struct RunOptions {
  // true: one rpc per job — SubmitJob with `wait`, answered when the job is final; the observer
  // sees the submitted job's final state only (no progress). A coordinator that does not know
  // `wait` answers at once and the Run watches the job as with false. false: SubmitJob, then
  // WatchJob (the observer sees every change: progress bars).
  bool wait = false;
  RunCancel* cancel = nullptr;  // optional, for wait = true
  // SubmitJobRequest.inputs_streaming: the job starts while its inputs (Q, K, V; dO for a
  // backward) are still being uploaded, from another thread, each worker's units waiting for
  // the rows they read (docs/worker.md "Streaming inputs"). Upload every input row once.
  bool inputs_streaming = false;
};

class Client;

class Session {
 public:
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const std::string& id() const { return info_.session_id(); }
  // The secret that authorises calls on this session (CreateSessionResponse).
  const std::string& capability() const { return info_.session_capability(); }
  const v1::AttentionSpec& spec() const { return spec_; }
  // Placement and plan as the coordinator answered them.
  const v1::CreateSessionResponse& info() const { return info_; }
  int num_workers() const { return info_.shards_size(); }

  // Sends the rows of full tensor `t` (shape of `kind` under the spec) to the workers owning
  // them, all workers in parallel. Returns total bytes and the slowest worker's time.
  absl::StatusOr<TransferStats> Upload(v1::TensorKind kind, const HostTensor& t,
                                       const TransferOptions& options = {});
  // Several tensors at once: one thread per worker sends its rows of each tensor in the order
  // given (no wait between tensors for the other workers), in options.row_blocks blocks of
  // rows. Total bytes, the slowest worker's time.
  absl::StatusOr<TransferStats> Upload(
      const std::vector<std::pair<v1::TensorKind, const HostTensor*>>& tensors,
      const TransferOptions& options = {});
  // Gathers a full tensor of `kind` from all workers into `*t` (allocated here).
  absl::StatusOr<TransferStats> Download(v1::TensorKind kind, HostTensor* t,
                                         const TransferOptions& options = {});
  // Every worker fills its shard of Q, K, V (and dO) from `seed`.
  absl::Status GenerateInputs(uint64_t seed, bool with_grad_output);
  // Submits a job and follows it to its final state (RunOptions: one waiting rpc, or a watch).
  // OK only for JOB_SUCCEEDED; a failed job returns its own code and message (UNAVAILABLE when a
  // worker was lost; CANCELLED when RunCancel stopped it).
  absl::StatusOr<v1::Job> Run(v1::JobKind kind, const JobObserver& observer = nullptr,
                              const RunOptions& options = {});
  // Submit alone; Watch follows a submitted job to its final state (same result as Run).
  // `outputs_streaming`: SubmitJobRequest.outputs_streaming (the workers mark output rows final
  // as their plans finish them, for downloads with TransferOptions::await).
  absl::StatusOr<v1::Job> Submit(v1::JobKind kind, bool inputs_streaming = false,
                                 bool outputs_streaming = false);
  // `cancel` (optional): Cancel() ends the watch (CANCELLED; the job itself runs on: cancel it
  // with Client::CancelJob).
  absl::StatusOr<v1::Job> Watch(const std::string& job_id, const JobObserver& observer,
                                RunCancel* cancel = nullptr);
  // Frees the session on the cluster. Idempotent.
  absl::Status Release();

  // Data-plane client of the shard of `rank`, kept for the session's life (tests use it for raw
  // chunk uploads). Not for concurrent use with a transfer of the same session.
  WorkerDataClient& DataClient(int rank);

 private:
  friend class Client;
  Session(Client* client, v1::AttentionSpec spec, v1::CreateSessionResponse info)
      : client_(client), spec_(std::move(spec)), info_(std::move(info)) {}
  bool UseShm(int rank, const TransferOptions& options) const;
  // SubmitJob with `wait`: the final job, or (an older coordinator) the job as submitted.
  absl::StatusOr<v1::Job> SubmitAndWait(v1::JobKind kind, RunCancel* cancel,
                                        bool inputs_streaming);

  Client* client_;
  v1::AttentionSpec spec_;
  v1::CreateSessionResponse info_;
  bool released_ = false;
  std::mutex data_mu_;  // guards the making of data_clients_ (an Upload and a Download at once)
  std::vector<std::unique_ptr<WorkerDataClient>> data_clients_;  // by rank, made on first use
};

class Client {
 public:
  // Opens a channel to the coordinator; does not wait for it (the first call does).
  // INVALID_ARGUMENT naming the flag when options.security is incomplete or its files are bad.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  // Default options for `coordinator` (host:port).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& coordinator);

  // Validates the spec locally, then asks the coordinator for a session.
  absl::StatusOr<std::unique_ptr<Session>> CreateSession(const SessionOptions& options);
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers();
  absl::StatusOr<v1::ClusterStatus> GetStatus();
  // The capability of a session this client created and has not released ("" otherwise), for
  // callers that make their own calls about it.
  std::string SessionCapability(const std::string& session_id);
  // Jobs of this client's sessions (their capability is sent along); another job answers
  // PERMISSION_DENIED.
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id);
  absl::StatusOr<v1::Job> CancelJob(const std::string& job_id);
  // Blocks until the coordinator answers GetStatus or `timeout` passes (UNAVAILABLE).
  absl::Status WaitForCoordinator(absl::Duration timeout);

  const ClientOptions& options() const { return options_; }
  const std::string& client_id() const { return options_.client_id; }
  v1::Coordinator::Stub* coordinator() { return stub_.get(); }
  // A shared channel to a worker's data-plane address (created on first use).
  std::shared_ptr<grpc::Channel> WorkerChannel(const std::string& address);
  // The lease this client's sessions are created under ("" before the first CreateSession, or
  // when it holds none).
  std::string lease_id();

 private:
  friend class Session;
  explicit Client(ClientOptions options);
  // Capabilities of the jobs of this client's sessions, by job id ("" when unknown). A session
  // remembers its last kJobsPerSession jobs; releasing it forgets them.
  static constexpr size_t kJobsPerSession = 256;
  void RememberSession(const Session& session);
  void RememberJob(const Session& session, const std::string& job_id);
  void ForgetSession(const std::string& session_id);
  std::string JobCapability(const std::string& job_id);

  ClientOptions options_;
  std::shared_ptr<const RpcSecurity> security_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  // After stub_: destroyed (the lease closed) before the stub it uses.
  std::unique_ptr<LeaseHolder> lease_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> worker_channels_;
  std::map<std::string, std::string> session_capabilities_;      // session id -> capability
  std::map<std::string, std::string> job_capabilities_;          // job id -> capability
  std::map<std::string, std::deque<std::string>> session_jobs_;  // session id -> job ids
};

// The name of this host as workers report theirs (gethostname).
std::string LocalHostName();

}  // namespace dfa::client
