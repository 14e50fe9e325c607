#include "coordinator/job_manager.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/grpc_status.h"
#include "core/log.h"
#include "core/spec_validation.h"
#include "core/random_id.h"
#include "core/session_capability.h"
#include "coordinator/session_plan.h"
#include "core/mask.h"
#include "core/trace.h"

namespace dfa {

struct JobManager::Record {
  v1::Job job;
  std::shared_ptr<const SessionInfo> session;
  uint64_t version = 1;
  absl::Time submitted;
  absl::Time started;
  // Running: one call per rank. Sized once at start, never resized (callbacks hold pointers).
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<v1::RunJobRequest> requests;
  std::vector<v1::WorkerJobStats> responses;
  std::vector<bool> done;
  int pending = 0;
  absl::Status failure;  // first failure or cancellation; OK while all goes well
  FinalFn on_final;      // Submit's, told once by Flush after FinishLocked
  bool inputs_streaming = false;  // SubmitJobRequest.inputs_streaming, passed to every RunJob
  bool outputs_streaming = false;  // SubmitJobRequest.outputs_streaming, likewise
  absl::Time stop_requested = absl::InfinitePast();  // when the workers were asked to stop
  bool calls_cancelled = false;
  // DFA_TRACE_OPS=1 only: when each RunJob call left and came back.
  absl::Time issued = absl::InfinitePast();
  std::vector<absl::Time> returned;

  bool final() const { return job.state() >= v1::JOB_SUCCEEDED; }
};

namespace {

struct CancelCall {
  std::unique_ptr<grpc::ClientContext> ctx;
  v1::CancelWorkerJobRequest req;
  v1::CancelWorkerJobResponse resp;
};

// DFA_TRACE_OPS=1: one stderr line per finished job with the control plane's times (absolute
// unix microseconds, comparable with the workers' "job trace" lines on the same host).
bool TraceJobs() {
  return TraceOpsEnabled();
}

double JobFlops(const v1::AttentionSpec& s, v1::JobKind kind) {
  const double fwd = SpecForwardFlops(s);  // visible pairs under the mask (documents, window)
  return kind == v1::JOB_BACKWARD ? 2.5 * fwd : fwd;
}

}  // namespace

JobManager::JobManager(const CoordinatorOptions& options, WorkerStubs* stubs,
                       SessionManager* sessions, CoordinatorMetrics* metrics)
    : options_(options), stubs_(stubs), sessions_(sessions), metrics_(metrics) {}

JobManager::~JobManager() { Shutdown(); }

absl::StatusOr<v1::Job> JobManager::Submit(std::shared_ptr<const SessionInfo> session,
                                           v1::JobKind kind, FinalFn on_final,
                                           bool inputs_streaming, bool outputs_streaming) {
  if (kind != v1::JOB_FORWARD && kind != v1::JOB_BACKWARD) {
    return absl::InvalidArgumentError(
        absl::StrCat("kind: must be JOB_FORWARD or JOB_BACKWARD, got ", static_cast<int>(kind)));
  }
  v1::Job out;
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_) return absl::UnavailableError("the coordinator is shutting down");
    SessionJobs& sj = session_jobs_[session->session_id];
    if (!sj.active_job.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("session_id: job ", sj.active_job,
                                                        " of session ", session->session_id,
                                                        " has not finished yet"));
    }
    if (kind == v1::JOB_BACKWARD && !sj.forward_done) {
      return absl::FailedPreconditionError(
          absl::StrCat("kind: a backward job needs a succeeded forward job on session ",
                       session->session_id, " first"));
    }
    auto rec = std::make_shared<Record>();
    rec->session = session;
    rec->submitted = absl::Now();
    rec->on_final = std::move(on_final);
    rec->inputs_streaming = inputs_streaming;
    rec->outputs_streaming = outputs_streaming;
    v1::Job& job = rec->job;
    job.set_job_id(RandomId("j-"));
    job.set_session_id(session->session_id);
    job.set_kind(kind);
    job.set_state(v1::JOB_QUEUED);
    job.set_steps_total(TotalSteps(session->plan, kind == v1::JOB_BACKWARD));
    job.set_flops(JobFlops(session->spec, kind));
    sj.active_job = job.job_id();
    jobs_.emplace(job.job_id(), rec);
    queue_.push_back(job.job_id());
    TakeStartable();
    UpdateGaugesLocked();
    out = rec->job;
  }
  Flush();
  return out;
}

