// Recovery: workers rejoin a restarted coordinator within one heartbeat period, a worker
// restarted on its address is usable the moment it has registered, and a coordinator that was
// stopped (SIGSTOP) for longer than a lease keeps its healthy workers and their sessions.
// Real processes on loopback (tests/fault/daemons.h), short leases.
#include <signal.h>

#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/fault/daemons.h"

namespace dfa::testing {
namespace {

constexpr int kLeaseMs = 900;
// Workers heartbeat every lease/3.
constexpr absl::Duration kHeartbeatPeriod = absl::Milliseconds(kLeaseMs / 3);
const std::string kLeaseFlag = absl::StrCat("--lease_ms=", kLeaseMs);

int Alive(const v1::ListWorkersResponse& list) {
  int alive = 0;
  for (const auto& w : list.workers()) alive += w.alive() ? 1 : 0;
  return alive;
}

TEST(RecoveryTest, WorkersRejoinARestartedCoordinatorWithinOneHeartbeatPeriod) {
  auto d = Daemons::Create();
  ASSERT_TRUE(d.ok()) << d.status();
  Daemons& daemons = **d;
  ASSERT_TRUE(daemons.StartCoordinator({kLeaseFlag}).ok());
  constexpr int kWorkers = 3;
  for (int i = 0; i < kWorkers; ++i) ASSERT_TRUE(daemons.StartWorker(i).ok());
  ASSERT_TRUE(daemons.WaitForWorkers(kWorkers, absl::Seconds(20)).ok());

  // An outage of several leases: long enough for the workers' channels to the coordinator to
  // back off between connection attempts (gRPC's default backoff grows 1 s, 1.6 s, 2.6 s...).
  daemons.KillCoordinator();
  absl::SleepFor(absl::Milliseconds(5 * kLeaseMs));
  ASSERT_TRUE(daemons.StartCoordinator({kLeaseFlag}).ok());

  // Measured from the moment the new coordinator's port first accepts a connection (polled
  // every 2 ms by StartCoordinator) to the first ListWorkers (polled every 10 ms) that lists
  // every worker alive. The bound is one heartbeat period plus a tolerance for process
  // scheduling on a loaded 2-core machine and the registration's reachability check.
  absl::Time all_back = absl::InfiniteFuture();
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (absl::Now() < give_up) {
    auto list = daemons.ListWorkers();
    if (list.ok() && Alive(*list) == kWorkers) {
      all_back = absl::Now();
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_NE(all_back, absl::InfiniteFuture()) << "workers did not rejoin in 30 s; logs in "
                                              << daemons.log_dir();
  const absl::Duration rejoin = all_back - daemons.listening_at();
  std::cout << "rejoin after a " << 5 * kLeaseMs << " ms outage: "
            << absl::FormatDuration(rejoin) << " (heartbeat period "
            << absl::FormatDuration(kHeartbeatPeriod) << ")" << std::endl;
  EXPECT_LE(rejoin, kHeartbeatPeriod + absl::Milliseconds(700)) << "logs in " << daemons.log_dir();

  // The rejoined cluster serves: a session on every worker runs a forward job.
  auto c = ConnectClient(daemons);
  ASSERT_NE(c, nullptr);
  auto session = SessionWithForward(c.get(), kWorkers, 11);
  EXPECT_TRUE(session.ok()) << session.status();
}

TEST(RecoveryTest, RestartedWorkerIsUsableAsSoonAsItHasRegistered) {
  auto d = Daemons::Create();
  ASSERT_TRUE(d.ok()) << d.status();
  Daemons& daemons = **d;
  // The default lease (3 s): the killed worker's entry is still live when it comes back.
  ASSERT_TRUE(daemons.StartCoordinator({}).ok());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(daemons.StartWorker(i).ok());
  ASSERT_TRUE(daemons.WaitForWorkers(2, absl::Seconds(20)).ok());
  auto c = ConnectClient(daemons);
  ASSERT_NE(c, nullptr);
  auto before = SessionWithForward(c.get(), 2, 11);
  ASSERT_TRUE(before.ok()) << before.status();

  daemons.KillWorker(1);
  // While it is down, sessions placed on it fail (its lease has not run out): the
  // coordinator's connection attempts to its address are refused and back off.
  const absl::Time down_until = absl::Now() + absl::Milliseconds(1500);
  int refused = 0;
  while (absl::Now() < down_until) {
    client::SessionOptions so;
    so.spec = SmallSpec();
    so.num_workers = 2;
    auto s = c->CreateSession(so);
    if (!s.ok()) {
      ++refused;
      EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable) << s.status();
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_GT(refused, 0);

  // The same worker (id, address) starts again and registers.
  ASSERT_TRUE(daemons.StartWorker(1).ok());
  ASSERT_TRUE(daemons.WaitForWorkerLog(1, "registered with", absl::Seconds(20)))
      << daemons.worker(1)->LogTail(10);
  // Usable at once: the first session placed on it right after its registration works.
  auto after = SessionWithForward(c.get(), 2, 11);
  EXPECT_TRUE(after.ok()) << after.status();
  // The session it held before the restart is gone, and says so with a retryable code.
  auto old_job = (*before)->Run(v1::JOB_FORWARD);
  EXPECT_EQ(old_job.status().code(), absl::StatusCode::kUnavailable) << old_job.status();
}

TEST(RecoveryTest, StalledCoordinatorKeepsHealthyWorkersWhenItResumes) {
  auto d = Daemons::Create();
  ASSERT_TRUE(d.ok()) << d.status();
  Daemons& daemons = **d;
  ASSERT_TRUE(daemons.StartCoordinator({kLeaseFlag}).ok());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(daemons.StartWorker(i).ok());
  ASSERT_TRUE(daemons.WaitForWorkers(2, absl::Seconds(20)).ok());
  auto c = ConnectClient(daemons);
  ASSERT_NE(c, nullptr);
  auto session = SessionWithForward(c.get(), 2, 11);
  ASSERT_TRUE(session.ok()) << session.status();

  // Stopped for well over a lease: when it resumes, every worker's last heartbeat looks older
  // than a lease, although the workers were healthy all along.
  daemons.coordinator()->Signal(SIGSTOP);
  absl::SleepFor(absl::Milliseconds(3 * kLeaseMs));
  daemons.coordinator()->Signal(SIGCONT);

  // For two leases after it resumes, both workers stay listed alive...
  const absl::Time watch_until = absl::Now() + absl::Milliseconds(2 * kLeaseMs);
  while (absl::Now() < watch_until) {
    auto list = daemons.ListWorkers();
    if (list.ok()) {
      ASSERT_EQ(Alive(*list), 2) << "a healthy worker was dropped after the stall; logs in "
                                 << daemons.log_dir();
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  // ...their session survives (its next job runs), and no worker was told to register again.
  auto job = (*session)->Run(v1::JOB_FORWARD);
  EXPECT_TRUE(job.ok()) << job.status();
  for (int i = 0; i < 2; ++i) {
    EXPECT_FALSE(absl::StrContains(daemons.worker(i)->LogTail(50), "does not know us"))
        << daemons.worker(i)->LogTail(10);
  }
}

}  // namespace
}  // namespace dfa::testing
