// Shared helpers of the integration tests: a real coordinator and real workers as processes on
// loopback (client::LocalCluster), a client connected to them, random training inputs, and a
// forward+backward run checked against single-device attention.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/attention_job.h"
#include "client/client.h"
#include "client/local_cluster.h"
#include "client/verify.h"

namespace dfa::testing {

// Starts a cluster of `workers` CPU workers (1 thread each), or skips the test when the daemon
// binaries are not built in this tree. `coordinator_args` e.g. {"--lease_ms=600"}.
std::unique_ptr<client::LocalCluster> StartClusterOrSkip(
    int workers, std::vector<std::string> coordinator_args = {});

v1::AttentionSpec MakeSpec(int batch, int64_t seq, int q_heads, int kv_heads, int head_dim,
                           bool causal, v1::DType dtype = v1::DTYPE_BF16);

struct TrainingInputs {
  client::HostTensor q, k, v, dout;
};
TrainingInputs RandomInputs(const v1::AttentionSpec& spec, uint64_t seed);

struct RunResult {
  v1::Job forward, backward;
  client::ForwardOutputs fwd;
  client::BackwardOutputs bwd;
  int num_workers = 0;
};

// Forward+backward through AttentionJob; ADD_FAILURE()s on any error.
RunResult RunTraining(client::Client* c, const v1::AttentionSpec& spec, int num_workers,
                      const std::string& schedule, const TrainingInputs& in,
                      client::TransferPath path = client::TransferPath::kAuto);

// Compares O, LSE, dQ, dK, dV with the single-device CPU computation (EXPECT per tensor).
void ExpectMatchesReference(const v1::AttentionSpec& spec, const TrainingInputs& in,
                            const RunResult& r);

// A suite whose tests share one cluster of 2 one-thread CPU workers started once for the suite
// with --step_timeout_s=kStepTimeoutS (and --step_tokens=kStepTokens when > 0), each test with a
// client of its own; every test skips when the daemon binaries are not built. Suite: the derived
// fixture (one cluster per suite).
template <typename Suite, int kStepTimeoutS, int kStepTokens = 0>
class TwoWorkerSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    client::LocalClusterOptions o;
    o.workers = 2;
    o.threads_per_worker = 1;
    o.start_timeout = absl::Seconds(20);
    o.worker_args = {absl::StrCat("--step_timeout_s=", kStepTimeoutS)};
    if (kStepTokens > 0) o.worker_args.push_back(absl::StrCat("--step_tokens=", kStepTokens));
    auto c = client::LocalCluster::Start(o);
    if (c.status().code() == absl::StatusCode::kNotFound) return;  // daemons not built
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c).release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    if (cluster_ == nullptr) GTEST_SKIP() << "dfa-coordinator / dfa-worker not built";
    auto c = client::Client::Connect(cluster_->client_options());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }

  // A session of the suite's 2 workers ("": the default schedule).
  std::unique_ptr<client::Session> NewSession(const v1::AttentionSpec& spec,
                                              const std::string& schedule = "") {
    client::SessionOptions o;
    o.spec = spec;
    o.num_workers = 2;
    o.schedule = schedule;
    auto s = client_->CreateSession(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  static inline client::LocalCluster* cluster_ = nullptr;
  std::unique_ptr<client::Client> client_;
};

}  // namespace dfa::testing