void JobManager::TakeStartable() {
  if (shutdown_) return;
  std::set<std::string> claimed = busy_workers_;
  for (auto it = queue_.begin(); it != queue_.end();) {
    std::shared_ptr<Record> rec = jobs_.at(*it);
    const auto& shards = rec->session->shards;
    bool free = true;
    for (const SessionShard& s : shards) free = free && !claimed.count(s.worker_id);
    for (const SessionShard& s : shards) claimed.insert(s.worker_id);
    if (!free) {
      ++it;
      continue;
    }
    it = queue_.erase(it);
    const int n = static_cast<int>(shards.size());
    rec->job.set_state(v1::JOB_RUNNING);
    rec->started = absl::Now();
    Changed(*rec);
    rec->contexts.resize(n);
    rec->requests.resize(n);
    rec->responses.resize(n);
    rec->done.assign(n, false);
    rec->pending = n;
    for (int r = 0; r < n; ++r) {
      rec->contexts[r] = ContextWithTimeout(options_.job_timeout);
      AttachCapability(rec->contexts[r].get(), rec->session->capability);
      v1::RunJobRequest& req = rec->requests[r];
      req.set_session_id(rec->session->session_id);
      req.set_job_id(rec->job.job_id());
      req.set_kind(rec->job.kind());
      req.set_inputs_streaming(rec->inputs_streaming);
      req.set_outputs_streaming(rec->outputs_streaming);
      for (const std::string& a : rec->session->transport_addresses) {
        req.add_peer_transport_addresses(a);
      }
      busy_workers_.insert(shards[r].worker_id);
    }
    calls_in_flight_ += n;
    running_++;
    to_launch_.push_back(rec);
  }
}

void JobManager::Flush() {
  std::vector<std::shared_ptr<Record>> launch, cancels;
  std::vector<std::pair<std::shared_ptr<Record>, int>> try_cancel;
  std::vector<std::string> touch;
  std::vector<std::pair<FinalFn, v1::Job>> tell;
  {
    absl::MutexLock lock(&mu_);
    launch.swap(to_launch_);
    cancels.swap(to_stop_);
    try_cancel.swap(to_try_cancel_);
    touch.swap(to_touch_);
    tell.swap(to_tell_);
  }
  // The waiting submitters first: their answer is the one a client is blocked on.
  for (auto& [fn, job] : tell) fn(job);
  for (const auto& rec : launch) {
    if (TraceJobs()) rec->issued = absl::Now();
    for (size_t r = 0; r < rec->contexts.size(); ++r) {
      const int rank = static_cast<int>(r);
      std::shared_ptr<v1::Worker::Stub> stub = stubs_->Get(rec->session->shards[r].address);
      stub->async()->RunJob(rec->contexts[r].get(), &rec->requests[r], &rec->responses[r],
                            [this, rec, rank](grpc::Status s) { OnWorkerDone(rec, rank, s); });
    }
  }
  for (const auto& rec : cancels) SendWorkerCancels(rec);
  for (const auto& [rec, rank] : try_cancel) rec->contexts[rank]->TryCancel();
  for (const std::string& id : touch) sessions_->Touch(id);
}

