#include "client/client.h"

#include <unistd.h>

#include <atomic>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/grpc_util.h"
#include "client/placement.h"
#include "core/session_capability.h"

namespace dfa::client {
namespace {

bool IsFinal(v1::JobState s) {
  return s == v1::JOB_SUCCEEDED || s == v1::JOB_FAILED || s == v1::JOB_CANCELLED;
}

// OK for a succeeded job; the job's own error otherwise.
absl::StatusOr<v1::Job> FinalResult(const v1::Job& job) {
  if (job.state() == v1::JOB_SUCCEEDED) return job;
  if (job.state() == v1::JOB_CANCELLED) {
    return absl::CancelledError(absl::StrCat("job ", job.job_id(), " was cancelled"));
  }
  const auto code = job.error_code() != 0 ? static_cast<absl::StatusCode>(job.error_code())
                                          : absl::StatusCode::kUnknown;
  return absl::Status(code, absl::StrCat("job ", job.job_id(), " failed: ", job.error_message()));
}

std::vector<v1::RowRange> Owned(const v1::ShardPlacement& shard) {
  return {shard.owned().begin(), shard.owned().end()};
}

// Runs fn(rank) for every rank on its own thread; returns the first error by rank.
absl::Status ForEachRank(int n, const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> results(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] { results[static_cast<size_t>(r)] = fn(r); });
  }
  for (auto& t : threads) t.join();
  for (auto& s : results) RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

}  // namespace

std::string LocalHostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

// ---------------------------------------------------------------- Client

Client::Client(ClientOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.coordinator.empty()) {
    return absl::InvalidArgumentError("coordinator: address is empty (expected host:port)");
  }
  ClientOptions o = options;
  if (o.client_id.empty()) {
    static std::atomic<int> counter{0};
    o.client_id = absl::StrCat("dfa-client-", LocalHostName(), "-", getpid(), "-",
                               counter.fetch_add(1));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const RpcSecurity> security, RpcSecurity::Load(o.security));
  std::unique_ptr<Client> c(new Client(std::move(o)));
  c->security_ = std::move(security);
  c->channel_ = MakeChannel(c->options_.coordinator, *c->security_);
  c->stub_ = v1::Coordinator::NewStub(c->channel_);
  if (c->options_.hold_lease) {
    c->lease_ = std::make_unique<LeaseHolder>(c->stub_.get(), c->options_.client_id);
  }
  return c;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& coordinator) {
  ClientOptions o;
  o.coordinator = coordinator;
  return Connect(o);
}

std::string Client::lease_id() { return lease_ == nullptr ? "" : lease_->lease_id(); }

std::shared_ptr<grpc::Channel> Client::WorkerChannel(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& ch = worker_channels_[address];
  if (!ch) ch = MakeChannel(address, *security_);
  return ch;
}

absl::Status Client::WaitForCoordinator(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status last;
  while (absl::Now() < deadline) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(1));
    v1::GetStatusRequest req;
    v1::ClusterStatus resp;
    grpc::Status s = stub_->GetStatus(&ctx, req, &resp);
    if (s.ok()) return absl::OkStatus();
    last = FromGrpc(s, absl::StrCat("coordinator ", options_.coordinator, " GetStatus"));
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::UnavailableError(absl::StrCat("coordinator ", options_.coordinator,
                                             " not answering after ", absl::FormatDuration(timeout),
                                             ": ", last.message()));
}

