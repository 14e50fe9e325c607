// A coordinator on a loopback port plus fake workers, for the service tests.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/coordinator_server.h"
#include "core/session_capability.h"
#include "dfa/v1/coordinator.grpc.pb.h"
#include "fake_worker.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"

namespace dfa::testing {

inline CoordinatorOptions TestOptions() {
  CoordinatorOptions o;
  o.listen = "127.0.0.1:0";
  o.lease = absl::Seconds(30);  // fake workers heartbeat every 50 ms anyway
  o.tick = absl::Milliseconds(20);
  o.rpc_timeout = absl::Seconds(2);
  o.limits.max_seq_len = 1 << 20;
  return o;
}

// A valid causal bf16 spec (tests mutate one field).
inline v1::AttentionSpec GoodSpec() {
  v1::AttentionSpec s;
  s.set_batch(1);
  s.set_q_heads(8);
  s.set_kv_heads(2);
  s.set_head_dim(64);
  s.set_seq_len(4096);
  s.set_causal(true);
  s.set_dtype(v1::DTYPE_BF16);
  return s;
}

inline std::unique_ptr<grpc::ClientContext> Ctx(absl::Duration timeout = absl::Seconds(10)) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return ctx;
}

class CoordinatorFixture : public ::testing::Test {
 protected:
  void StartCoordinator(const CoordinatorOptions& options = TestOptions()) {
    server_ = std::make_unique<CoordinatorServer>(options);
    ASSERT_TRUE(server_->Start().ok());
    stub_ = v1::Coordinator::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }

  FakeWorker* AddWorker(FakeWorkerOptions options) {
    workers_.push_back(std::make_unique<FakeWorker>(std::move(options)));
    workers_.back()->Start(server_->address());
    return workers_.back().get();
  }

  void AddCpuWorkers(int n, int64_t memory = int64_t{1} << 30) {
    for (int i = 0; i < n; ++i) {
      FakeWorkerOptions o;
      o.id = "cpu" + std::to_string(workers_.size());
      o.memory_limit_bytes = memory;
      AddWorker(o);
    }
  }

  // Remembers each created session's capability: SessionCtx / JobCtx send it.
  grpc::Status Create(const v1::CreateSessionRequest& req, v1::CreateSessionResponse* resp) {
    grpc::Status s = stub_->CreateSession(Ctx().get(), req, resp);
    if (s.ok()) capabilities_[resp->session_id()] = resp->session_capability();
    return s;
  }

  // A context carrying the capability of `session` (none for a session this fixture did not
  // create), or of the session of `job`.
  std::unique_ptr<grpc::ClientContext> SessionCtx(const std::string& session,
                                                  absl::Duration timeout = absl::Seconds(10)) {
    auto ctx = Ctx(timeout);
    AttachCapability(ctx.get(), capabilities_[session]);
    return ctx;
  }
  std::unique_ptr<grpc::ClientContext> JobCtx(const std::string& job,
                                              absl::Duration timeout = absl::Seconds(10)) {
    return SessionCtx(job_sessions_[job], timeout);
  }

  grpc::Status CreateWithSpec(const v1::AttentionSpec& spec, v1::CreateSessionResponse* resp,
                              int num_workers = 0, const std::string& client = "alice") {
    v1::CreateSessionRequest req;
    *req.mutable_spec() = spec;
    req.set_num_workers(num_workers);
    req.set_client_id(client);
    return Create(req, resp);
  }

  grpc::Status Submit(const std::string& session, v1::JobKind kind, v1::Job* job,
                      const std::string& client = "alice") {
    v1::SubmitJobRequest req;
    req.set_session_id(session);
    req.set_kind(kind);
    req.set_client_id(client);
    grpc::Status s = stub_->SubmitJob(SessionCtx(session).get(), req, job);
    if (s.ok()) job_sessions_[job->job_id()] = session;
    return s;
  }

  // Follows WatchJob to the end; returns every state seen.
  std::vector<v1::Job> Watch(const std::string& job_id, const std::string& client = "alice") {
    v1::GetJobRequest req;
    req.set_job_id(job_id);
    req.set_client_id(client);
    auto ctx = JobCtx(job_id, absl::Seconds(20));
    auto reader = stub_->WatchJob(ctx.get(), req);
    std::vector<v1::Job> seen;
    v1::Job job;
    while (reader->Read(&job)) seen.push_back(job);
    EXPECT_TRUE(reader->Finish().ok());
    return seen;
  }

  int LiveWorkers() {
    v1::ListWorkersResponse resp;
    EXPECT_TRUE(stub_->ListWorkers(Ctx().get(), v1::ListWorkersRequest(), &resp).ok());
    return resp.workers_size();
  }

  // Polls `pred` every 10 ms until it holds or `timeout` passes.
  template <typename Pred>
  bool WaitFor(Pred pred, absl::Duration timeout = absl::Seconds(5)) {
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      if (pred()) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return pred();
  }

  void TearDown() override {
    workers_.clear();
    if (server_) server_->Shutdown();
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::vector<std::unique_ptr<FakeWorker>> workers_;
  std::map<std::string, std::string> capabilities_;  // session id -> capability
  std::map<std::string, std::string> job_sessions_;  // job id -> session id
};

}  // namespace dfa::testing
