// The coordinator's view of the worker daemons: who is registered, how to reach them, and
// whether their lease is still valid.
//
// Leases: RegisterWorker starts a lease, Heartbeat renews it. ExpireLeases(now) drops every
// worker whose last renewal is older than one lease and returns it, so the caller can fail the
// jobs and sessions that used it. Re-registering an id that is still registered replaces the
// entry (the old one is reported as dropped through `replaced`, since a restarted worker has
// lost its sessions). Heartbeat for an unknown id is NOT_FOUND: the worker registers again
// (that is how workers re-join a restarted coordinator).
//
// Thread safety: every method may be called from any thread. The registry's lock is a leaf:
// no callback runs under it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dfa/v1/coordinator.pb.h"
#include "core/status.h"

namespace dfa {

struct RegisteredWorker {
  v1::RegisterWorkerRequest info;
  absl::Time registered_at;
  absl::Time last_seen;
  int64_t reported_used_bytes = 0;  // from the latest heartbeat
  uint64_t incarnation = 0;         // increases with every (re-)registration
};

class WorkerRegistry {
 public:
  explicit WorkerRegistry(absl::Duration lease) : lease_(lease) {}

  // INVALID_ARGUMENT naming the field for an empty id/address, an unknown backend, a negative
  // memory limit or a negative speed. Returns the new entry's incarnation; sets *replaced when
  // an entry with the same id was registered (everything placed on it is gone).
  absl::StatusOr<uint64_t> Register(const v1::RegisterWorkerRequest& request, absl::Time now,
                                    bool* replaced);
  // NOT_FOUND when the id is not registered (expired, or the coordinator restarted).
  absl::Status Heartbeat(const v1::HeartbeatRequest& request, absl::Time now);
  // Removes and returns the ids of workers whose lease ran out at `now`.
  std::vector<std::string> ExpireLeases(absl::Time now);

  std::optional<RegisteredWorker> Get(const std::string& worker_id) const;
  // Live workers sorted by id.
  std::vector<RegisteredWorker> Snapshot() const;
  int size() const;
  absl::Duration lease() const { return lease_; }

 private:
  const absl::Duration lease_;
  mutable absl::Mutex mu_;
  std::map<std::string, RegisteredWorker> workers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_incarnation_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace dfa
