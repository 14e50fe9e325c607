// gRPC stubs for the coordinator's calls to workers, one channel per worker address, created on
// first use and kept; a worker's registration installs the fresh, connected channel its check
// used (Install), so that calls to a worker restarted on the same address do not wait out the
// reconnect backoff of the old channel. Thread-safe. Deadlines are set by the callers (every
// call has one).
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
  // A new channel to `address` with the same settings as Get's, not cached.
  std::shared_ptr<grpc::Channel> NewChannel(const std::string& address) const;
  // Makes `channel` the one Get returns stubs of for `address` (calls in flight on the old one
  // finish there).
  void Install(const std::string& address, std::shared_ptr<grpc::Channel> channel);

 private:
  const std::shared_ptr<const RpcSecurity> security_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<v1::Worker::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
};

// A client context whose deadline is now + timeout.
std::unique_ptr<grpc::ClientContext> ContextWithTimeout(absl::Duration timeout);

}  // namespace dfa
