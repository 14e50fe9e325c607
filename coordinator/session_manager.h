// Sessions: creation (validation, placement, plan, admission, OpenSession on every placed
// worker), access by capability, time-to-live, release, and loss of a worker.
//
// Access: each session has a capability, a secret made at creation (core/random_id.h,
// NewCapability) and returned only in the CreateSessionResponse; the coordinator passes it to
// every placed worker in OpenSession and sends it with its RunJob and CloseSession calls. A call
// on the session must present it (and the creating client's client_id, a label kept for logs
// and accounting): PERMISSION_DENIED naming the session otherwise.
//
// A session's placement and plan never change after creation (SessionInfo is immutable and
// shared with the jobs that use it). Memory is reserved per worker from the session's
// creation until its release, so admission (RESOURCE_EXHAUSTED) counts sessions still opening.
// A session whose worker is lost stays known (state lost: jobs are refused with UNAVAILABLE
// naming the worker) until its owner releases it or its time-to-live ends; its memory on the
// surviving workers is freed at once.
//
// Thread safety: all methods may be called concurrently. Calls to workers are made without the
// lock held. Lock order: SessionManager -> WorkerRegistry.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/options.h"
#include "coordinator/worker_registry.h"
#include "coordinator/worker_stubs.h"
#include "dfa/v1/coordinator.pb.h"
#include "core/status.h"

namespace dfa {

struct SessionShard {
  int rank = 0;
  std::string worker_id;
  std::string address;
  std::string host;
  uint64_t incarnation = 0;  // the registration this shard was placed on
  int64_t bytes = 0;         // reserved on this worker
};

// Immutable once the session is open.
struct SessionInfo {
  std::string session_id;
  std::string client_id;
  std::string capability;  // secret; never logged, never in an error message
  v1::AttentionSpec spec;
  v1::Plan plan;
  std::string transport;                         // "ucx" or "nccl"
  std::vector<SessionShard> shards;              // indexed by rank
  std::vector<std::string> transport_addresses;  // indexed by rank
  std::string lease_id;  // the client lease it is recorded under ("" none; not a secret)
};

class SessionManager {
 public:
  SessionManager(const CoordinatorOptions& options, WorkerRegistry* registry, WorkerStubs* stubs);

  absl::StatusOr<v1::CreateSessionResponse> Create(const v1::CreateSessionRequest& request);

  // The session for a job: NOT_FOUND (unknown), PERMISSION_DENIED (missing or wrong
  // capability, or another client_id), UNAVAILABLE (a worker of it was lost). Renews its
  // time-to-live.
  absl::StatusOr<std::shared_ptr<const SessionInfo>> Use(const std::string& session_id,
                                                         const std::string& client_id,
                                                         const std::string& capability);
  // Access only: NOT_FOUND / PERMISSION_DENIED; OK also for a session released earlier
  // (*released_already is then true), with the same capability and client_id.
  absl::Status CheckOwner(const std::string& session_id, const std::string& client_id,
                          const std::string& capability, bool* released_already);
  // Forgets the session and closes it on its workers (best effort, with deadlines). Returns
  // the lease it was recorded under ("" when none, or when the session is unknown).
  std::string Remove(const std::string& session_id);
  // Renews the time-to-live (a job of the session made progress).
  void Touch(const std::string& session_id);
  // Sessions idle for longer than their time-to-live.
  std::vector<std::string> Expired(absl::Time now);
  // Marks the sessions placed on `worker_id` with an incarnation below `below_incarnation`
  // (all of them: UINT64_MAX) lost and frees their memory on the other workers.
  void OnWorkerLost(const std::string& worker_id, uint64_t below_incarnation,
                    absl::string_view reason);

  int count();
  int64_t ReservedBytes(const std::string& worker_id);
  int64_t TotalReservedBytes();

 private:
  struct Entry {
    std::shared_ptr<SessionInfo> info;  // shards filled at placement, addresses when open
    bool open = false;                  // OpenSession done on every worker
    bool lost = false;
    std::string lost_reason;
    absl::Duration ttl;
    absl::Time last_active;
  };

  // Chooses the workers (sorted by free memory) and the backend.
  absl::StatusOr<std::vector<RegisteredWorker>> Place(const v1::CreateSessionRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t ReservedLocked(const std::string& worker_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls OpenSession on every shard; fills info->transport_addresses and, per rank, the bytes
  // the worker says it reserved.
  absl::Status OpenOnWorkers(SessionInfo* info, std::vector<int64_t>* worker_bytes);
  void CloseOnWorkers(const SessionInfo& info, const std::vector<bool>& opened);
  void Tombstone(const SessionInfo& info) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CoordinatorOptions options_;
  WorkerRegistry* const registry_;
  WorkerStubs* const stubs_;

  absl::Mutex mu_;
  std::map<std::string, Entry> sessions_ ABSL_GUARDED_BY(mu_);
  // Released session ids -> who may release them again (a repeated release by the owner is
  // OK), bounded.
  struct Released {
    std::string client_id;
    std::string capability;
  };
  std::map<std::string, Released> released_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> released_order_ ABSL_GUARDED_BY(mu_);
};

// OK when `capability` is the session's and `client_id` its creator's; PERMISSION_DENIED
// naming the session otherwise (the capability is checked first, in constant time).
absl::Status CheckSessionAccess(absl::string_view session_id, const std::string& owner_client_id,
                                const std::string& owner_capability, const std::string& client_id,
                                const std::string& capability);

}  // namespace dfa
