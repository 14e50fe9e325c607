// WorkerRegistry on its own (no gRPC): renewing, replacing and refusing registrations of an id,
// heartbeats from another process, lease expiry, and a stall of the lease check.
#include "coordinator/worker_registry.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"

namespace dfa {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000000);
constexpr absl::Duration kLease = absl::Milliseconds(900);
constexpr absl::Duration kStallAfter = absl::Milliseconds(300);

v1::RegisterWorkerRequest Worker(const std::string& address, const std::string& boot) {
  v1::RegisterWorkerRequest r;
  r.set_worker_id("w");
  r.set_address(address);
  r.set_backend("cpu");
  r.set_boot_id(boot);
  return r;
}

v1::HeartbeatRequest Beat(const std::string& boot) {
  v1::HeartbeatRequest h;
  h.set_worker_id("w");
  h.set_boot_id(boot);
  return h;
}

TEST(WorkerRegistryTest, SameProcessRenewsAnotherNeedsTheHolderGone) {
  WorkerRegistry reg(kLease, kStallAfter);
  bool replaced = true;
  auto first = reg.Register(Worker("a:1", "boot1"), kT0, 0, &replaced);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(replaced);
  // The same process again: renewed, same incarnation.
  auto again = reg.Register(Worker("a:1", "boot1"), kT0 + absl::Milliseconds(10), 0, &replaced);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *first);
  EXPECT_FALSE(replaced);
  // Another process, another address or boot id, while the lease runs: refused, naming the id.
  for (const auto& r : {Worker("b:2", "boot2"), Worker("a:1", "boot2"), Worker("b:2", "")}) {
    auto refused = reg.Register(r, kT0 + absl::Milliseconds(20), 0, &replaced);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kAlreadyExists);
    EXPECT_TRUE(absl::StrContains(refused.status().message(), "worker_id: w is held"))
        << refused.status();
    EXPECT_EQ(reg.Get("w")->info.boot_id(), "boot1");
  }
  // Naming a stale incarnation does not help.
  EXPECT_FALSE(reg.Register(Worker("b:2", "boot2"), kT0, *first + 7, &replaced).ok());
  // Naming the holder's (the caller found it gone): replaced, new incarnation.
  auto taken = reg.Register(Worker("b:2", "boot2"), kT0 + absl::Milliseconds(30), *first,
                            &replaced);
  ASSERT_TRUE(taken.ok());
  EXPECT_TRUE(replaced);
  EXPECT_GT(*taken, *first);
  EXPECT_EQ(reg.Get("w")->info.address(), "b:2");
}

TEST(WorkerRegistryTest, ExpiredEntryIsReplacedByAnyone) {
  WorkerRegistry reg(kLease, kStallAfter);
  bool replaced = false;
  ASSERT_TRUE(reg.Register(Worker("a:1", "boot1"), kT0, 0, &replaced).ok());
  // The lease check ran recently (no stall) and the lease ran out since: not live any more,
  // although the next check has not removed it yet.
  for (absl::Duration t = absl::Milliseconds(100); t < kLease; t += absl::Milliseconds(100)) {
    EXPECT_TRUE(reg.ExpireLeases(kT0 + t).empty());
  }
  auto late = reg.Register(Worker("b:2", "boot2"), kT0 + kLease + absl::Milliseconds(1), 0,
                           &replaced);
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_TRUE(replaced);
}

TEST(WorkerRegistryTest, HeartbeatOfAnotherProcessIsNotFound) {
  WorkerRegistry reg(kLease, kStallAfter);
  bool replaced = false;
  ASSERT_TRUE(reg.Register(Worker("a:1", "boot1"), kT0, 0, &replaced).ok());
  EXPECT_TRUE(reg.Heartbeat(Beat("boot1"), kT0 + absl::Milliseconds(100)).ok());
  EXPECT_TRUE(reg.Heartbeat(Beat(""), kT0 + absl::Milliseconds(100)).ok());  // no boot id
  absl::Status other = reg.Heartbeat(Beat("boot9"), kT0 + absl::Milliseconds(200));
  EXPECT_EQ(other.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(other.message(), "another process")) << other;
  EXPECT_EQ(reg.Get("w")->last_seen, kT0 + absl::Milliseconds(100));  // not renewed
}

TEST(WorkerRegistryTest, LeaseRunsOutWhenTheCheckRunsOnTime) {
  WorkerRegistry reg(kLease, kStallAfter);
  bool replaced = false;
  ASSERT_TRUE(reg.Register(Worker("a:1", "boot1"), kT0, 0, &replaced).ok());
  absl::Time t = kT0;
  std::vector<std::string> dropped;
  while (dropped.empty() && t < kT0 + absl::Seconds(5)) {
    t += absl::Milliseconds(100);  // the tick
    dropped = reg.ExpireLeases(t);
  }
  ASSERT_EQ(dropped, std::vector<std::string>{"w"});
  EXPECT_EQ(t, kT0 + kLease + absl::Milliseconds(100));
  EXPECT_EQ(reg.stalls(), 0);
}

TEST(WorkerRegistryTest, StallOfTheCheckRestartsLeasesInsteadOfExpiring) {
  WorkerRegistry reg(kLease, kStallAfter);
  bool replaced = false;
  ASSERT_TRUE(reg.Register(Worker("a:1", "boot1"), kT0, 0, &replaced).ok());
  EXPECT_TRUE(reg.ExpireLeases(kT0 + absl::Milliseconds(100)).empty());
  // The coordinator stops for 3 leases: before the next check, the worker still counts live.
  const absl::Time resumed = kT0 + absl::Milliseconds(100) + 3 * kLease;
  EXPECT_TRUE(reg.Live(*reg.Get("w"), resumed));
  EXPECT_TRUE(reg.ExpireLeases(resumed).empty());
  EXPECT_EQ(reg.stalls(), 1);
  EXPECT_EQ(reg.Get("w")->last_seen, resumed);
  // Checks on time again: the worker's heartbeat within its lease keeps it...
  EXPECT_TRUE(reg.ExpireLeases(resumed + absl::Milliseconds(100)).empty());
  EXPECT_TRUE(reg.Heartbeat(Beat("boot1"), resumed + absl::Milliseconds(150)).ok());
  absl::Time t = resumed + absl::Milliseconds(100);
  for (int i = 0; i < 9; ++i) {
    t += absl::Milliseconds(100);
    EXPECT_TRUE(reg.ExpireLeases(t).empty()) << i;
  }
  // ...and without heartbeats its lease runs out as usual.
  t += absl::Milliseconds(100);
  EXPECT_EQ(reg.ExpireLeases(t), std::vector<std::string>{"w"});
}

TEST(WorkerRegistryTest, StallBeforeTheFirstCheckIsAStallToo) {
  WorkerRegistry reg(kLease, kStallAfter);
  bool replaced = false;
  ASSERT_TRUE(reg.Register(Worker("a:1", "boot1"), kT0, 0, &replaced).ok());
  // Stopped right after the registration, before any lease check ran.
  const absl::Time resumed = kT0 + 3 * kLease;
  EXPECT_TRUE(reg.Live(*reg.Get("w"), resumed));
  EXPECT_TRUE(reg.ExpireLeases(resumed).empty());
  EXPECT_EQ(reg.stalls(), 1);
}

}  // namespace
}  // namespace dfa