absl::StatusOr<std::unique_ptr<Session>> Client::CreateSession(const SessionOptions& options) {
  RETURN_IF_ERROR(ValidateSpec(options.spec));
  if (options.num_workers < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_workers must be >= 0, got ", options.num_workers));
  }
  v1::CreateSessionRequest req;
  *req.mutable_spec() = options.spec;
  req.set_num_workers(options.num_workers);
  req.set_schedule(options.schedule);
  req.set_client_id(options_.client_id);
  req.set_ttl_seconds(options.ttl_seconds);
  v1::CreateSessionResponse resp;
  // Two attempts when the lease turns out to be gone (the coordinator restarted, or this process
  // was stopped for longer than the grace): the second under a new lease.
  for (int attempt = 0;; ++attempt) {
    grpc::ClientContext ctx;
    req.clear_lease_id();
    if (lease_ != nullptr) {
      absl::StatusOr<LeaseCredentials> lease = lease_->Get(options_.rpc_timeout);
      if (lease.ok()) {
        req.set_lease_id(lease->lease_id);
        if (!lease->secret.empty()) ctx.AddMetadata(kLeaseSecretMetadata, lease->secret);
      } else if (!absl::IsUnavailable(lease.status()) &&
                 !absl::IsDeadlineExceeded(lease.status())) {
        return lease.status();  // refused (too many leases, authentication): say so
      }
      // Unreachable: CreateSession below answers with its own error (or, should the coordinator
      // be back by then, the session has no lease and its time-to-live applies).
    }
    SetDeadline(&ctx, options_.rpc_timeout);
    absl::Status s = FromGrpc(stub_->CreateSession(&ctx, req, &resp), "CreateSession");
    if (s.ok()) break;
    if (attempt == 0 && !req.lease_id().empty() && absl::IsNotFound(s) &&
        absl::StrContains(s.message(), "lease_id:")) {
      lease_->Forget(req.lease_id());
      continue;
    }
    return s;
  }
  std::unique_ptr<Session> session(new Session(this, options.spec, std::move(resp)));
  RememberSession(*session);
  absl::Status placement = ValidatePlacement(session->info(), options.spec);
  if (!placement.ok()) {
    (void)session->Release();
    return placement;
  }
  return session;
}

absl::StatusOr<v1::ListWorkersResponse> Client::ListWorkers() {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_.rpc_timeout);
  v1::ListWorkersResponse resp;
  RETURN_IF_ERROR(FromGrpc(stub_->ListWorkers(&ctx, {}, &resp), "ListWorkers"));
  return resp;
}

absl::StatusOr<v1::ClusterStatus> Client::GetStatus() {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_.rpc_timeout);
  v1::ClusterStatus resp;
  RETURN_IF_ERROR(FromGrpc(stub_->GetStatus(&ctx, {}, &resp), "GetStatus"));
  return resp;
}

void Client::RememberSession(const Session& session) {
  std::lock_guard<std::mutex> lock(mu_);
  session_capabilities_[session.id()] = session.capability();
}

std::string Client::SessionCapability(const std::string& session_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = session_capabilities_.find(session_id);
  return it == session_capabilities_.end() ? std::string() : it->second;
}

void Client::RememberJob(const Session& session, const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (job_id.empty() || job_capabilities_.count(job_id)) return;
  std::deque<std::string>& jobs = session_jobs_[session.id()];
  jobs.push_back(job_id);
  job_capabilities_[job_id] = session.capability();
  while (jobs.size() > kJobsPerSession) {
    job_capabilities_.erase(jobs.front());
    jobs.pop_front();
  }
}

void Client::ForgetSession(const std::string& session_id) {
  std::lock_guard<std::mutex> lock(mu_);
  session_capabilities_.erase(session_id);
  auto it = session_jobs_.find(session_id);
  if (it == session_jobs_.end()) return;
  for (const std::string& job : it->second) job_capabilities_.erase(job);
  session_jobs_.erase(it);
}

std::string Client::JobCapability(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = job_capabilities_.find(job_id);
  return it == job_capabilities_.end() ? std::string() : it->second;
}

absl::StatusOr<v1::Job> Client::GetJob(const std::string& job_id) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_.rpc_timeout);
  AttachCapability(&ctx, JobCapability(job_id));
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  req.set_client_id(options_.client_id);
  v1::Job job;
  RETURN_IF_ERROR(FromGrpc(stub_->GetJob(&ctx, req, &job), "GetJob"));
  return job;
}

absl::StatusOr<v1::Job> Client::CancelJob(const std::string& job_id) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_.rpc_timeout);
  AttachCapability(&ctx, JobCapability(job_id));
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  req.set_client_id(options_.client_id);
  v1::Job job;
  RETURN_IF_ERROR(FromGrpc(stub_->CancelJob(&ctx, req, &job), "CancelJob"));
  return job;
}

