// Lost workers: a worker that stops between jobs is dropped from the registry once its lease
// runs out, and the client library re-creates its session on the remaining workers and finishes
// the job from the inputs it holds. Short leases (--lease_ms) keep this fast.
#include <signal.h>

#include <gtest/gtest.h>

#include "tests/integration/cluster_fixture.h"

namespace dfa::testing {
namespace {

int AliveWorkers(client::Client* c) {
  auto list = c->ListWorkers();
  if (!list.ok()) return -1;
  int alive = 0;
  for (const auto& w : list->workers()) alive += w.alive() ? 1 : 0;
  return alive;
}

int RegisteredWorkers(client::Client* c) {
  auto status = c->GetStatus();
  return status.ok() ? status->live_workers() : -1;
}

TEST(FaultTest, StoppedWorkerIsDroppedAfterItsLease) {
  auto cluster = StartClusterOrSkip(3, {"--lease_ms=600"});
  if (!cluster) GTEST_SKIP() << "dfa-coordinator / dfa-worker not built";
  auto c = client::Client::Connect(cluster->coordinator_address());
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(AliveWorkers(c->get()), 3);
  // A job first, so the worker stops *between* jobs.
  const auto spec = MakeSpec(1, 96, 2, 2, 16, true);
  const TrainingInputs in = RandomInputs(spec, 3);
  RunTraining(c->get(), spec, 3, "balanced", in);

  cluster->worker_process(2)->Signal(SIGKILL);  // no goodbye: only the lease can tell
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  // ListWorkers stops calling it alive once the lease ran out; the registry drops it on the
  // coordinator's next lease check.
  while ((AliveWorkers(c->get()) != 2 || RegisteredWorkers(c->get()) != 2) &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(AliveWorkers(c->get()), 2) << "worker-2 still listed alive 5 s after a 0.6 s lease";
  EXPECT_EQ(RegisteredWorkers(c->get()), 2) << "worker-2 still registered 5 s after its lease";
  // The coordinator keeps serving: a job on the remaining workers works.
  RunResult r = RunTraining(c->get(), spec, 0, "balanced", in);
  EXPECT_EQ(r.num_workers, 2);
  ExpectMatchesReference(spec, in, r);
}

TEST(FaultTest, LibraryRetriesOnRemainingWorkersAfterWorkerLoss) {
  auto cluster = StartClusterOrSkip(3, {"--lease_ms=600"});
  if (!cluster) GTEST_SKIP() << "dfa-coordinator / dfa-worker not built";
  auto c = client::Client::Connect(cluster->coordinator_address());
  ASSERT_TRUE(c.ok());
  const auto spec = MakeSpec(1, 120, 4, 2, 16, true);
  const TrainingInputs in = RandomInputs(spec, 4);

  client::AttentionJobOptions o;
  o.session.spec = spec;
  o.session.num_workers = 3;
  o.max_retries = 2;
  std::vector<std::string> retry_reasons;
  o.on_retry = [&](const absl::Status& s) { retry_reasons.push_back(s.ToString()); };
  client::AttentionJob job(c->get(), o);
  RunResult r;
  auto fwd = job.Forward(in.q, in.k, in.v, &r.forward);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  r.fwd = std::move(*fwd);
  EXPECT_EQ(job.session()->num_workers(), 3);

  // Lose a worker of the session after the forward: the backward must fail over.
  cluster->worker_process(1)->Signal(SIGKILL);
  auto bwd = job.Backward(in.dout, &r.backward);
  ASSERT_TRUE(bwd.ok()) << bwd.status();
  r.bwd = std::move(*bwd);
  EXPECT_GE(job.retries_done(), 1);
  ASSERT_FALSE(retry_reasons.empty());
  EXPECT_NE(retry_reasons[0].find("UNAVAILABLE"), std::string::npos) << retry_reasons[0];
  EXPECT_EQ(job.session()->num_workers(), 2);
  ExpectMatchesReference(spec, in, r);
}

}  // namespace
}  // namespace dfa::testing
