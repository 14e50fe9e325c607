// Job lifecycle over a real loopback channel with fake workers: states, watch stream, stats,
// FLOPs, ordering rules, cancellation, release and time-to-live; SubmitJob with wait (the final
// job in one rpc, the call holding its job).
#include <thread>

#include "coordinator_test_util.h"
#include "kernels/attention_backend.h"

namespace dfa::testing {
namespace {

using JobsTest = CoordinatorFixture;

TEST_F(JobsTest, ForwardThenBackwardSucceedWithStatsAndFlops) {
  StartCoordinator();
  AddCpuWorkers(3);
  v1::AttentionSpec spec = GoodSpec();
  spec.set_seq_len(3000);
  v1::CreateSessionResponse created;
  ASSERT_TRUE(CreateWithSpec(spec, &created).ok());
  ASSERT_EQ(created.shards_size(), 3);
  // Every worker got the session with its rank, all peers and the cpu transport.
  for (const auto& w : workers_) {
    v1::OpenSessionRequest open = w->last_open();
    EXPECT_EQ(open.session_id(), created.session_id());
    EXPECT_EQ(open.peers_size(), 3);
    EXPECT_EQ(open.transport(), "ucx");
    EXPECT_EQ(open.plan().workers_size(), 3);
    EXPECT_EQ(created.shards(open.rank()).worker_id(), w->id());
  }
  // The shards partition the sequence.
  int64_t covered = 0;
  for (const auto& shard : created.shards()) {
    for (const auto& r : shard.owned()) covered += r.end() - r.begin();
  }
  EXPECT_EQ(covered, spec.seq_len());

  v1::Job job;
  ASSERT_TRUE(Submit(created.session_id(), v1::JOB_FORWARD, &job).ok());
  EXPECT_TRUE(job.state() == v1::JOB_QUEUED || job.state() == v1::JOB_RUNNING);
  std::vector<v1::Job> seen = Watch(job.job_id());
  ASSERT_FALSE(seen.empty());
  const v1::Job& done = seen.back();
  EXPECT_EQ(done.state(), v1::JOB_SUCCEEDED) << done.error_message();
  EXPECT_EQ(done.steps_done(), done.steps_total());
  EXPECT_GT(done.steps_total(), 0);
  EXPECT_GT(done.wall_seconds(), 0.0);
  EXPECT_DOUBLE_EQ(done.flops(), ForwardFlops(1, 8, 64, 0, 3000, 0, 3000, MaskKind::kCausal));
  ASSERT_EQ(done.workers_size(), 3);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(done.workers(r).rank(), r);
  for (size_t i = 1; i < seen.size(); ++i)
    EXPECT_GE(seen[i].steps_done(), seen[i - 1].steps_done());

  v1::Job bwd;
  ASSERT_TRUE(Submit(created.session_id(), v1::JOB_BACKWARD, &bwd).ok());
  const v1::Job bwd_done = Watch(bwd.job_id()).back();
  EXPECT_EQ(bwd_done.state(), v1::JOB_SUCCEEDED);
  EXPECT_DOUBLE_EQ(bwd_done.flops(), 2.5 * done.flops());
  for (const auto& w : workers_) EXPECT_EQ(w->runs_started(), 2);

  v1::GetJobRequest get;
  get.set_job_id(job.job_id());
  get.set_client_id("mallory");
  v1::Job other;
  EXPECT_EQ(stub_->GetJob(JobCtx(job.job_id()).get(), get, &other).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(JobsTest, CudaSessionsOpenRankZeroFirstAndShareItsNcclId) {
  StartCoordinator();
  for (int i = 0; i < 2; ++i) {
    FakeWorkerOptions o;
    o.id = "gpu" + std::to_string(i);
    o.backend = "cuda";
    AddWorker(o);
  }
  AddCpuWorkers(3);  // GPU workers are preferred; the session does not mix backends
  v1::AttentionSpec spec = GoodSpec();
  spec.set_head_dim(128);
  v1::CreateSessionResponse created;
  ASSERT_TRUE(CreateWithSpec(spec, &created).ok());
  ASSERT_EQ(created.shards_size(), 2);
  const std::string rank0 = created.shards(0).worker_id();
  for (int i = 0; i < 2; ++i) {
    v1::OpenSessionRequest open = workers_[i]->last_open();
    EXPECT_EQ(open.transport(), "nccl");
    // Rank 0 creates the id (and returns it as its transport address); the others get it.
    EXPECT_EQ(open.nccl_unique_id(), open.rank() == 0 ? "" : "addr-" + rank0);
  }
  for (int i = 2; i < 5; ++i) EXPECT_EQ(workers_[i]->opened(), 0);
}

TEST_F(JobsTest, SecondJobWhileOneRunsIsFailedPreconditionAndCancelStopsWorkers) {
  StartCoordinator();
  AddCpuWorkers(2);
  for (auto& w : workers_) w->set_block_runs(true);
  v1::CreateSessionResponse created;
  ASSERT_TRUE(CreateWithSpec(GoodSpec(), &created).ok());
  v1::Job job;
  ASSERT_TRUE(Submit(created.session_id(), v1::JOB_FORWARD, &job).ok());
  ASSERT_TRUE(
      WaitFor([&] { return workers_[0]->runs_started() + workers_[1]->runs_started() == 2; }));
  v1::Job second;
  EXPECT_EQ(Submit(created.session_id(), v1::JOB_FORWARD, &second).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);

  v1::GetJobRequest req;
  req.set_job_id(job.job_id());
  req.set_client_id("alice");
  v1::Job cancelled;
  ASSERT_TRUE(stub_->CancelJob(JobCtx(job.job_id()).get(), req, &cancelled).ok());
  const v1::Job final_state = Watch(job.job_id()).back();
  EXPECT_EQ(final_state.state(), v1::JOB_CANCELLED);
  EXPECT_EQ(final_state.error_code(), static_cast<int>(grpc::StatusCode::CANCELLED));
  EXPECT_EQ(workers_[0]->cancels() + workers_[1]->cancels(), 2);
  // Cancel is idempotent; a cancelled forward does not allow a backward.
  EXPECT_TRUE(stub_->CancelJob(JobCtx(job.job_id()).get(), req, &cancelled).ok());
  EXPECT_EQ(cancelled.state(), v1::JOB_CANCELLED);
  EXPECT_EQ(Submit(created.session_id(), v1::JOB_BACKWARD, &second).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(JobsTest, JobsOfTwoSessionsOnTheSameWorkersQueueAndAllFinish) {
  StartCoordinator();
  AddCpuWorkers(2);
  v1::CreateSessionResponse a, b;
  ASSERT_TRUE(CreateWithSpec(GoodSpec(), &a, 0, "alice").ok());
  ASSERT_TRUE(CreateWithSpec(GoodSpec(), &b, 0, "bob").ok());
  v1::Job ja, jb;
  ASSERT_TRUE(Submit(a.session_id(), v1::JOB_FORWARD, &ja, "alice").ok());
  ASSERT_TRUE(Submit(b.session_id(), v1::JOB_FORWARD, &jb, "bob").ok());
  EXPECT_EQ(jb.state(), v1::JOB_QUEUED);  // one job per worker at a time
  EXPECT_EQ(Watch(ja.job_id(), "alice").back().state(), v1::JOB_SUCCEEDED);
  EXPECT_EQ(Watch(jb.job_id(), "bob").back().state(), v1::JOB_SUCCEEDED);
}

TEST_F(JobsTest, ReleaseCancelsTheRunningJobAndClosesTheSession) {
  StartCoordinator();
  AddCpuWorkers(2);
  for (auto& w : workers_) w->set_block_runs(true);
  v1::CreateSessionResponse created;
  ASSERT_TRUE(CreateWithSpec(GoodSpec(), &created).ok());
  v1::Job job;
  ASSERT_TRUE(Submit(created.session_id(), v1::JOB_FORWARD, &job).ok());
  ASSERT_TRUE(WaitFor([&] { return workers_[0]->runs_started() == 1; }));
  v1::ReleaseSessionRequest rel;
  rel.set_session_id(created.session_id());
  rel.set_client_id("alice");
  v1::ReleaseSessionResponse rel_resp;
  ASSERT_TRUE(stub_->ReleaseSession(SessionCtx(created.session_id()).get(), rel, &rel_resp).ok());
  EXPECT_EQ(Watch(job.job_id()).back().state(), v1::JOB_CANCELLED);
  EXPECT_EQ(workers_[0]->closed() + workers_[1]->closed(), 2);
}

TEST_F(JobsTest, IdleSessionIsReleasedAfterItsTimeToLive) {
  StartCoordinator();
  AddCpuWorkers(2);
  v1::CreateSessionRequest req;
  *req.mutable_spec() = GoodSpec();
  req.set_client_id("alice");
  req.set_ttl_seconds(1);
  v1::CreateSessionResponse created;
  ASSERT_TRUE(Create(req, &created).ok());
  ASSERT_TRUE(WaitFor([&] { return workers_[0]->closed() == 1 && workers_[1]->closed() == 1; },
                      absl::Seconds(4)));
  v1::Job job;
  EXPECT_EQ(Submit(created.session_id(), v1::JOB_FORWARD, &job).error_code(),
            grpc::StatusCode::NOT_FOUND);
  v1::ClusterStatus status;
  ASSERT_TRUE(stub_->GetStatus(Ctx().get(), v1::GetStatusRequest(), &status).ok());
  EXPECT_EQ(status.sessions(), 0);
  EXPECT_EQ(status.memory_used_bytes(), 0);
}

// SubmitJob with wait: one rpc, answered with the final job; the call holds the job.
class WaitingSubmitTest : public CoordinatorFixture {
 protected:
  grpc::Status SubmitWait(const std::string& session, v1::JobKind kind, v1::Job* job,
                          grpc::ClientContext* ctx = nullptr,
                          const std::string& client = "alice") {
    v1::SubmitJobRequest req;
    req.set_session_id(session);
    req.set_kind(kind);
    req.set_client_id(client);
    req.set_wait(true);
    std::unique_ptr<grpc::ClientContext> own;
    if (ctx == nullptr) {
      own = SessionCtx(session);
      ctx = own.get();
    }
    return stub_->SubmitJob(ctx, req, job);
  }
  int JobsRunning() {
    v1::ClusterStatus status;
    EXPECT_TRUE(stub_->GetStatus(Ctx().get(), v1::GetStatusRequest(), &status).ok());
    return status.jobs_running() + status.jobs_queued();
  }
};

TEST_F(WaitingSubmitTest, AnswersWithTheFinalJobOfForwardAndBackward) {
  StartCoordinator();
  AddCpuWorkers(2);
  v1::CreateSessionResponse created;
  ASSERT_TRUE(CreateWithSpec(GoodSpec(), &created).ok());
  v1::Job fwd;
  const absl::Time start = absl::Now();
  ASSERT_TRUE(SubmitWait(created.session_id(), v1::JOB_FORWARD, &fwd).ok());
  // The fake workers take run_time (20 ms) each: the answer waited for them.
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(20));
  EXPECT_EQ(fwd.state(), v1::JOB_SUCCEEDED) << fwd.error_message();
  EXPECT_EQ(fwd.steps_done(), fwd.steps_total());
  EXPECT_GT(fwd.wall_seconds(), 0.0);
  ASSERT_EQ(fwd.workers_size(), 2);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(fwd.workers(r).rank(), r);
  // The same job as GetJob tells it.
  v1::GetJobRequest get;
  get.set_job_id(fwd.job_id());
  get.set_client_id("alice");
  v1::Job got;
  ASSERT_TRUE(stub_->GetJob(SessionCtx(created.session_id()).get(), get, &got).ok());
  EXPECT_EQ(got.state(), v1::JOB_SUCCEEDED);
  EXPECT_DOUBLE_EQ(got.wall_seconds(), fwd.wall_seconds());
  // The forward counts for the backward, which waits as well.
  v1::Job bwd;
  ASSERT_TRUE(SubmitWait(created.session_id(), v1::JOB_BACKWARD, &bwd).ok());
  EXPECT_EQ(bwd.state(), v1::JOB_SUCCEEDED);
  EXPECT_DOUBLE_EQ(bwd.flops(), 2.5 * fwd.flops());
  for (const auto& w : workers_) EXPECT_EQ(w->runs_started(), 2);
  EXPECT_EQ(JobsRunning(), 0);
}

TEST_F(WaitingSubmitTest, RefusalsAreAnsweredAtOnce) {
  StartCoordinator();
  AddCpuWorkers(1);
  v1::CreateSessionResponse created;
  ASSERT_TRUE(CreateWithSpec(GoodSpec(), &created).ok());
  v1::Job job;
  grpc::Status s = SubmitWait(created.session_id(), v1::JOB_BACKWARD, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("kind:"), std::string::npos) << s.error_message();
  s = SubmitWait("no-such-session", v1::JOB_FORWARD, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  // Another client's session, with its capability: refused.
  s = SubmitWait(created.session_id(), v1::JOB_FORWARD, &job, nullptr, "mallory");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_EQ(workers_[0]->runs_started(), 0);
}

TEST_F(WaitingSubmitTest, ReleasedSessionAnswersTheCancelledJob) {
  StartCoordinator();
  AddCpuWorkers(2);
  for (auto& w : workers_) w->set_block_runs(true);
  v1::CreateSessionResponse created;
  ASSERT_TRUE(CreateWithSpec(GoodSpec(), &created).ok());
  v1::Job job;
  grpc::Status s;
  std::thread waiter([&] { s = SubmitWait(created.session_id(), v1::JOB_FORWARD, &job); });
  ASSERT_TRUE(WaitFor([&] { return workers_[0]->runs_started() + workers_[1]->runs_started() == 2; }));
  v1::ReleaseSessionRequest rel;
  rel.set_session_id(created.session_id());
  rel.set_client_id("alice");
  v1::ReleaseSessionResponse rel_resp;
  ASSERT_TRUE(stub_->ReleaseSession(SessionCtx(created.session_id()).get(), rel, &rel_resp).ok());
  waiter.join();
  // The rpc is OK; the job says what happened to it.
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(job.state(), v1::JOB_CANCELLED);
  EXPECT_EQ(job.error_code(), static_cast<int>(grpc::StatusCode::CANCELLED));
  EXPECT_NE(job.error_message().find("released"), std::string::npos) << job.error_message();
}

TEST_F(WaitingSubmitTest, CancellingTheCallCancelsTheJob) {
  StartCoordinator();
  AddCpuWorkers(2);
  for (auto& w : workers_) w->set_block_runs(true);
  v1::CreateSessionResponse created;
  ASSERT_TRUE(CreateWithSpec(GoodSpec(), &created).ok());
  auto ctx = SessionCtx(created.session_id(), absl::Seconds(20));
  v1::Job job;
  grpc::Status s;
  std::thread waiter(
      [&] { s = SubmitWait(created.session_id(), v1::JOB_FORWARD, &job, ctx.get()); });
  ASSERT_TRUE(WaitFor([&] { return workers_[0]->runs_started() + workers_[1]->runs_started() == 2; }));
  ctx->TryCancel();
  waiter.join();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED);
  // The job went with its call: the workers were told to stop, nothing runs.
  EXPECT_TRUE(WaitFor([&] { return JobsRunning() == 0; }));
  EXPECT_TRUE(WaitFor([&] { return workers_[0]->cancels() + workers_[1]->cancels() == 2; }));
  // The session takes the next job.
  for (auto& w : workers_) w->set_block_runs(false);
  ASSERT_TRUE(SubmitWait(created.session_id(), v1::JOB_FORWARD, &job).ok());
  EXPECT_EQ(job.state(), v1::JOB_SUCCEEDED);
}

TEST_F(WaitingSubmitTest, ADeadlinePassingCancelsTheJob) {
  StartCoordinator();
  AddCpuWorkers(1);
  workers_[0]->set_block_runs(true);
  v1::CreateSessionResponse created;
  ASSERT_TRUE(CreateWithSpec(GoodSpec(), &created).ok());
  auto ctx = SessionCtx(created.session_id(), absl::Milliseconds(300));
  v1::Job job;
  EXPECT_EQ(SubmitWait(created.session_id(), v1::JOB_FORWARD, &job, ctx.get()).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(WaitFor([&] { return JobsRunning() == 0; }));
  EXPECT_TRUE(WaitFor([&] { return workers_[0]->cancels() == 1; }));
}

}  // namespace
}  // namespace dfa::testing
