// A Worker service for coordinator tests: real gRPC on a loopback port, no tensors. It records
// the calls it gets, heartbeats the coordinator on its own thread (re-registering on NOT_FOUND,
// like the real dfa-worker), and its RunJob either returns after `run_time` or, with
// `block_runs`, waits until it is cancelled (Worker.CancelJob or the call's cancellation).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "dfa/v1/coordinator.grpc.pb.h"
#include "dfa/v1/worker.grpc.pb.h"
#include "grpcpp/server.h"

namespace dfa::testing {

struct FakeWorkerOptions {
  std::string id = "w0";
  std::string backend = "cpu";
  int64_t memory_limit_bytes = int64_t{1} << 30;
  double speed = 1.0;
  std::string device_uuid;  // RegisterWorkerRequest.device_uuid (cuda workers)
  absl::Duration run_time = absl::Milliseconds(20);
  bool block_runs = false;
  absl::Duration heartbeat = absl::Milliseconds(50);
  // OpenSessionResponse.transport_address (empty: "addr-<id>").
  std::string transport_address;
  // JoinClientGroup answers this (OK: records the request).
  grpc::StatusCode join_client_group_code = grpc::StatusCode::OK;
};

class FakeWorker final : public v1::Worker::Service {
 public:
  explicit FakeWorker(FakeWorkerOptions options);
  ~FakeWorker() override;

  // Starts the server and registers with the coordinator at `coordinator` (then heartbeats).
  void Start(const std::string& coordinator);
  // Stops heartbeating (the coordinator should drop this worker after one lease).
  void StopHeartbeats();
  void set_block_runs(bool block) { block_runs_ = block; }

  const std::string& address() const { return address_; }
  const std::string& id() const { return options_.id; }
  int opened() const { return opened_; }
  int closed() const { return closed_; }
  int runs_started() const { return runs_started_; }
  int cancels() const { return cancels_; }
  int registrations() const { return registrations_; }
  v1::OpenSessionRequest last_open();

  grpc::Status OpenSession(grpc::ServerContext*, const v1::OpenSessionRequest* req,
                           v1::OpenSessionResponse* resp) override;
  grpc::Status RunJob(grpc::ServerContext* ctx, const v1::RunJobRequest* req,
                      v1::WorkerJobStats* resp) override;
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelWorkerJobRequest* req,
                         v1::CancelWorkerJobResponse*) override;
  grpc::Status CloseSession(grpc::ServerContext*, const v1::CloseSessionRequest* req,
                            v1::CloseSessionResponse*) override;
  // Records the request and the session capability it carried.
  grpc::Status JoinClientGroup(grpc::ServerContext* ctx,
                               const v1::WorkerJoinClientGroupRequest* req,
                               v1::WorkerJoinClientGroupResponse*) override;
  std::vector<v1::WorkerJoinClientGroupRequest> client_group_joins();
  std::string last_join_capability();

 private:
  void Register();
  void HeartbeatLoop();

  const FakeWorkerOptions options_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Coordinator::Stub> coordinator_;
  std::string address_;
  std::thread heartbeats_;
  absl::Notification stop_heartbeats_;
  std::atomic<bool> block_runs_;
  std::atomic<int> opened_{0}, closed_{0}, runs_started_{0}, cancels_{0}, registrations_{0};
  absl::Mutex mu_;
  std::string cancelled_job_ ABSL_GUARDED_BY(mu_);
  bool cancel_all_ ABSL_GUARDED_BY(mu_) = false;
  v1::OpenSessionRequest last_open_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::WorkerJoinClientGroupRequest> joins_ ABSL_GUARDED_BY(mu_);
  std::string join_capability_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dfa::testing