// ---------------------------------------------------------------- Session

Session::~Session() {
  if (!released_) (void)Release();
}

WorkerDataClient& Session::DataClient(int rank) {
  std::lock_guard<std::mutex> l(data_mu_);
  if (data_clients_.empty()) data_clients_.resize(static_cast<size_t>(num_workers()));
  auto& slot = data_clients_[static_cast<size_t>(rank)];
  if (slot == nullptr) {
    const auto& shard = info_.shards(rank);
    slot = std::make_unique<WorkerDataClient>(client_->WorkerChannel(shard.address()),
                                              shard.address(), id(), client_->client_id(),
                                              capability(), client_->options().rpc_timeout);
    // Head-split sessions: this worker holds a range of the heads of its rows.
    slot->set_heads(ShardHeads(shard, v1::TENSOR_Q), ShardHeads(shard, v1::TENSOR_K));
  }
  return *slot;
}

bool Session::UseShm(int rank, const TransferOptions& options) const {
  if (options.path == TransferPath::kGrpc) return false;
  if (options.path == TransferPath::kSharedMemory) return true;
  const std::string& host = info_.shards(rank).host();
  return !host.empty() && host == LocalHostName();
}

absl::StatusOr<TransferStats> Session::Upload(v1::TensorKind kind, const HostTensor& t,
                                              const TransferOptions& options) {
  return Upload({{kind, &t}}, options);
}

absl::StatusOr<TransferStats> Session::Upload(
    const std::vector<std::pair<v1::TensorKind, const HostTensor*>>& tensors,
    const TransferOptions& options) {
  for (const auto& [kind, tp] : tensors) {
    const HostTensor& t = *tp;
    ASSIGN_OR_RETURN(HostTensor expected, MakeTensor(spec_, kind));
    if (t.batch != expected.batch || t.rows != expected.rows || t.heads != expected.heads ||
        t.head_dim != expected.head_dim || t.dtype != expected.dtype ||
        t.size_bytes() != t.storage_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Upload ", TensorKindName(kind), ": tensor shape [", t.batch, ", ", t.rows, ", ",
          t.heads, ", ", t.head_dim, "] does not match the session's [", expected.batch, ", ",
          expected.rows, ", ", expected.heads, ", ", expected.head_dim, "] or its dtype/size"));
    }
  }
  std::vector<TransferStats> stats(static_cast<size_t>(num_workers()));
  for (int r = 0; r < num_workers(); ++r) DataClient(r);  // made here, not in the threads
  RETURN_IF_ERROR(ForEachRank(num_workers(), [&](int rank) -> absl::Status {
    WorkerDataClient& data = DataClient(rank);
    const std::vector<v1::RowRange> owned = Owned(info_.shards(rank));
    TransferStats& mine = stats[static_cast<size_t>(rank)];
    std::vector<std::vector<v1::RowRange>> blocks = {owned};
    if (options.row_blocks > 1) {
      const int64_t total = TotalRows(owned);
      const int64_t per =
          std::max<int64_t>(1, (total + options.row_blocks - 1) / options.row_blocks);
      blocks.clear();
      for (const v1::RowRange& piece : SplitRanges(owned, per)) blocks.push_back({piece});
    }
    for (const std::vector<v1::RowRange>& block : blocks) {
      for (const auto& [kind, tp] : tensors) {
        const HostTensor& t = *tp;
        TransferStats one;
        bool sent = false;
        if (UseShm(rank, options)) {
          auto r = data.UploadShm(kind, t, block, options.segment_bytes, options.progress);
          if (!r.ok() && options.path == TransferPath::kSharedMemory) return r.status();
          // kAuto: on failure fall back to the portable path (e.g. the worker is not really on
          // this host).
          if (r.ok()) {
            one = *r;
            sent = true;
          }
        }
        if (!sent) {
          ASSIGN_OR_RETURN(one,
                           data.UploadGrpc(kind, t, block, options.chunk_bytes, options.progress));
        }
        mine.bytes += one.bytes;
        mine.chunks += one.chunks;
        mine.seconds += one.seconds;
      }
    }
    return absl::OkStatus();
  }));
  TransferStats total;
  for (const auto& s : stats) {
    total.bytes += s.bytes;
    total.chunks += s.chunks;
    total.seconds = std::max(total.seconds, s.seconds);
  }
  return total;
}

