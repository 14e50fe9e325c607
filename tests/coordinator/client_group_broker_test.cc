// ClientGroupBroker (coordinator/client_groups.h): the group it names for a session's workers,
// what every worker is asked, refusals naming the field or the worker, the caps, expiry.
#include "coordinator/client_groups.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "absl/time/clock.h"

namespace dfa {
namespace {

SessionInfo NcclSession(int workers, const std::string& client = "trainer") {
  SessionInfo s;
  s.session_id = "s-1";
  s.client_id = client;
  s.transport = "nccl";
  for (int r = 0; r < workers; ++r) {
    SessionShard sh;
    sh.rank = r;
    sh.worker_id = "w" + std::to_string(r);
    sh.address = "10.0.0." + std::to_string(r) + ":7000";
    sh.host = "gpu-host-" + std::to_string(r);
    s.shards.push_back(sh);
  }
  return s;
}

v1::JoinClientGroupRequest Request() {
  v1::JoinClientGroupRequest r;
  r.set_session_id("s-1");
  r.set_client_id("trainer");
  r.set_nccl_unique_id(std::string(128, '\x07'));
  r.set_init_timeout_ms(2000);
  r.set_client_device(3);
  return r;
}

TEST(ClientGroupBrokerTest, NamesTheGroupAndAsksEveryWorkerInRankOrder) {
  ClientGroupBroker broker;
  std::vector<v1::WorkerJoinClientGroupRequest> asked;
  std::vector<std::string> addresses;
  const absl::Time before = absl::Now();
  auto resp = broker.Join(NcclSession(3), Request(),
                          [&](const SessionShard& s, const v1::WorkerJoinClientGroupRequest& w) {
                            asked.push_back(w);
                            addresses.push_back(s.address);
                            return absl::OkStatus();
                          });
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->client_rank(), 3);
  EXPECT_EQ(resp->size(), 4);
  EXPECT_EQ(resp->init_timeout_ms(), 2000);
  EXPECT_EQ(resp->group_id().rfind("g-", 0), 0u) << resp->group_id();
  EXPECT_GE(resp->group_secret().size(), 43u);
  EXPECT_GT(absl::FromUnixMillis(resp->expires_unix_ms()), before + absl::Minutes(59));
  ASSERT_EQ(resp->workers_size(), 3);
  ASSERT_EQ(asked.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(resp->workers(r).rank(), r);
    EXPECT_EQ(resp->workers(r).worker_id(), "w" + std::to_string(r));
    EXPECT_EQ(asked[r].rank(), r);
    EXPECT_EQ(asked[r].size(), 4);
    EXPECT_EQ(asked[r].group_id(), resp->group_id());
    EXPECT_EQ(asked[r].group_secret(), resp->group_secret());
    EXPECT_EQ(asked[r].nccl_unique_id(), std::string(128, '\x07'));
    EXPECT_EQ(asked[r].client_id(), "trainer");
    EXPECT_EQ(asked[r].session_id(), "s-1");
    EXPECT_EQ(asked[r].init_timeout_ms(), 2000);
    EXPECT_EQ(asked[r].expires_unix_ms(), resp->expires_unix_ms());
    EXPECT_EQ(addresses[r], "10.0.0." + std::to_string(r) + ":7000");
  }
  EXPECT_EQ(broker.count(), 1);
  // A second group: a fresh id and secret.
  auto again = broker.Join(NcclSession(3), Request(),
                           [](const SessionShard&, const v1::WorkerJoinClientGroupRequest&) {
                             return absl::OkStatus();
                           });
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE(again->group_id(), resp->group_id());
  EXPECT_NE(again->group_secret(), resp->group_secret());
}

TEST(ClientGroupBrokerTest, RefusesBadRequestsAndNonNcclSessionsBeforeAskingWorkers) {
  ClientGroupBroker broker;
  int calls = 0;
  auto join = [&](const SessionShard&, const v1::WorkerJoinClientGroupRequest&) {
    ++calls;
    return absl::OkStatus();
  };
  v1::JoinClientGroupRequest r = Request();
  r.set_nccl_unique_id("x");
  auto st = broker.Join(NcclSession(2), r, join).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("nccl_unique_id has 1 bytes"), std::string::npos) << st;
  r = Request();
  r.set_init_timeout_ms(99);
  st = broker.Join(NcclSession(2), r, join).status();
  EXPECT_NE(st.message().find("init_timeout_ms = 99"), std::string::npos) << st;
  r = Request();
  r.set_init_timeout_ms(0);  // the default
  auto ok = broker.Join(NcclSession(1), r, join);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->init_timeout_ms(), 60000);
  calls = 0;
  SessionInfo cpu = NcclSession(2);
  cpu.transport = "ucx";
  st = broker.Join(cpu, Request(), join).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("'ucx', not NCCL"), std::string::npos) << st;
  EXPECT_EQ(calls, 0);
}

TEST(ClientGroupBrokerTest, AWorkersRefusalNamesTheWorkerAndForgetsTheGroup) {
  ClientGroupBroker broker;
  auto resp = broker.Join(NcclSession(3), Request(),
                          [](const SessionShard& s, const v1::WorkerJoinClientGroupRequest&) {
                            return s.rank == 1 ? absl::FailedPreconditionError("cpu backend")
                                               : absl::OkStatus();
                          });
  EXPECT_EQ(resp.status().code(), absl::StatusCode::kFailedPrecondition) << resp.status();
  EXPECT_NE(resp.status().message().find("worker w1 (rank 1, 10.0.0.1:7000) did not join"),
            std::string::npos)
      << resp.status();
  EXPECT_NE(resp.status().message().find("cpu backend"), std::string::npos) << resp.status();
  EXPECT_EQ(broker.count(), 0);
}

TEST(ClientGroupBrokerTest, CapsPerClientAndInAllAndExpiry) {
  ClientGroupOptions o;
  o.max_groups_per_client = 2;
  o.max_groups = 3;
  o.ttl = absl::Milliseconds(300);
  ClientGroupBroker broker(o);
  auto join = [](const SessionShard&, const v1::WorkerJoinClientGroupRequest&) {
    return absl::OkStatus();
  };
  ASSERT_TRUE(broker.Join(NcclSession(1), Request(), join).ok());
  ASSERT_TRUE(broker.Join(NcclSession(1), Request(), join).ok());
  auto st = broker.Join(NcclSession(1), Request(), join).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find("client 'trainer' already holds 2"), std::string::npos) << st;
  ASSERT_TRUE(broker.Join(NcclSession(1, "other"), Request(), join).ok());
  st = broker.Join(NcclSession(1, "third"), Request(), join).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_EQ(broker.count(), 3);
  EXPECT_EQ(broker.count(absl::Now() + absl::Seconds(1)), 0);  // expired
  absl::SleepFor(absl::Milliseconds(400));
  EXPECT_TRUE(broker.Join(NcclSession(1), Request(), join).ok());
}

}  // namespace
}  // namespace dfa
