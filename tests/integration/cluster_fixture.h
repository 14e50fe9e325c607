// Shared helpers of the integration tests: a real coordinator and real workers as processes on
// loopback (client::LocalCluster), a client connected to them, random training inputs, and a
// forward+backward run checked against single-device attention.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

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

}  // namespace dfa::testing