void JobManager::SendWorkerCancels(const std::shared_ptr<Record>& rec) {
  std::vector<int> ranks;
  absl::Duration timeout = options_.rpc_timeout;
  {
    absl::MutexLock lock(&mu_);
    // Shutting down waits for these calls: do not let an unresponsive worker hold it up.
    if (shutdown_) timeout = std::min(timeout, absl::Seconds(1));
    for (size_t r = 0; r < rec->done.size(); ++r) {
      if (!rec->done[r]) ranks.push_back(static_cast<int>(r));
    }
    calls_in_flight_ += static_cast<int>(ranks.size());
  }
  for (int r : ranks) {
    auto* call = new CancelCall;
    call->ctx = ContextWithTimeout(timeout);
    call->req.set_job_id(rec->job.job_id());
    stubs_->Get(rec->session->shards[r].address)
        ->async()
        ->CancelJob(call->ctx.get(), &call->req, &call->resp, [this, call](grpc::Status) {
          delete call;
          absl::MutexLock lock(&mu_);
          calls_in_flight_--;
        });
  }
}

void JobManager::OnWorkerDone(const std::shared_ptr<Record>& rec, int rank,
                              const grpc::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    calls_in_flight_--;
    rec->pending--;
    rec->done[rank] = true;
    if (TraceJobs()) {
      rec->returned.resize(rec->done.size(), absl::InfinitePast());
      rec->returned[rank] = absl::Now();
    }
    const SessionShard& shard = rec->session->shards[rank];
    if (status.ok()) {
      const v1::WorkerPlan& wp = rec->session->plan.workers(rank);
      rec->job.set_steps_done(rec->job.steps_done() + (rec->job.kind() == v1::JOB_BACKWARD
                                                           ? wp.backward_steps_size()
                                                           : wp.forward_steps_size()));
      rec->responses[rank].set_rank(rank);
    } else {
      FailLocked(*rec, FromGrpcStatus(status, absl::StrCat("worker ", shard.worker_id, " (",
                                                           shard.address, ") RunJob")));
    }
    Changed(*rec);
    if (rec->pending == 0) FinishLocked(*rec);
  }
  Flush();
}

void JobManager::FailLocked(Record& rec, absl::Status why) {
  if (rec.final()) return;
  if (rec.failure.ok()) rec.failure = std::move(why);
  if (rec.job.state() == v1::JOB_QUEUED) {
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      if (*it == rec.job.job_id()) {
        queue_.erase(it);
        break;
      }
    }
    FinishLocked(rec);
    return;
  }
  if (rec.stop_requested == absl::InfinitePast()) {
    rec.stop_requested = absl::Now();
    to_stop_.push_back(jobs_.at(rec.job.job_id()));
  }
}

