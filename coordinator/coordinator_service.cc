#include "coordinator/coordinator_service.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/grpc_status.h"
#include "core/log.h"
#include "core/session_capability.h"

namespace dfa {

CoordinatorService::CoordinatorService(const CoordinatorOptions& options,
                                       CoordinatorMetrics* metrics,
                                       std::shared_ptr<const RpcSecurity> security)
    : options_(options),
      metrics_(metrics),
      registry_(options.lease, std::max(options.lease / 3, 2 * options.tick)),
      stubs_(std::move(security)),
      admission_(&registry_, &stubs_, options.register_check_timeout),
      sessions_(options, &registry_, &stubs_),
      leases_(options.client_lease, options.tick),
      lease_streams_(&leases_, 2 * options.client_lease.max_leases,
                     [this](const absl::Status& s) { return Reply("HoldLease", s); }),
      watches_(&jobs_,
               WatchLimits{options.limits.max_watch_streams,
                           options.limits.max_watch_streams_per_client},
               [this](const absl::Status& s) { return Reply("WatchJob", s); }),
      jobs_(options, &stubs_, &sessions_, metrics) {
  jobs_.SetChangeListener([this](const std::string& job_id) { watches_.Notify(job_id); });
}

CoordinatorService::~CoordinatorService() { Shutdown(); }

void CoordinatorService::Shutdown() {
  shutting_down_ = true;
  jobs_.Shutdown();
  watches_.Shutdown();        // ends the open WatchJob streams (UNAVAILABLE)
  lease_streams_.Shutdown();  // ends the open HoldLease streams (UNAVAILABLE); leases stay
}

absl::Status CoordinatorService::Authorize(const grpc::ServerContextBase& ctx) const {
  if (!options_.worker_token.empty() && CarriesBearerToken(ctx, options_.worker_token)) {
    return absl::PermissionDeniedError(
        "authorization: the worker token admits only RegisterWorker and Heartbeat; clients use "
        "the client token (--auth_token)");
  }
  if (options_.auth_token.empty() || CarriesBearerToken(ctx, options_.auth_token)) {
    return absl::OkStatus();
  }
  return absl::UnauthenticatedError(
      "authorization: missing or wrong token (metadata \"authorization: Bearer <token>\")");
}

absl::Status CoordinatorService::AuthorizeWorker(const grpc::ServerContext& ctx,
                                                 const char* method) const {
  if (options_.worker_token.empty() || CarriesBearerToken(ctx, options_.worker_token)) {
    return absl::OkStatus();
  }
  return absl::UnauthenticatedError(absl::StrCat(
      "authorization: ", method, " needs the worker token (metadata \"authorization: Bearer "
      "<worker token>\", dfa-worker --worker_token); missing or wrong"));
}

grpc::Status CoordinatorService::Reply(const char* method, const absl::Status& status) {
  metrics_->RpcAnswered(method, static_cast<int>(status.code()));
  return ToGrpcStatus(status);
}

int CoordinatorService::LiveWorkers() const {
  const absl::Time now = absl::Now();
  int live = 0;
  for (const RegisteredWorker& w : registry_.Snapshot()) live += registry_.Live(w, now) ? 1 : 0;
  return live;
}

int CoordinatorService::LeaseMs() const {
  return static_cast<int>(absl::ToInt64Milliseconds(options_.lease));
}

grpc::Status CoordinatorService::CreateSession(grpc::ServerContext* ctx,
                                               const v1::CreateSessionRequest* req,
                                               v1::CreateSessionResponse* resp) {
  auto run = [&]() -> absl::Status {
    RETURN_IF_ERROR(Authorize(*ctx));
    std::string lease_secret;
    if (!req->lease_id().empty()) {
      const auto& md = ctx->client_metadata();
      if (auto it = md.find(kLeaseSecretMetadata); it != md.end()) {
        lease_secret.assign(it->second.data(), it->second.size());
      }
      RETURN_IF_ERROR(leases_.CheckCanAdd(req->lease_id(), lease_secret));
    }
    ASSIGN_OR_RETURN(*resp, sessions_.Create(*req));
    if (!req->lease_id().empty()) {
      // The lease may have expired (or filled up) while the session was opening.
      absl::Status recorded = leases_.AddSession(req->lease_id(), lease_secret, resp->session_id());
      if (!recorded.ok()) {
        sessions_.Remove(resp->session_id());
        resp->Clear();
        return recorded;
      }
    }
    return absl::OkStatus();
  };
  return Reply("CreateSession", run());
}

grpc::ServerUnaryReactor* CoordinatorService::SubmitJob(grpc::CallbackServerContext* ctx,
                                                        const v1::SubmitJobRequest* req,
                                                        v1::Job* resp) {
  std::string capability = PresentedCapability(*ctx);
  const absl::Status admitted = Authorize(*ctx);
  absl::StatusOr<std::shared_ptr<const SessionInfo>> session =
      admitted.ok() ? sessions_.Use(req->session_id(), req->client_id(), capability)
                    : absl::StatusOr<std::shared_ptr<const SessionInfo>>(admitted);
  return StartSubmitJob(&jobs_, *req, std::move(session), std::move(capability), resp,
                        [this](const absl::Status& s) { return Reply("SubmitJob", s); });
}

grpc::Status CoordinatorService::GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req,
                                        v1::Job* resp) {
  auto run = [&]() -> absl::Status {
    RETURN_IF_ERROR(Authorize(*ctx));
    ASSIGN_OR_RETURN(*resp,
                     jobs_.Get(req->job_id(), req->client_id(), PresentedCapability(*ctx)));
    return absl::OkStatus();
  };
  return Reply("GetJob", run());
}

