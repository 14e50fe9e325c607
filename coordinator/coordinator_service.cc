#include "coordinator/coordinator_service.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/grpc_status.h"

namespace dfa {
namespace {

// How long one WatchJob wait lasts before it re-checks the client and the server.
constexpr absl::Duration kWatchPoll = absl::Milliseconds(250);

}  // namespace

CoordinatorService::CoordinatorService(const CoordinatorOptions& options,
                                       CoordinatorMetrics* metrics,
                                       std::shared_ptr<const RpcSecurity> security)
    : options_(options),
      metrics_(metrics),
      registry_(options.lease),
      stubs_(std::move(security)),
      sessions_(options, &registry_, &stubs_),
      jobs_(options, &stubs_, &sessions_, metrics) {}

CoordinatorService::~CoordinatorService() { Shutdown(); }

void CoordinatorService::Shutdown() {
  shutting_down_ = true;
  jobs_.Shutdown();
}

absl::Status CoordinatorService::Authorize(const grpc::ServerContext& ctx) const {
  if (options_.auth_token.empty()) return absl::OkStatus();
  const std::string expected = absl::StrCat("Bearer ", options_.auth_token);
  auto range = ctx.client_metadata().equal_range("authorization");
  for (auto it = range.first; it != range.second; ++it) {
    if (std::string(it->second.data(), it->second.size()) == expected) return absl::OkStatus();
  }
  return absl::UnauthenticatedError(
      "authorization: missing or wrong token (metadata \"authorization: Bearer <token>\")");
}

grpc::Status CoordinatorService::Reply(const char* method, const absl::Status& status) {
  if (!status.ok()) metrics_->GrpcError(method, static_cast<int>(status.code()));
  return ToGrpcStatus(status);
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
    ASSIGN_OR_RETURN(std::shared_ptr<const SessionInfo> session,
                     sessions_.Use(req->session_id(), req->client_id()));
    ASSIGN_OR_RETURN(*resp, jobs_.Submit(std::move(session), req->kind()));
    return absl::OkStatus();
  };
  return Reply("SubmitJob", run());
}

grpc::Status CoordinatorService::GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req,
                                        v1::Job* resp) {
  auto run = [&]() -> absl::Status {
    RETURN_IF_ERROR(Authorize(*ctx));
    ASSIGN_OR_RETURN(*resp, jobs_.Get(req->job_id(), req->client_id()));
    return absl::OkStatus();
  };
  return Reply("GetJob", run());
}

grpc::Status CoordinatorService::WatchJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req,
                                          grpc::ServerWriter<v1::Job>* writer) {
  auto run = [&]() -> absl::Status {
    RETURN_IF_ERROR(Authorize(*ctx));
    uint64_t version = 0;
    uint64_t sent = 0;
    while (true) {
      ASSIGN_OR_RETURN(v1::Job job,
                       jobs_.WaitForChange(req->job_id(), req->client_id(), &version, kWatchPoll));
      if (version != sent) {
        if (!writer->Write(job)) {
          return absl::CancelledError("job_id: watcher went away");
        }
        sent = version;
      }
      if (job.state() >= v1::JOB_SUCCEEDED) return absl::OkStatus();
      if (ctx->IsCancelled()) return absl::CancelledError("job_id: watch cancelled by client");
      if (shutting_down_) return absl::UnavailableError("the coordinator is shutting down");
    }
  };
  return Reply("WatchJob", run());
}

grpc::Status CoordinatorService::CancelJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req,
                                           v1::Job* resp) {
  auto run = [&]() -> absl::Status {
    RETURN_IF_ERROR(Authorize(*ctx));
    ASSIGN_OR_RETURN(*resp, jobs_.Cancel(req->job_id(), req->client_id()));
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
    RETURN_IF_ERROR(sessions_.CheckOwner(req->session_id(), req->client_id(), &released_already));
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
      info->set_alive(now - w.last_seen <= options_.lease);
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
  bool replaced = false;
  absl::StatusOr<uint64_t> incarnation = registry_.Register(*req, absl::Now(), &replaced);
  if (incarnation.ok()) {
    // A worker registering again under its id has restarted: what it held is gone.
    if (replaced) WorkerLost(req->worker_id(), *incarnation, "re-registered (restarted)");
    resp->set_lease_ms(LeaseMs());
    metrics_->SetLiveWorkers(registry_.size());
  }
  return Reply("RegisterWorker", incarnation.status());
}

grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext* ctx,
                                           const v1::HeartbeatRequest* req,
                                           v1::HeartbeatResponse* resp) {
  absl::Status s = registry_.Heartbeat(*req, absl::Now());
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
  for (const std::string& id : registry_.ExpireLeases(now)) {
    WorkerLost(id, std::numeric_limits<uint64_t>::max(), reason);
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