void JobManager::FinishLocked(Record& rec) {
  v1::Job& job = rec.job;
  const bool was_running = job.state() == v1::JOB_RUNNING;
  const absl::Time now = absl::Now();
  if (rec.failure.ok()) {
    job.set_state(v1::JOB_SUCCEEDED);
  } else {
    job.set_state(rec.failure.code() == absl::StatusCode::kCancelled ? v1::JOB_CANCELLED
                                                                     : v1::JOB_FAILED);
    job.set_error_code(static_cast<int>(rec.failure.code()));
    job.set_error_message(std::string(rec.failure.message()));
    // One line per job that did not succeed (none for those that did: they are the metrics').
    const bool cancelled = job.state() == v1::JOB_CANCELLED;
    DFA_LOG_AT(cancelled ? LogLevel::kInfo : LogLevel::kWarning)
        << "job " << job.job_id() << " ("
        << (job.kind() == v1::JOB_BACKWARD ? "backward" : "forward") << ", session "
        << job.session_id() << ") " << (cancelled ? "cancelled" : "failed") << " after "
        << absl::Trunc(now - rec.submitted, absl::Microseconds(100)) << ": "
        << absl::StatusCodeToString(rec.failure.code()) << ": " << rec.failure.message();
  }
  if (was_running) {
    job.set_wall_seconds(absl::ToDoubleSeconds(now - rec.started));
    if (rec.failure.ok()) {  // the control plane's share: wall less the slowest worker's time
      double slowest = 0;
      for (const v1::WorkerJobStats& w : rec.responses) {
        slowest = std::max(slowest, w.busy_seconds() + w.idle_seconds());
      }
      metrics_->JobOverhead(job.kind(), std::max(0.0, job.wall_seconds() - slowest));
    }
    if (TraceJobs()) {
      std::string ranks;
      for (size_t r = 0; r < rec.returned.size(); ++r) {
        absl::StrAppend(&ranks, " rank ", r, " back +",
                        absl::ToDoubleMilliseconds(rec.returned[r] - rec.started), " ms;");
      }
      DFA_LOG(INFO) << absl::StrFormat(
          "coordinator trace %s: started at %d us, RunJob issued +%.3f ms;%s finished +%.3f ms",
          job.job_id(), absl::ToUnixMicros(rec.started),
          absl::ToDoubleMilliseconds(rec.issued - rec.started), ranks,
          absl::ToDoubleMilliseconds(now - rec.started));
    }
    for (size_t r = 0; r < rec.responses.size(); ++r) {
      if (rec.responses[r].rank() == static_cast<int>(r) && rec.done[r]) {
        *job.add_workers() = rec.responses[r];
      }
    }
    running_--;
    for (const SessionShard& s : rec.session->shards) busy_workers_.erase(s.worker_id);
  }
  Changed(rec);
  if (rec.on_final) to_tell_.emplace_back(std::move(rec.on_final), job);
  rec.on_final = nullptr;
  metrics_->JobFinished(job.kind(), job.state(), absl::ToDoubleSeconds(now - rec.submitted),
                        job.flops());
  if (auto it = session_jobs_.find(job.session_id()); it != session_jobs_.end()) {
    if (it->second.active_job == job.job_id()) it->second.active_job.clear();
    if (job.kind() == v1::JOB_FORWARD) {
      it->second.forward_done = job.state() == v1::JOB_SUCCEEDED;
    }
  }
  to_touch_.push_back(job.session_id());
  finished_.push_back(job.job_id());
  while (static_cast<int>(finished_.size()) > options_.max_retained_jobs) {
    jobs_.erase(finished_.front());
    finished_.pop_front();
  }
  TakeStartable();
  UpdateGaugesLocked();
}

void JobManager::SetChangeListener(std::function<void(const std::string&)> listener) {
  absl::MutexLock lock(&mu_);
  listener_ = std::move(listener);
}

void JobManager::Changed(Record& rec) {
  rec.version++;
  if (listener_) listener_(rec.job.job_id());
}

absl::StatusOr<std::shared_ptr<JobManager::Record>> JobManager::FindLocked(
    const std::string& job_id, const std::string& client_id, const std::string& capability) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job_id: unknown job ", job_id));
  const SessionInfo& session = *it->second->session;
  if (absl::Status access = CheckSessionAccess(session.session_id, session.client_id,
                                               session.capability, client_id, capability);
      !access.ok()) {
    return absl::Status(access.code(), absl::StrCat(access.message(), " (job ", job_id, ")"));
  }
  return it->second;
}

absl::StatusOr<v1::Job> JobManager::Get(const std::string& job_id, const std::string& client_id,
                                        const std::string& capability) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(std::shared_ptr<Record> rec, FindLocked(job_id, client_id, capability));
  return rec->job;
}

absl::StatusOr<v1::Job> JobManager::WaitForChange(const std::string& job_id,
                                                  const std::string& client_id,
                                                  const std::string& capability, uint64_t* version,
                                                  absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(std::shared_ptr<Record> rec, FindLocked(job_id, client_id, capability));
  if (*version != 0) {
    const uint64_t seen = *version;
    auto changed = [&]()
                       ABSL_NO_THREAD_SAFETY_ANALYSIS { return rec->version > seen || shutdown_; };
    mu_.AwaitWithTimeout(absl::Condition(&changed), timeout);
  }
  *version = rec->version;
  return rec->job;
}

