// The Coordinator gRPC service (dfa/v1/coordinator.proto): the one place where requests meet
// the registry, the sessions and the jobs, and where absl::Status becomes grpc::Status.
//
// Lifetime: owns the registry, session and job managers. Tick() must be called periodically
// (CoordinatorServer does) to expire leases and sessions. Shutdown() cancels running jobs and
// ends watch streams; call it before the gRPC server's Shutdown so that streams return.
// Thread safety: every method may be called concurrently (gRPC's sync server threads).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "coordinator/client_groups.h"
#include "coordinator/client_lease.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/job_manager.h"
#include "coordinator/job_watch.h"
#include "coordinator/lease_stream.h"
#include "coordinator/options.h"
#include "coordinator/session_manager.h"
#include "coordinator/worker_admission.h"
#include "coordinator/worker_registry.h"
#include "coordinator/worker_stubs.h"
#include "dfa/v1/coordinator.grpc.pb.h"

namespace dfa {

// SubmitJob, WatchJob and HoldLease are callback (reactor) methods: a waiting submit, a watch or
// a client's lease stream costs no thread (coordinator/job_watch.h, coordinator/lease_stream.h).
class CoordinatorService final
    : public v1::Coordinator::WithCallbackMethod_SubmitJob<
          v1::Coordinator::WithCallbackMethod_WatchJob<
              v1::Coordinator::WithCallbackMethod_HoldLease<v1::Coordinator::Service>>> {
 public:
  // `security`: credentials of the channels to workers (null: insecure).
  CoordinatorService(const CoordinatorOptions& options, CoordinatorMetrics* metrics,
                     std::shared_ptr<const RpcSecurity> security = nullptr);
  ~CoordinatorService() override;

  grpc::Status CreateSession(grpc::ServerContext* ctx, const v1::CreateSessionRequest* req,
                             v1::CreateSessionResponse* resp) override;
  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* ctx,
                                      const v1::SubmitJobRequest* req, v1::Job* resp) override;
  grpc::Status GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req,
                      v1::Job* resp) override;
  grpc::ServerWriteReactor<v1::Job>* WatchJob(grpc::CallbackServerContext* ctx,
                                              const v1::GetJobRequest* req) override;
  grpc::Status CancelJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req,
                         v1::Job* resp) override;
  grpc::Status ReleaseSession(grpc::ServerContext* ctx, const v1::ReleaseSessionRequest* req,
                              v1::ReleaseSessionResponse* resp) override;
  // The NCCL communicator of a client and its session's workers (coordinator/client_groups.h).
  grpc::Status JoinClientGroup(grpc::ServerContext* ctx, const v1::JoinClientGroupRequest* req,
                               v1::JoinClientGroupResponse* resp) override;
  grpc::Status ListWorkers(grpc::ServerContext* ctx, const v1::ListWorkersRequest* req,
                           v1::ListWorkersResponse* resp) override;
  grpc::Status GetStatus(grpc::ServerContext* ctx, const v1::GetStatusRequest* req,
                         v1::ClusterStatus* resp) override;
  grpc::Status RegisterWorker(grpc::ServerContext* ctx, const v1::RegisterWorkerRequest* req,
                              v1::RegisterWorkerResponse* resp) override;
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override;
  grpc::ServerBidiReactor<v1::LeaseBeat, v1::LeaseState>* HoldLease(
      grpc::CallbackServerContext* ctx) override;

  // Expires leases (failing the lost workers' jobs and sessions; after a stall of the
  // coordinator itself, restarts them instead: WorkerRegistry), idle sessions and lost client
  // leases (releasing their sessions); updates the gauges.
  void Tick(absl::Time now);
  void Shutdown();
  // Registered workers whose lease is valid now (the coordinator is ready with at least one).
  int LiveWorkers() const;

 private:
  // Client RPCs: UNAUTHENTICATED unless the request carries the client token (when one is
  // set); PERMISSION_DENIED for a call carrying the worker token (when one is set).
  absl::Status Authorize(const grpc::ServerContextBase& ctx) const;
  // Worker RPCs: UNAUTHENTICATED unless the request carries the worker token (when one is set).
  absl::Status AuthorizeWorker(const grpc::ServerContext& ctx, const char* method) const;
  // Converts and counts the answer (dfa_coordinator_requests_total, dfa_grpc_errors_total).
  grpc::Status Reply(const char* method, const absl::Status& status);
  void WorkerLost(const std::string& worker_id, uint64_t below_incarnation,
                  absl::string_view reason);
  // The one release path (ReleaseSession, time-to-live, lost client lease): cancels the
  // session's jobs, closes it on its workers, forgets it in its lease.
  void ReleaseNow(const std::string& session_id);
  // Releases the sessions of client leases lost for longer than their grace.
  void ReclaimLostLeases(absl::Time now);
  int LeaseMs() const;

  const CoordinatorOptions options_;
  CoordinatorMetrics* const metrics_;
  WorkerRegistry registry_;
  WorkerStubs stubs_;
  WorkerAdmission admission_;
  SessionManager sessions_;
  ClientLeases leases_;
  ClientGroupBroker client_groups_;
  LeaseStreamHub lease_streams_;
  // Before jobs_: the JobManager tells it about changes until the manager is gone.
  JobWatchHub watches_;
  JobManager jobs_;
  std::atomic<bool> shutting_down_{false};
};

}  // namespace dfa
