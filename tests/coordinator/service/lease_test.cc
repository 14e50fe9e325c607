// Leases: a worker that stops heartbeating is dropped after one lease, its running job fails
// with UNAVAILABLE naming it, its sessions are lost, and the coordinator keeps serving; a
// worker that re-registers (as after a coordinator restart) is back in the registry.
#include "coordinator_test_util.h"

namespace dfa::testing {
namespace {

using LeaseTest = CoordinatorFixture;

CoordinatorOptions ShortLease() {
  CoordinatorOptions o = TestOptions();
  o.lease = absl::Milliseconds(300);
  return o;
}

TEST_F(LeaseTest, LostWorkerFailsItsRunningJobWithUnavailable) {
  StartCoordinator(ShortLease());
  AddCpuWorkers(2);
  for (auto& w : workers_) w->set_block_runs(true);
  v1::CreateSessionResponse created;
  ASSERT_TRUE(CreateWithSpec(GoodSpec(), &created).ok());
  v1::Job job;
  ASSERT_TRUE(Submit(created.session_id(), v1::JOB_FORWARD, &job).ok());
  ASSERT_TRUE(
      WaitFor([&] { return workers_[0]->runs_started() + workers_[1]->runs_started() == 2; }));

  const absl::Time stopped = absl::Now();
  workers_[1]->StopHeartbeats();
  const v1::Job failed = Watch(job.job_id()).back();
  EXPECT_GE(absl::Now() - stopped, absl::Milliseconds(250));
  EXPECT_EQ(failed.state(), v1::JOB_FAILED);
  EXPECT_EQ(failed.error_code(), static_cast<int>(grpc::StatusCode::UNAVAILABLE));
  EXPECT_NE(failed.error_message().find(workers_[1]->id()), std::string::npos)
      << failed.error_message();
  EXPECT_EQ(LiveWorkers(), 1);
  // The surviving worker was told to stop its part.
  EXPECT_TRUE(WaitFor([&] { return workers_[0]->cancels() == 1; }));

  // The session is lost: new jobs are refused with UNAVAILABLE naming the worker.
  v1::Job again;
  grpc::Status s = Submit(created.session_id(), v1::JOB_FORWARD, &again);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(s.error_message().find(workers_[1]->id()), std::string::npos);

  // The coordinator keeps serving: a new session on the surviving worker runs.
  workers_[0]->set_block_runs(false);
  v1::CreateSessionResponse fresh;
  ASSERT_TRUE(CreateWithSpec(GoodSpec(), &fresh).ok());
  EXPECT_EQ(fresh.shards_size(), 1);
  ASSERT_TRUE(Submit(fresh.session_id(), v1::JOB_FORWARD, &again).ok());
  EXPECT_EQ(Watch(again.job_id()).back().state(), v1::JOB_SUCCEEDED);
}

TEST_F(LeaseTest, WorkerRejoinsAfterItsLeaseRanOut) {
  StartCoordinator(ShortLease());
  FakeWorkerOptions o;
  o.id = "flaky";
  o.heartbeat = absl::Milliseconds(600);  // slower than the lease: dropped, then re-registers
  FakeWorker* w = AddWorker(o);
  EXPECT_EQ(LiveWorkers(), 1);
  ASSERT_TRUE(WaitFor([&] { return LiveWorkers() == 0; }));
  ASSERT_TRUE(WaitFor([&] { return w->registrations() >= 2; }));
  EXPECT_EQ(LiveWorkers(), 1);
}

TEST_F(LeaseTest, ReRegistrationReplacesTheWorkerAndLosesItsSessions) {
  StartCoordinator();
  AddCpuWorkers(1);
  v1::CreateSessionResponse created;
  ASSERT_TRUE(CreateWithSpec(GoodSpec(), &created).ok());
  // The same id registers again (a restarted worker): its sessions are gone.
  v1::RegisterWorkerRequest req;
  req.set_worker_id(workers_[0]->id());
  req.set_address(workers_[0]->address());
  req.set_backend("cpu");
  req.set_memory_limit_bytes(1 << 30);
  v1::RegisterWorkerResponse resp;
  ASSERT_TRUE(stub_->RegisterWorker(Ctx().get(), req, &resp).ok());
  EXPECT_GT(resp.lease_ms(), 0);
  EXPECT_EQ(LiveWorkers(), 1);
  v1::Job job;
  EXPECT_EQ(Submit(created.session_id(), v1::JOB_FORWARD, &job).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace dfa::testing