grpc::ServerWriteReactor<v1::Job>* CoordinatorService::WatchJob(grpc::CallbackServerContext* ctx,
                                                                const v1::GetJobRequest* req) {
  return watches_.Start(*req, Authorize(*ctx), PresentedCapability(*ctx));
}

grpc::Status CoordinatorService::CancelJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req,
                                           v1::Job* resp) {
  auto run = [&]() -> absl::Status {
    RETURN_IF_ERROR(Authorize(*ctx));
    ASSIGN_OR_RETURN(*resp,
                     jobs_.Cancel(req->job_id(), req->client_id(), PresentedCapability(*ctx)));
    return absl::OkStatus();
  };
  return Reply("CancelJob", run());
}

grpc::Status CoordinatorService::ReleaseSession(grpc::ServerContext* ctx,
                                                const v1::ReleaseSessionRequest* req,
                                                v1::ReleaseSessionResponse* resp) {
  auto run = [&]() -> absl::Status {
    RETURN_IF_ERROR(Authorize(*ctx));
    bool released_already = false;
    RETURN_IF_ERROR(sessions_.CheckOwner(req->session_id(), req->client_id(),
                                         PresentedCapability(*ctx), &released_already));
    if (released_already) return absl::OkStatus();
    ReleaseNow(req->session_id());
    DFA_LOG(INFO) << "session " << req->session_id() << " released by client "
                  << (req->client_id().empty() ? "(unnamed)" : req->client_id());
    return absl::OkStatus();
  };
  return Reply("ReleaseSession", run());
}

grpc::Status CoordinatorService::JoinClientGroup(grpc::ServerContext* ctx,
                                                 const v1::JoinClientGroupRequest* req,
                                                 v1::JoinClientGroupResponse* resp) {
  absl::Status st = [&]() -> absl::Status {
    RETURN_IF_ERROR(Authorize(*ctx));
    RETURN_IF_ERROR(ValidateJoinClientGroupRequest(*req));
    ASSIGN_OR_RETURN(std::shared_ptr<const SessionInfo> info,
                     sessions_.Use(req->session_id(), req->client_id(), PresentedCapability(*ctx)));
    auto join = [&](const SessionShard& shard,
                    const v1::WorkerJoinClientGroupRequest& w) -> absl::Status {
      v1::WorkerJoinClientGroupResponse r;
      auto wctx = ContextWithTimeout(options_.rpc_timeout);
      AttachCapability(wctx.get(), info->capability);
      return FromGrpcStatus(stubs_.Get(shard.address)->JoinClientGroup(wctx.get(), w, &r),
                            "Worker.JoinClientGroup");
    };
    ASSIGN_OR_RETURN(*resp, client_groups_.Join(*info, *req, join));
    return absl::OkStatus();
  }();
  return Reply("JoinClientGroup", st);
}

grpc::Status CoordinatorService::ListWorkers(grpc::ServerContext* ctx,
                                             const v1::ListWorkersRequest* req,
                                             v1::ListWorkersResponse* resp) {
  absl::Status s = Authorize(*ctx);
  if (s.ok()) {
    const absl::Time now = absl::Now();
    for (const RegisteredWorker& w : registry_.Snapshot()) {
      v1::WorkerInfo* info = resp->add_workers();
      info->set_worker_id(w.info.worker_id());
      info->set_address(w.info.address());
      info->set_host(w.info.host());
      info->set_backend(w.info.backend());
      info->set_device(w.info.device());
      info->set_memory_limit_bytes(w.info.memory_limit_bytes());
      info->set_memory_used_bytes(
          std::max(w.reported_used_bytes, sessions_.ReservedBytes(w.info.worker_id())));
      info->set_speed(w.info.speed());
      info->set_last_seen_seconds(absl::ToDoubleSeconds(now - w.last_seen));
      info->set_alive(registry_.Live(w, now));
      info->set_incarnation(w.incarnation);
    }
  }
  return Reply("ListWorkers", s);
}

