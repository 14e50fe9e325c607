#include "fake_worker.h"

#include "absl/strings/str_cat.h"
#include "core/session_capability.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace dfa::testing {

FakeWorker::FakeWorker(FakeWorkerOptions options)
    : options_(std::move(options)), block_runs_(options_.block_runs) {}

FakeWorker::~FakeWorker() {
  StopHeartbeats();
  {
    absl::MutexLock lock(&mu_);
    cancel_all_ = true;  // releases blocked RunJob calls
  }
  if (server_) {
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    server_->Wait();
  }
}

void FakeWorker::Start(const std::string& coordinator) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(this);
  server_ = builder.BuildAndStart();
  address_ = absl::StrCat("127.0.0.1:", port);
  coordinator_ = v1::Coordinator::NewStub(
      grpc::CreateChannel(coordinator, grpc::InsecureChannelCredentials()));
  Register();
  heartbeats_ = std::thread([this] { HeartbeatLoop(); });
}

void FakeWorker::Register() {
  v1::RegisterWorkerRequest req;
  req.set_worker_id(options_.id);
  req.set_address(address_);
  req.set_host("localhost");
  req.set_backend(options_.backend);
  req.set_device(options_.backend == "cuda" ? "fake-gpu" : "fake-cpu");
  req.set_memory_limit_bytes(options_.memory_limit_bytes);
  req.set_speed(options_.speed);
  req.set_device_uuid(options_.device_uuid);
  req.add_transports(options_.backend == "cuda" ? "nccl" : "ucx");
  v1::RegisterWorkerResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  if (coordinator_->RegisterWorker(&ctx, req, &resp).ok()) registrations_++;
}

void FakeWorker::HeartbeatLoop() {
  while (!stop_heartbeats_.WaitForNotificationWithTimeout(options_.heartbeat)) {
    v1::HeartbeatRequest req;
    req.set_worker_id(options_.id);
    v1::HeartbeatResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    grpc::Status s = coordinator_->Heartbeat(&ctx, req, &resp);
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) Register();
  }
}

void FakeWorker::StopHeartbeats() {
  if (!stop_heartbeats_.HasBeenNotified()) stop_heartbeats_.Notify();
  if (heartbeats_.joinable()) heartbeats_.join();
}

v1::OpenSessionRequest FakeWorker::last_open() {
  absl::MutexLock lock(&mu_);
  return last_open_;
}

grpc::Status FakeWorker::OpenSession(grpc::ServerContext*, const v1::OpenSessionRequest* req,
                                     v1::OpenSessionResponse* resp) {
  opened_++;
  absl::MutexLock lock(&mu_);
  last_open_ = *req;
  resp->set_transport_address(options_.transport_address.empty()
                                  ? absl::StrCat("addr-", options_.id)
                                  : options_.transport_address);
  return grpc::Status::OK;
}

grpc::Status FakeWorker::RunJob(grpc::ServerContext* ctx, const v1::RunJobRequest* req,
                                v1::WorkerJobStats* resp) {
  runs_started_++;
  const absl::Time end = absl::Now() + options_.run_time;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_job_ == req->job_id() || cancel_all_ || ctx->IsCancelled()) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "job cancelled");
      }
    }
    if (!block_runs_ && absl::Now() >= end) break;
    absl::SleepFor(absl::Milliseconds(2));
  }
  resp->set_busy_seconds(absl::ToDoubleSeconds(options_.run_time));
  resp->set_idle_seconds(0.001);
  resp->set_bytes_sent(1000);
  resp->set_bytes_received(1000);
  resp->set_kernel_launches(3);
  return grpc::Status::OK;
}

grpc::Status FakeWorker::CancelJob(grpc::ServerContext*, const v1::CancelWorkerJobRequest* req,
                                   v1::CancelWorkerJobResponse*) {
  cancels_++;
  absl::MutexLock lock(&mu_);
  cancelled_job_ = req->job_id();
  return grpc::Status::OK;
}

grpc::Status FakeWorker::CloseSession(grpc::ServerContext*, const v1::CloseSessionRequest*,
                                      v1::CloseSessionResponse*) {
  closed_++;
  return grpc::Status::OK;
}

grpc::Status FakeWorker::JoinClientGroup(grpc::ServerContext* ctx,
                                         const v1::WorkerJoinClientGroupRequest* req,
                                         v1::WorkerJoinClientGroupResponse*) {
  if (options_.join_client_group_code != grpc::StatusCode::OK) {
    return grpc::Status(options_.join_client_group_code, "fake worker refuses the group");
  }
  absl::MutexLock lock(&mu_);
  joins_.push_back(*req);
  join_capability_ = PresentedCapability(*ctx);
  return grpc::Status::OK;
}

std::vector<v1::WorkerJoinClientGroupRequest> FakeWorker::client_group_joins() {
  absl::MutexLock lock(&mu_);
  return joins_;
}

std::string FakeWorker::last_join_capability() {
  absl::MutexLock lock(&mu_);
  return join_capability_;
}

}  // namespace dfa::testing
