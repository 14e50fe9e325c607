// Eight worker processes (the largest P of the GPU scale suite, tests/bench/gpu_scale_suite.sh) on loopback CPUs: every
// schedule's forward+backward through the service equals single-device attention, every worker
// takes part in both passes, and every byte sent between workers is received. The other
// integration tests stop at P = 4. Tiny shapes and one cluster for all cases, so the binary runs
// in a few seconds even with 8 processes on 2 cores.
#include <gtest/gtest.h>

#include "tests/integration/cluster_fixture.h"

namespace dfa::testing {
namespace {

constexpr int kWorkers = 8;

void ExpectEveryWorkerTookPart(const v1::Job& job, const char* pass) {
  ASSERT_EQ(job.workers_size(), kWorkers) << pass;
  int64_t sent = 0, received = 0;
  for (const auto& w : job.workers()) {
    EXPECT_GT(w.kernel_launches(), 0) << pass << ": worker " << w.rank() << " ran no kernel";
    EXPECT_GE(w.idle_seconds(), 0) << pass << ": worker " << w.rank();
    sent += w.bytes_sent();
    received += w.bytes_received();
  }
  EXPECT_GT(sent, 0) << pass << ": 8 workers must exchange data";
  EXPECT_EQ(sent, received) << pass << ": bytes sent and received between workers differ";
}

TEST(ScaleTest, EightWorkersEveryScheduleEqualsSingleDeviceAttention) {
  auto cluster = StartClusterOrSkip(kWorkers);
  if (!cluster) GTEST_SKIP() << "dfa-coordinator / dfa-worker not built";
  auto client = client::Client::Connect(cluster->coordinator_address());
  ASSERT_TRUE(client.ok()) << client.status();

  struct Case {
    const char* schedule;
    bool causal;
  };
  // 16 * 8 + 3 tokens: not divisible by P or 2P (the zigzag and striped cuts round), GQA 4:2.
  const int64_t seq = 16 * kWorkers + 3;
  for (const Case& c : {Case{"balanced", true}, Case{"distflash", true}, Case{"ring", true},
                        Case{"zigzag", true}, Case{"balanced", false}}) {
    SCOPED_TRACE(::testing::Message() << c.schedule << (c.causal ? " causal" : " full"));
    const auto spec =
        MakeSpec(/*batch=*/1, seq, /*q_heads=*/4, /*kv_heads=*/2, /*head_dim=*/32, c.causal);
    const TrainingInputs in = RandomInputs(spec, 8000 + (c.causal ? 1 : 2));
    RunResult r = RunTraining(client->get(), spec, kWorkers, c.schedule, in);
    EXPECT_EQ(r.num_workers, kWorkers);
    ASSERT_EQ(r.forward.state(), v1::JOB_SUCCEEDED);
    ASSERT_EQ(r.backward.state(), v1::JOB_SUCCEEDED);
    ExpectEveryWorkerTookPart(r.forward, "forward");
    ExpectEveryWorkerTookPart(r.backward, "backward");
    ExpectMatchesReference(spec, in, r);
  }
  EXPECT_TRUE(cluster->Stop().ok()) << "8 daemons must stop cleanly on SIGTERM";
}

}  // namespace
}  // namespace dfa::testing
