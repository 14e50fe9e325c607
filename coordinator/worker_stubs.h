// gRPC stubs for the coordinator's calls to workers, one channel per worker address, created on
// first use and kept. Thread-safe. Deadlines are set by the callers (every call has one).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dfa/v1/worker.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "core/rpc_security.h"

namespace dfa {

class WorkerStubs {
 public:
  // Channels use `security` (TLS credentials); null: insecure.
  explicit WorkerStubs(std::shared_ptr<const RpcSecurity> security = nullptr)
      : security_(security ? std::move(security) : RpcSecurity::Insecure()) {}

  // Never null; a bad address surfaces as UNAVAILABLE on the first call.
  std::shared_ptr<v1::Worker::Stub> Get(const std::string& address);

 private:
  const std::shared_ptr<const RpcSecurity> security_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<v1::Worker::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
};

// A client context whose deadline is now + timeout.
std::unique_ptr<grpc::ClientContext> ContextWithTimeout(absl::Duration timeout);

}  // namespace dfa
