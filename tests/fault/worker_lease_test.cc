// Fault: a real dfa-worker that stops between jobs is dropped from the registry once its lease
// runs out; its session answers UNAVAILABLE naming it; the coordinator keeps serving (a new
// session on the surviving worker runs a forward job); when the stopped worker resumes, it is
// told NOT_FOUND on its next heartbeat and registers again.
// Real processes on loopback: dfa-coordinator and two dfa-worker daemons (LocalCluster), the
// binaries from this build (DFA_BUILD_DIR, set by CMake).
#include <csignal>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "client/local_cluster.h"
#include "core/session_capability.h"
#include "dfa/v1/coordinator.grpc.pb.h"
#include "dfa/v1/worker.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"

namespace dfa {
namespace {

constexpr int kLeaseMs = 600;

// `capability`: the session's, for calls about it (core/session_capability.h).
std::unique_ptr<grpc::ClientContext> Ctx(const std::string& capability = "") {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  AttachCapability(ctx.get(), capability);
  return ctx;
}

class WorkerLeaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    client::LocalClusterOptions options;
    options.workers = 2;
    options.threads_per_worker = 1;
    options.bin_dir = DFA_BUILD_DIR;
    options.coordinator_args = {"--lease_ms=" + std::to_string(kLeaseMs)};
    auto cluster = client::LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
    coordinator_ = v1::Coordinator::NewStub(
        grpc::CreateChannel(cluster_->coordinator_address(), grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    if (cluster_) {
      EXPECT_TRUE(cluster_->Stop().ok()) << "logs in " << cluster_->log_dir();
    }
  }

  std::vector<std::string> LiveWorkerIds() {
    v1::ListWorkersResponse resp;
    EXPECT_TRUE(coordinator_->ListWorkers(Ctx().get(), v1::ListWorkersRequest(), &resp).ok());
    std::vector<std::string> ids;
    for (const auto& w : resp.workers()) ids.push_back(w.worker_id());
    return ids;
  }

  // Creates a small session on `workers` workers, fills it with seeded inputs on every worker,
  // runs a forward job; returns the session (and the final job state through *state).
  v1::CreateSessionResponse CreateAndRunForward(int workers, v1::JobState* state) {
    v1::CreateSessionRequest req;
    v1::AttentionSpec* spec = req.mutable_spec();
    spec->set_batch(1);
    spec->set_q_heads(2);
    spec->set_kv_heads(1);
    spec->set_head_dim(32);
    spec->set_seq_len(256);
    spec->set_causal(true);
    spec->set_dtype(v1::DTYPE_F32);
    req.set_num_workers(workers);
    req.set_client_id("fault-test");
    v1::CreateSessionResponse session;
    grpc::Status s = coordinator_->CreateSession(Ctx().get(), req, &session);
    EXPECT_TRUE(s.ok()) << s.error_message();
    for (const auto& shard : session.shards()) {
      auto worker = v1::Worker::NewStub(
          grpc::CreateChannel(shard.address(), grpc::InsecureChannelCredentials()));
      v1::GenerateInputsRequest gen;
      gen.set_session_id(session.session_id());
      gen.set_client_id("fault-test");
      gen.set_seed(7);
      v1::GenerateInputsResponse gen_resp;
      s = worker->GenerateInputs(Ctx(session.session_capability()).get(), gen, &gen_resp);
      EXPECT_TRUE(s.ok()) << shard.worker_id() << ": " << s.error_message();
    }
    v1::SubmitJobRequest submit;
    submit.set_session_id(session.session_id());
    submit.set_client_id("fault-test");
    submit.set_kind(v1::JOB_FORWARD);
    v1::Job job;
    s = coordinator_->SubmitJob(Ctx(session.session_capability()).get(), submit, &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    v1::GetJobRequest watch;
    watch.set_job_id(job.job_id());
    watch.set_client_id("fault-test");
    auto ctx = Ctx(session.session_capability());
    auto reader = coordinator_->WatchJob(ctx.get(), watch);
    while (reader->Read(&job)) {
    }
    EXPECT_TRUE(reader->Finish().ok());
    EXPECT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error_message();
    *state = job.state();
    return session;
  }

  std::unique_ptr<client::LocalCluster> cluster_;
  std::unique_ptr<v1::Coordinator::Stub> coordinator_;
};

TEST_F(WorkerLeaseTest, StoppedWorkerIsDroppedAfterItsLeaseAndRejoinsWhenItResumes) {
  ASSERT_EQ(LiveWorkerIds().size(), 2u);
  v1::JobState state;
  const v1::CreateSessionResponse session = CreateAndRunForward(2, &state);
  ASSERT_EQ(state, v1::JOB_SUCCEEDED);

  // Between jobs, worker 1 stops (SIGSTOP: alive to the kernel, silent to the coordinator).
  const std::string lost_id = session.shards(1).worker_id();
  int lost_index = lost_id == "worker-0" ? 0 : 1;
  const absl::Time stopped = absl::Now();
  cluster_->worker_process(lost_index)->Signal(SIGSTOP);
  while (LiveWorkerIds().size() == 2 && absl::Now() - stopped < absl::Seconds(10)) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  const absl::Duration took = absl::Now() - stopped;
  const std::vector<std::string> live = LiveWorkerIds();
  ASSERT_EQ(live.size(), 1u);
  EXPECT_NE(live[0], lost_id);
  // Dropped after one lease (the last heartbeat came at most a heartbeat period before the
  // stop), and not much later than one lease plus the coordinator's check interval.
  EXPECT_GE(took, absl::Milliseconds(kLeaseMs / 2));
  EXPECT_LE(took, absl::Milliseconds(kLeaseMs) + absl::Seconds(2));

  // Its session is lost: a new job answers UNAVAILABLE naming the worker.
  v1::SubmitJobRequest submit;
  submit.set_session_id(session.session_id());
  submit.set_client_id("fault-test");
  submit.set_kind(v1::JOB_FORWARD);
  v1::Job job;
  grpc::Status s = coordinator_->SubmitJob(Ctx(session.session_capability()).get(), submit, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(absl::StrContains(s.error_message(), lost_id)) << s.error_message();

  // The coordinator keeps serving: one worker left, a new session runs on it.
  CreateAndRunForward(1, &state);
  EXPECT_EQ(state, v1::JOB_SUCCEEDED);

  // The worker resumes, hears NOT_FOUND on its next heartbeat and registers again.
  cluster_->worker_process(lost_index)->Signal(SIGCONT);
  const absl::Time resumed = absl::Now();
  while (LiveWorkerIds().size() < 2 && absl::Now() - resumed < absl::Seconds(10)) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(LiveWorkerIds().size(), 2u);
}

}  // namespace
}  // namespace dfa
