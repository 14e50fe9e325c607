// Client groups on a worker: Worker.JoinClientGroup and Worker.ClientGroupTransfer
// (proto/dfa/v1/worker.proto). A client on another host than its session's GPU workers joins
// them as one extra rank of an NCCL communicator brokered by the coordinator
// (coordinator/client_groups.h); this worker is one of ranks 0..size-2, the client rank size-1.
// The communicator is the workers' own NcclTransport (core/gpu/nccl_transport.h), brought up
// in the background by NcclBootstrap (worker/transport/nccl_bootstrap.h), so a client that never
// joins fails the group within its init timeout instead of blocking an rpc.
//
// Checks of a transfer, in order (each error names the field; nothing reaches NCCL before all
// pass):
//   session + capability                   by the caller (SessionRegistry::FindForClient)
//   kind, upload                           INVALID_ARGUMENT
//   rows                                   INVALID_ARGUMENT / OUT_OF_RANGE (one owned range)
//   dtype                                  INVALID_ARGUMENT (the spec's; LSE DTYPE_F32)
//   byte_count                             INVALID_ARGUMENT (vs the session's shape and rows)
//   timeout_ms                             INVALID_ARGUMENT
//   group_id                               NOT_FOUND (unknown or expired)
//   group owner, group secret              PERMISSION_DENIED (another client's group)
//   sequence                               FAILED_PRECONDITION (not the group's next one)
//   the session's backend                  FAILED_PRECONDITION (cpu worker)
//   downloads before their job ran         FAILED_PRECONDITION
// Then the NCCL send/receive with the client rank, bounded by timeout_ms: a client that
// vanishes fails the transfer with UNAVAILABLE / DEADLINE_EXCEEDED naming the client rank, the
// group's communicator is aborted (ncclCommAbort) and the group is forgotten; the worker's
// other sessions and groups are untouched.
//
// Threads: thread-safe. A transfer holds the session's mutex (like DeviceTransfer) and its
// group's, so transfers of one group run one at a time in sequence order.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/session_capability.h"  // kClientGroupSecretMetadata
#include "core/status.h"
#include "dfa/v1/worker.pb.h"
#include "worker/worker_session.h"

namespace dfa {

// Bounds of the requests' timeouts (ms) and their default.
inline constexpr int kMaxClientGroupTimeoutMs = 600000;
inline constexpr int kDefaultClientGroupTimeoutMs = 60000;

// The checks of a transfer that need only the session (kind, upload, rows, dtype, byte_count,
// timeout_ms). `*local_row` gets the first local row of `rows`.
absl::Status ValidateClientGroupTransfer(const WorkerSession& s,
                                         const v1::ClientGroupTransferRequest& req,
                                         int64_t* local_row);

// The checks of WorkerJoinClientGroupRequest that need no session: group_id, rank / size,
// nccl_unique_id, init_timeout_ms, group_secret, expires_unix_ms.
absl::Status ValidateJoinClientGroup(const v1::WorkerJoinClientGroupRequest& req);

class ClientGroups {
 public:
  struct Options {
    int max_groups = 64;  // RESOURCE_EXHAUSTED beyond (after expired ones are dropped)
  };
  ClientGroups() : ClientGroups(Options{}) {}
  explicit ClientGroups(Options options) : options_(options) {}
  ~ClientGroups();

  // The coordinator's call for `s` (found with the coordinator's capability). Validates,
  // records the group and, on a cuda/cudnn worker, starts its communicator in the background.
  // FAILED_PRECONDITION for a cpu worker or a worker built without NCCL; ALREADY_EXISTS for a
  // known group id; INVALID_ARGUMENT naming the field.
  absl::Status Join(const WorkerSession& s, const v1::WorkerJoinClientGroupRequest& req);

  // Records a group without a communicator (Join = its checks of the session, the
  // communicator, then this record): for tests of the group checks without a GPU. Its
  // transfers pass every check up to NCCL and then answer FAILED_PRECONDITION.
  absl::Status Register(const v1::WorkerJoinClientGroupRequest& req);

  // One transfer (checks above). `secret` is what the call presented as
  // kClientGroupSecretMetadata. Returns the bytes moved.
  absl::StatusOr<int64_t> Transfer(WorkerSession* s, const v1::ClientGroupTransferRequest& req,
                                   const std::string& secret);

  // The group `id` after the owner and secret checks (NOT_FOUND / PERMISSION_DENIED), without
  // moving anything: the next sequence number it expects. For tests and diagnostics.
  absl::StatusOr<int64_t> NextSequence(const std::string& id, const std::string& client_id,
                                       const std::string& secret);
  int count();

 private:
  struct Group;
  // NOT_FOUND / PERMISSION_DENIED; drops expired groups first.
  absl::StatusOr<std::shared_ptr<Group>> Find(const std::string& id, const std::string& client_id,
                                              const std::string& secret);
  // Moves expired groups to `*dropped`, which the caller destroys after releasing mu_ (a
  // group's destructor may wait for its bootstrap thread).
  void DropExpiredLocked(absl::Time now, std::vector<std::shared_ptr<Group>>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static std::shared_ptr<Group> NewGroup(const v1::WorkerJoinClientGroupRequest& req);
  // ALREADY_EXISTS for a known id, RESOURCE_EXHAUSTED when full.
  absl::Status CheckRoomLocked(const std::string& id, std::vector<std::shared_ptr<Group>>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forget(const std::string& id);

  const Options options_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Group>> groups_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dfa