absl::StatusOr<TransferStats> Session::Download(v1::TensorKind kind, HostTensor* t,
                                                const TransferOptions& options) {
  ASSIGN_OR_RETURN(*t, MakeTensor(spec_, kind));
  std::vector<TransferStats> stats(static_cast<size_t>(num_workers()));
  for (int r = 0; r < num_workers(); ++r) DataClient(r);  // made here, not in the threads
  RETURN_IF_ERROR(ForEachRank(num_workers(), [&](int rank) -> absl::Status {
    WorkerDataClient& data = DataClient(rank);
    const std::vector<v1::RowRange> owned = Owned(info_.shards(rank));
    if (UseShm(rank, options)) {
      auto r =
          data.DownloadShm(kind, owned, options.segment_bytes, t, options.progress, options.await);
      if (r.ok() || options.path == TransferPath::kSharedMemory) {
        if (r.ok()) stats[static_cast<size_t>(rank)] = *r;
        return r.status();
      }
    }
    ASSIGN_OR_RETURN(
        stats[static_cast<size_t>(rank)],
        data.DownloadGrpc(kind, owned, options.chunk_bytes, t, options.progress, options.await));
    return absl::OkStatus();
  }));
  TransferStats total;
  for (const auto& s : stats) {
    total.bytes += s.bytes;
    total.chunks += s.chunks;
    total.seconds = std::max(total.seconds, s.seconds);
  }
  return total;
}

absl::Status Session::GenerateInputs(uint64_t seed, bool with_grad_output) {
  for (int r = 0; r < num_workers(); ++r) DataClient(r);
  return ForEachRank(num_workers(), [&](int rank) {
    return DataClient(rank).GenerateInputs(seed, with_grad_output);
  });
}

absl::StatusOr<v1::Job> Session::Submit(v1::JobKind kind, bool inputs_streaming,
                                        bool outputs_streaming) {
  v1::SubmitJobRequest req;
  req.set_session_id(id());
  req.set_kind(kind);
  req.set_inputs_streaming(inputs_streaming);
  req.set_outputs_streaming(outputs_streaming);
  req.set_client_id(client_->client_id());
  grpc::ClientContext ctx;
  SetDeadline(&ctx, client_->options().rpc_timeout);
  AttachCapability(&ctx, capability());
  v1::Job job;
  RETURN_IF_ERROR(FromGrpc(client_->coordinator()->SubmitJob(&ctx, req, &job), "SubmitJob"));
  client_->RememberJob(*this, job.job_id());
  return job;
}

absl::StatusOr<v1::Job> Session::Watch(const std::string& job_id, const JobObserver& observer,
                                       RunCancel* cancel) {
  const absl::Time deadline = absl::Now() + client_->options().job_timeout;
  auto cancelled = [&] {
    return absl::CancelledError(absl::StrCat("WatchJob: cancelled while job ", job_id, " ran"));
  };
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, client_->options().job_timeout);
    AttachCapability(&ctx, capability());
    if (cancel != nullptr && !cancel->Enter(&ctx)) return cancelled();
    v1::GetJobRequest req;
    req.set_job_id(job_id);
    req.set_client_id(client_->client_id());
    auto reader = client_->coordinator()->WatchJob(&ctx, req);
    v1::Job job;
    while (reader->Read(&job)) {
      if (observer) observer(job);
      if (IsFinal(job.state())) {
        if (cancel != nullptr) cancel->Leave();
        ctx.TryCancel();
        (void)reader->Finish();
        return FinalResult(job);
      }
    }
    if (cancel != nullptr) cancel->Leave();
    grpc::Status s = reader->Finish();
    if (cancel != nullptr && cancel->cancelled()) return cancelled();
    // A broken or unsupported watch stream: fall back to polling. Other errors are answers.
    if (!s.ok() && s.error_code() != grpc::StatusCode::UNIMPLEMENTED &&
        s.error_code() != grpc::StatusCode::UNAVAILABLE && s.error_code() != grpc::StatusCode::OK) {
      return FromGrpc(s, "WatchJob");
    }
  }
  client_->RememberJob(*this, job_id);  // for the polls (a job id from elsewhere, too)
  while (absl::Now() < deadline) {
    if (cancel != nullptr && cancel->cancelled()) return cancelled();
    ASSIGN_OR_RETURN(v1::Job job, client_->GetJob(job_id));
    if (observer) observer(job);
    if (IsFinal(job.state())) return FinalResult(job);
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat("job ", job_id, " not finished after ",
                                                  absl::FormatDuration(client_->options().job_timeout)));
}

