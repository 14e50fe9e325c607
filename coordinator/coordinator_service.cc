#include "coordinator/coordinator_service.h"

#include <algorithm>
#include <iostream>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/grpc_status.h"
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
  watches_.Shutdown();  // ends the open WatchJob streams (UNAVAILABLE)
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
  absl::Status s = Authorize(*ctx);
  if (s.ok()) {
    absl::StatusOr<v1::CreateSessionResponse> r = sessions_.Create(*req);
    if (r.ok()) {
      *resp = std::move(*r);
    } else {
      s = r.status();
    }
  }
  return Reply("CreateSession", s);
}

grpc::Status CoordinatorService::SubmitJob(grpc::ServerContext* ctx,
                                           const v1::SubmitJobRequest* req, v1::Job* resp) {
  auto run = [&]() -> absl::Status {
    RETURN_IF_ERROR(Authorize(*ctx));
    ASSIGN_OR_RETURN(
        std::shared_ptr<const SessionInfo> session,
        sessions_.Use(req->session_id(), req->client_id(), PresentedCapability(*ctx)));
    ASSIGN_OR_RETURN(*resp, jobs_.Submit(std::move(session), req->kind()));
    return absl::OkStatus();
  };
  return Reply("SubmitJob", run());
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
    jobs_.ReleaseSession(req->session_id());
    sessions_.Remove(req->session_id());
    return absl::OkStatus();
  };
  return Reply("ReleaseSession", run());
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
    WorkerLost(id, std::numeric_limits<uint64_t>::max(), reason);
  }
  if (registry_.stalls() != stalls) {
    std::cerr << "dfa-coordinator: the lease check did not run for longer than a heartbeat "
                 "period (the coordinator was stopped or starved); every worker's lease "
                 "restarts now instead of running out"
              << std::endl;
  }
  for (const std::string& id : sessions_.Expired(now)) {
    if (jobs_.SessionBusy(id)) {
      sessions_.Touch(id);
      continue;
    }
    jobs_.ReleaseSession(id);
    sessions_.Remove(id);
  }
  jobs_.Tick(now);
  metrics_->SetLiveWorkers(registry_.size());
  metrics_->SetSessions(sessions_.count());
  metrics_->SetMemoryReserved(sessions_.TotalReservedBytes());
}

}  // namespace dfa