grpc::Status CoordinatorService::GetStatus(grpc::ServerContext* ctx,
                                           const v1::GetStatusRequest* req,
                                           v1::ClusterStatus* resp) {
  absl::Status s = Authorize(*ctx);
  if (s.ok()) {
    int64_t limit = 0;
    std::vector<RegisteredWorker> workers = registry_.Snapshot();
    for (const RegisteredWorker& w : workers) limit += w.info.memory_limit_bytes();
    resp->set_live_workers(static_cast<int>(workers.size()));
    resp->set_sessions(sessions_.count());
    resp->set_jobs_running(jobs_.running());
    resp->set_jobs_queued(jobs_.queued());
    resp->set_memory_used_bytes(sessions_.TotalReservedBytes());
    resp->set_memory_limit_bytes(limit);
    resp->set_client_leases(leases_.count());
  }
  return Reply("GetStatus", s);
}

grpc::Status CoordinatorService::RegisterWorker(grpc::ServerContext* ctx,
                                                const v1::RegisterWorkerRequest* req,
                                                v1::RegisterWorkerResponse* resp) {
  auto run = [&]() -> absl::Status {
    RETURN_IF_ERROR(AuthorizeWorker(*ctx, "RegisterWorker"));
    ASSIGN_OR_RETURN(Admission admitted, admission_.Admit(*req));
    // A new process under the id (restarted, or the old one's lease ran out): what the old
    // one held is gone.
    if (admitted.replaced) {
      DFA_LOG(WARNING) << "worker " << req->worker_id()
                       << " lost: replaced by a new process at " << req->address()
                       << " (restarted); its sessions and running jobs fail";
      WorkerLost(req->worker_id(), admitted.incarnation,
                 absl::StrCat("was replaced by a new process at ", req->address(),
                              " (restarted)"));
    }
    resp->set_lease_ms(LeaseMs());
    metrics_->SetLiveWorkers(registry_.size());
    return absl::OkStatus();
  };
  return Reply("RegisterWorker", run());
}

grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext* ctx,
                                           const v1::HeartbeatRequest* req,
                                           v1::HeartbeatResponse* resp) {
  absl::Status s = AuthorizeWorker(*ctx, "Heartbeat");
  if (s.ok()) s = registry_.Heartbeat(*req, absl::Now());
  if (s.ok()) resp->set_lease_ms(LeaseMs());
  return Reply("Heartbeat", s);
}

grpc::ServerBidiReactor<v1::LeaseBeat, v1::LeaseState>* CoordinatorService::HoldLease(
    grpc::CallbackServerContext* ctx) {
  return lease_streams_.Start(Authorize(*ctx));
}

void CoordinatorService::ReleaseNow(const std::string& session_id) {
  jobs_.ReleaseSession(session_id);
  leases_.ForgetSession(sessions_.Remove(session_id), session_id);
}

void CoordinatorService::ReclaimLostLeases(absl::Time now) {
  for (const ClientLeases::Expired& lease : leases_.Expire(now)) {
    if (lease.session_ids.empty()) continue;  // its client released everything already
    for (const std::string& id : lease.session_ids) {
      ReleaseNow(id);
      DFA_LOG(INFO) << "session " << id << " reclaimed: its client lease " << lease.lease_id
                    << " was lost";
    }
    metrics_->LeaseSessionsReclaimed(static_cast<int>(lease.session_ids.size()));
    DFA_LOG(WARNING) << "client lease " << lease.lease_id << " of client "
                     << (lease.client_id.empty() ? "(unnamed)" : lease.client_id) << " lost ("
                     << lease.why << ") and not re-attached within "
                     << absl::FormatDuration(leases_.options().grace) << ": released its "
                     << lease.session_ids.size() << " sessions";
  }
  metrics_->SetClientLeases(leases_.count());
}

void CoordinatorService::WorkerLost(const std::string& worker_id, uint64_t below_incarnation,
                                    absl::string_view reason) {
  jobs_.OnWorkerLost(worker_id, below_incarnation, reason);
  sessions_.OnWorkerLost(worker_id, below_incarnation, reason);
}

void CoordinatorService::Tick(absl::Time now) {
  const std::string reason =
      absl::StrCat("was lost (no heartbeat for one lease, ", LeaseMs(), " ms)");
  const int stalls = registry_.stalls();
  for (const std::string& id : registry_.ExpireLeases(now)) {
    DFA_LOG(WARNING) << "worker " << id << " lost: lease expired (no heartbeat for "
                     << LeaseMs() << " ms); its sessions and running jobs fail";
    WorkerLost(id, std::numeric_limits<uint64_t>::max(), reason);
  }
  if (registry_.stalls() != stalls) {
    DFA_LOG(WARNING) << "the lease check did not run for longer than a heartbeat period (the "
                        "coordinator was stopped or starved); every worker's lease restarts "
                        "now instead of running out";
  }
  for (const std::string& id : sessions_.Expired(now)) {
    if (jobs_.SessionBusy(id)) {
      sessions_.Touch(id);
      continue;
    }
    ReleaseNow(id);
    DFA_LOG(INFO) << "session " << id << " expired: idle for longer than its time-to-live";
  }
  ReclaimLostLeases(now);
  jobs_.Tick(now);
  metrics_->SetLiveWorkers(registry_.size());
  metrics_->SetSessions(sessions_.count());
  metrics_->SetMemoryReserved(sessions_.TotalReservedBytes());
}

}  // namespace dfa
