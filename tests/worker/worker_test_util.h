// Test helper: in-process worker daemons on free local ports, with a gRPC stub to each.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "dfa/v1/worker.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "worker/worker_daemon.h"

// EXPECT_RPC_ERROR(grpc_status, grpc::StatusCode::X, "text"): the code, and `text` in the message.
#define EXPECT_RPC_ERROR(status, code, text)                                           \
  do {                                                                                 \
    const grpc::Status s_ = (status);                                                  \
    EXPECT_EQ(s_.error_code(), (code)) << s_.error_message();                          \
    EXPECT_NE(s_.error_message().find(text), std::string::npos) << s_.error_message(); \
  } while (0)

namespace dfa::testing {

// Starts `n` daemons (1 thread, `memory_limit_bytes`, 30 s step timeout) and appends them and
// their stubs to `daemons` / `stubs`. Fails the calling test (ASSERT) when one cannot start.
inline void StartTestWorkers(int n, int64_t memory_limit_bytes,
                             std::vector<std::unique_ptr<WorkerDaemon>>* daemons,
                             std::vector<std::unique_ptr<v1::Worker::Stub>>* stubs) {
  for (int i = 0; i < n; ++i) {
    WorkerOptions o;
    o.threads = 1;
    o.memory_limit_bytes = memory_limit_bytes;
    o.step_timeout = absl::Seconds(30);
    auto d = WorkerDaemon::Start(o);
    ASSERT_TRUE(d.ok()) << d.status();
    stubs->push_back(v1::Worker::NewStub(
        grpc::CreateChannel((*d)->address(), grpc::InsecureChannelCredentials())));
    daemons->push_back(std::move(*d));
  }
}

}  // namespace dfa::testing
