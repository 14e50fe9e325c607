// End to end on real processes: a coordinator and 2-4 CPU workers on loopback; forward and
// backward through the client library (gRPC streams and shared memory) equal single-device
// attention. Shapes are small so that the whole binary runs in seconds.
#include <gtest/gtest.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/integration/cluster_fixture.h"

namespace dfa::testing {
namespace {

struct Case {
  int workers;
  bool causal;
  int q_heads, kv_heads;
  const char* schedule;
  client::TransferPath path;
};

std::string Name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string path = c.path == client::TransferPath::kGrpc ? "grpc" : "shm";
  return absl::StrCat("P", c.workers, "_", c.causal ? "causal" : "full", "_Hq", c.q_heads, "_Hkv",
                      c.kv_heads, "_", c.schedule, "_", path);
}

class ServiceTest : public ::testing::TestWithParam<Case> {};

TEST_P(ServiceTest, ForwardAndBackwardEqualSingleDeviceAttention) {
  const Case& c = GetParam();
  auto cluster = StartClusterOrSkip(c.workers);
  if (!cluster) GTEST_SKIP() << "dfa-coordinator / dfa-worker not built";
  auto client = client::Client::Connect(cluster->coordinator_address());
  ASSERT_TRUE(client.ok());
  // 240 tokens: divisible by 2P for P = 2..4 and by 2..6 (zigzag), yet tiny.
  const auto spec = MakeSpec(/*batch=*/2, /*seq=*/240, c.q_heads, c.kv_heads, /*head_dim=*/32,
                             c.causal);
  const TrainingInputs in = RandomInputs(spec, 42 + c.workers);
  RunResult r = RunTraining(client->get(), spec, c.workers, c.schedule, in, c.path);
  EXPECT_EQ(r.num_workers, c.workers);
  EXPECT_EQ(r.forward.state(), v1::JOB_SUCCEEDED);
  EXPECT_EQ(r.backward.state(), v1::JOB_SUCCEEDED);
  EXPECT_EQ(r.forward.workers_size(), c.workers);
  ExpectMatchesReference(spec, in, r);
  EXPECT_TRUE(cluster->Stop().ok()) << "daemons must stop cleanly on SIGTERM";
}

constexpr auto kGrpc = client::TransferPath::kGrpc;
constexpr auto kShm = client::TransferPath::kSharedMemory;

INSTANTIATE_TEST_SUITE_P(
    Cluster, ServiceTest,
    ::testing::Values(Case{2, true, 4, 4, "balanced", kGrpc}, Case{3, true, 4, 4, "balanced", kShm},
                      Case{4, true, 4, 4, "balanced", kGrpc}, Case{2, false, 4, 4, "balanced", kShm},
                      Case{3, false, 4, 4, "balanced", kGrpc},
                      Case{4, false, 4, 4, "balanced", kShm},
                      Case{4, true, 8, 2, "balanced", kShm},   // GQA
                      Case{3, false, 6, 1, "balanced", kGrpc}, // MQA, odd P
                      Case{4, true, 4, 4, "distflash", kGrpc},
                      Case{4, true, 4, 2, "zigzag", kShm},
                      Case{3, true, 4, 4, "ring", kGrpc}),
    Name);

// Two clients, each with its own session, run their jobs at the same time on one cluster.
TEST(ServiceConcurrencyTest, TwoClientsAtTheSameTime) {
  auto cluster = StartClusterOrSkip(3);
  if (!cluster) GTEST_SKIP() << "dfa-coordinator / dfa-worker not built";
  const auto spec_a = MakeSpec(1, 240, 4, 4, 32, /*causal=*/true);
  const auto spec_b = MakeSpec(2, 120, 4, 2, 16, /*causal=*/false);
  const TrainingInputs in_a = RandomInputs(spec_a, 1), in_b = RandomInputs(spec_b, 2);
  RunResult ra, rb;
  std::thread ta([&] {
    auto c = client::Client::Connect(cluster->coordinator_address());
    ASSERT_TRUE(c.ok());
    ra = RunTraining(c->get(), spec_a, 3, "balanced", in_a);
  });
  std::thread tb([&] {
    auto c = client::Client::Connect(cluster->coordinator_address());
    ASSERT_TRUE(c.ok());
    rb = RunTraining(c->get(), spec_b, 2, "balanced", in_b);
  });
  ta.join();
  tb.join();
  ExpectMatchesReference(spec_a, in_a, ra);
  ExpectMatchesReference(spec_b, in_b, rb);
}

}  // namespace
}  // namespace dfa::testing
