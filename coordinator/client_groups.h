// Client groups: Coordinator.JoinClientGroup (proto/dfa/v1/coordinator.proto). The broker of
// the NCCL communicator through which a client on another host moves its CUDA tensors to its
// session's GPU workers: ranks 0..N-1 are the session's workers in rank order, rank N the
// client. The client makes the NCCL unique id; the broker checks the request, names the group
// (id, secret, expiry) and asks each worker to join (Worker.JoinClientGroup, which returns at
// once: the workers join in the background, bounded by init_timeout_ms, worker/client_groups.h).
// The client keeps the group for its later sessions on the same workers.
//
// The broker decides and remembers; the calls to workers go through `JoinWorker`, so that the
// logic is tested without daemons (tests/coordinator/client_groups_test.cc) and over real gRPC
// (tests/integration/client_group_test.cc).
// Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/session_manager.h"
#include "core/status.h"
#include "dfa/v1/coordinator.pb.h"
#include "dfa/v1/worker.pb.h"

namespace dfa {

struct ClientGroupOptions {
  absl::Duration ttl = absl::Hours(1);  // a group unused this long is forgotten
  int max_groups = 256;                 // over all clients; RESOURCE_EXHAUSTED beyond
  int max_groups_per_client = 8;        // RESOURCE_EXHAUSTED beyond
};

// The request's own checks: session_id, nccl_unique_id (128 bytes), init_timeout_ms
// ([100, 600000], 0: 60000), client_device (>= 0). INVALID_ARGUMENT naming the field.
absl::Status ValidateJoinClientGroupRequest(const v1::JoinClientGroupRequest& req);

class ClientGroupBroker {
 public:
  // Asks the worker of `shard` to join; its status (the worker's refusal) is returned as is.
  using JoinWorker = std::function<absl::Status(const SessionShard& shard,
                                                const v1::WorkerJoinClientGroupRequest& req)>;

  explicit ClientGroupBroker(ClientGroupOptions options = {}) : options_(options) {}

  // For `session` (whose access the caller checked): validates, then FAILED_PRECONDITION when
  // its workers do not talk NCCL (session.transport != "nccl": cpu workers), RESOURCE_EXHAUSTED
  // beyond the caps; then every worker joins in rank order. A worker's refusal is returned
  // naming the worker (the workers that joined drop the group when their init times out).
  absl::StatusOr<v1::JoinClientGroupResponse> Join(const SessionInfo& session,
                                                   const v1::JoinClientGroupRequest& req,
                                                   const JoinWorker& join);
  // Groups not expired at `now`.
  int count(absl::Time now = absl::Now());

 private:
  struct Record {
    std::string client_id;
    std::vector<std::string> worker_ids;
    absl::Time expires;
  };
  void DropExpiredLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ClientGroupOptions options_;
  absl::Mutex mu_;
  std::map<std::string, Record> groups_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dfa