absl::StatusOr<v1::Job> JobManager::Cancel(const std::string& job_id,
                                           const std::string& client_id,
                                           const std::string& capability,
                                           absl::string_view reason) {
  v1::Job out;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(std::shared_ptr<Record> rec, FindLocked(job_id, client_id, capability));
    FailLocked(*rec, absl::CancelledError(absl::StrCat(
                         "job ", job_id, " cancelled ", reason.empty() ? "by client" : reason)));
    Changed(*rec);
    out = rec->job;
  }
  Flush();
  return out;
}

void JobManager::ReleaseSession(const std::string& session_id) {
  {
    absl::MutexLock lock(&mu_);
    auto it = session_jobs_.find(session_id);
    if (it != session_jobs_.end()) {
      if (!it->second.active_job.empty()) {
        auto rec = jobs_.at(it->second.active_job);
        FailLocked(*rec,
                   absl::CancelledError(absl::StrCat("session ", session_id, " was released")));
        Changed(*rec);
      }
      session_jobs_.erase(session_id);
    }
  }
  Flush();
}

bool JobManager::SessionBusy(const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  auto it = session_jobs_.find(session_id);
  return it != session_jobs_.end() && !it->second.active_job.empty();
}

void JobManager::OnWorkerLost(const std::string& worker_id, uint64_t below_incarnation,
                              absl::string_view reason) {
  {
    absl::MutexLock lock(&mu_);
    std::vector<std::shared_ptr<Record>> hit;
    for (const auto& [id, sj] : session_jobs_) {
      if (sj.active_job.empty()) continue;
      std::shared_ptr<Record> rec = jobs_.at(sj.active_job);
      for (const SessionShard& s : rec->session->shards) {
        if (s.worker_id == worker_id && s.incarnation < below_incarnation) {
          hit.push_back(rec);
          break;
        }
      }
    }
    for (const auto& rec : hit) {
      for (const SessionShard& s : rec->session->shards) {
        if (s.worker_id != worker_id || rec->job.state() != v1::JOB_RUNNING) continue;
        // The lost worker will not answer: cancel its call now.
        if (!rec->done[s.rank]) to_try_cancel_.emplace_back(rec, s.rank);
      }
      FailLocked(*rec, absl::UnavailableError(absl::StrCat("worker ", worker_id, " ", reason,
                                                           " during job ", rec->job.job_id())));
      Changed(*rec);
    }
  }
  Flush();
}

void JobManager::Tick(absl::Time now) {
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, sj] : session_jobs_) {
      if (sj.active_job.empty()) continue;
      std::shared_ptr<Record> rec = jobs_.at(sj.active_job);
      if (rec->job.state() != v1::JOB_RUNNING || rec->calls_cancelled ||
          rec->stop_requested == absl::InfinitePast() ||
          now - rec->stop_requested < options_.rpc_timeout) {
        continue;
      }
      rec->calls_cancelled = true;
      for (size_t r = 0; r < rec->done.size(); ++r) {
        if (!rec->done[r]) to_try_cancel_.emplace_back(rec, static_cast<int>(r));
      }
    }
  }
  Flush();
}

void JobManager::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (!shutdown_) {
      shutdown_ = true;
      std::vector<std::shared_ptr<Record>> active;
      for (const auto& [id, rec] : jobs_) {
        if (!rec->final()) active.push_back(rec);
      }
      for (const auto& rec : active) {
        if (rec->job.state() == v1::JOB_RUNNING) {
          for (size_t r = 0; r < rec->done.size(); ++r) {
            if (!rec->done[r]) to_try_cancel_.emplace_back(rec, static_cast<int>(r));
          }
        }
        // Retryable: the client resubmits on a restarted coordinator (a new session there).
        FailLocked(*rec, absl::UnavailableError("the coordinator is shutting down"));
        Changed(*rec);
      }
    }
  }
  Flush();
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return calls_in_flight_ == 0; };
  mu_.Await(absl::Condition(&idle));
}

int JobManager::running() {
  absl::MutexLock lock(&mu_);
  return running_;
}

int JobManager::queued() {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(queue_.size());
}

void JobManager::UpdateGaugesLocked() { metrics_->SetQueueDepth(static_cast<int>(queue_.size())); }

}  // namespace dfa