// ---------------------------------------------------------------- RunCancel

void RunCancel::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  if (ctx_ != nullptr) ctx_->TryCancel();
}

void RunCancel::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = false;
}

bool RunCancel::cancelled() {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

bool RunCancel::Enter(grpc::ClientContext* ctx) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_) return false;
  ctx_ = ctx;
  return true;
}

void RunCancel::Leave() {
  std::lock_guard<std::mutex> lock(mu_);
  ctx_ = nullptr;
}

// ---------------------------------------------------------------- Session (jobs)

absl::StatusOr<v1::Job> Session::SubmitAndWait(v1::JobKind kind, RunCancel* cancel,
                                               bool inputs_streaming) {
  v1::SubmitJobRequest req;
  req.set_session_id(id());
  req.set_kind(kind);
  req.set_inputs_streaming(inputs_streaming);
  req.set_client_id(client_->client_id());
  req.set_wait(true);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, client_->options().job_timeout);  // the call lasts the job
  AttachCapability(&ctx, capability());
  if (cancel != nullptr && !cancel->Enter(&ctx)) {
    return absl::CancelledError("SubmitJob: cancelled before the job was submitted");
  }
  v1::Job job;
  const grpc::Status s = client_->coordinator()->SubmitJob(&ctx, req, &job);
  if (cancel != nullptr) cancel->Leave();
  if (!s.ok()) {
    if (s.error_code() == grpc::StatusCode::CANCELLED && cancel != nullptr &&
        cancel->cancelled()) {
      return absl::CancelledError("SubmitJob: cancelled while the job ran (the coordinator "
                                  "cancels it)");
    }
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return absl::DeadlineExceededError(absl::StrCat(
          "SubmitJob (wait): the job did not finish within ",
          absl::FormatDuration(client_->options().job_timeout), " (job_timeout; it is cancelled)"));
    }
    return FromGrpc(s, "SubmitJob");
  }
  client_->RememberJob(*this, job.job_id());
  return job;
}

absl::StatusOr<v1::Job> Session::Run(v1::JobKind kind, const JobObserver& observer,
                                     const RunOptions& options) {
  ASSIGN_OR_RETURN(v1::Job job, options.wait
                                    ? SubmitAndWait(kind, options.cancel, options.inputs_streaming)
                                    : Submit(kind, options.inputs_streaming));
  if (observer) observer(job);
  if (IsFinal(job.state())) return FinalResult(job);
  return Watch(job.job_id(), observer);
}

absl::Status Session::Release() {
  if (released_) return absl::OkStatus();
  v1::ReleaseSessionRequest req;
  req.set_session_id(id());
  req.set_client_id(client_->client_id());
  grpc::ClientContext ctx;
  SetDeadline(&ctx, client_->options().rpc_timeout);
  AttachCapability(&ctx, capability());
  v1::ReleaseSessionResponse resp;
  absl::Status s = FromGrpc(client_->coordinator()->ReleaseSession(&ctx, req, &resp),
                            "ReleaseSession");
  client_->ForgetSession(id());
  released_ = true;  // a second attempt would not do better; the session TTL is the backstop
  return s;
}

}  // namespace dfa::client
