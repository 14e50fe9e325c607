// Session::Run against a real coordinator on loopback and fake workers (tests/coordinator/service):
// RunOptions::wait (one SubmitJob rpc answered with the final job), RunCancel from another
// thread (the waiting call cancelled, the job with it), the watch path as before.
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "client/client.h"
#include "coordinator/coordinator_server.h"
#include "coordinator_test_util.h"
#include "fake_worker.h"
#include "gtest/gtest.h"

namespace dfa::client {
namespace {

using dfa::testing::FakeWorker;
using dfa::testing::FakeWorkerOptions;
using dfa::testing::GoodSpec;
using dfa::testing::TestOptions;

class ClientRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<CoordinatorServer>(TestOptions());
    ASSERT_TRUE(server_->Start().ok());
    for (int i = 0; i < 2; ++i) {
      FakeWorkerOptions w;
      w.id = "cpu" + std::to_string(i);
      w.run_time = absl::Milliseconds(30);
      workers_.push_back(std::make_unique<FakeWorker>(w));
      workers_.back()->Start(server_->address());
    }
    ClientOptions c;
    c.coordinator = server_->address();
    c.rpc_timeout = absl::Seconds(5);
    auto client = Client::Connect(c);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    SessionOptions so;
    so.spec = GoodSpec();
    auto session = client_->CreateSession(so);
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = *std::move(session);
  }
  void TearDown() override {
    session_.reset();
    client_.reset();
    workers_.clear();
    if (server_) server_->Shutdown();
  }
  int Started() { return workers_[0]->runs_started() + workers_[1]->runs_started(); }
  int Cancels() { return workers_[0]->cancels() + workers_[1]->cancels(); }
  int Active() {
    auto st = client_->GetStatus();
    EXPECT_TRUE(st.ok()) << st.status();
    return st.ok() ? st->jobs_running() + st->jobs_queued() : -1;
  }
  template <typename Pred>
  bool WaitFor(Pred pred, absl::Duration timeout = absl::Seconds(5)) {
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      if (pred()) return true;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return pred();
  }
  void BlockRuns(bool block) {
    for (auto& w : workers_) w->set_block_runs(block);
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::vector<std::unique_ptr<FakeWorker>> workers_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<Session> session_;
};

TEST_F(ClientRunTest, WaitingRunReturnsTheFinalJobAndTellsTheObserverOnce) {
  RunOptions wait;
  wait.wait = true;
  std::vector<v1::JobState> seen;
  auto observer = [&](const v1::Job& j) { seen.push_back(j.state()); };
  auto fwd = session_->Run(v1::JOB_FORWARD, observer, wait);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  EXPECT_EQ(fwd->state(), v1::JOB_SUCCEEDED);
  EXPECT_EQ(fwd->workers_size(), 2);
  EXPECT_GE(fwd->wall_seconds(), 0.03);
  EXPECT_EQ(seen, std::vector<v1::JobState>{v1::JOB_SUCCEEDED});
  // The client remembers the job: GetJob by id works.
  auto got = client_->GetJob(fwd->job_id());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->state(), v1::JOB_SUCCEEDED);
  auto bwd = session_->Run(v1::JOB_BACKWARD, nullptr, wait);
  ASSERT_TRUE(bwd.ok()) << bwd.status();
  EXPECT_EQ(bwd->kind(), v1::JOB_BACKWARD);
  // The watch path still sees the job before it is final (queued or running) and at the end.
  seen.clear();
  auto watched = session_->Run(v1::JOB_FORWARD, observer);
  ASSERT_TRUE(watched.ok()) << watched.status();
  ASSERT_GE(seen.size(), 2u);
  EXPECT_LT(seen.front(), v1::JOB_SUCCEEDED);
  EXPECT_EQ(seen.back(), v1::JOB_SUCCEEDED);
  EXPECT_EQ(Started(), 6);
}

TEST_F(ClientRunTest, RunCancelStopsAWaitingRunAndItsJob) {
  BlockRuns(true);
  RunCancel cancel;
  RunOptions wait;
  wait.wait = true;
  wait.cancel = &cancel;
  absl::StatusOr<v1::Job> r;
  std::thread runner([&] { r = session_->Run(v1::JOB_FORWARD, nullptr, wait); });
  ASSERT_TRUE(WaitFor([&] { return Started() == 2; }));
  const absl::Time sent = absl::Now();
  cancel.Cancel();
  runner.join();
  EXPECT_LT(absl::Now() - sent, absl::Seconds(2));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  // The coordinator cancelled the job on the workers.
  EXPECT_TRUE(WaitFor([&] { return Active() == 0; }));
  EXPECT_TRUE(WaitFor([&] { return Cancels() == 2; }));
  // Until Reset, a Run fails at once without submitting.
  BlockRuns(false);
  r = session_->Run(v1::JOB_FORWARD, nullptr, wait);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  EXPECT_EQ(Started(), 2);
  cancel.Reset();
  r = session_->Run(v1::JOB_FORWARD, nullptr, wait);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state(), v1::JOB_SUCCEEDED);
}

TEST_F(ClientRunTest, WaitingRunOfAFailedPreconditionIsTheCoordinatorsError) {
  RunOptions wait;
  wait.wait = true;
  auto r = session_->Run(v1::JOB_BACKWARD, nullptr, wait);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(r.status().message().find("SubmitJob"), std::string::npos) << r.status();
  EXPECT_EQ(Started(), 0);
}

}  // namespace
}  // namespace dfa::client
