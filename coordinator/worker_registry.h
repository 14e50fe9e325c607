// The coordinator's view of the worker daemons: who is registered, how to reach them, and
// whether their lease is still valid.
//
// Leases: RegisterWorker starts a lease, Heartbeat renews it. ExpireLeases(now) drops every
// worker whose last renewal is older than one lease and returns it, so the caller can fail the
// jobs and sessions that used it. Heartbeat for an unknown id is NOT_FOUND: the worker registers
// again (that is how workers re-join a restarted coordinator).
//
// Ids: a live entry (lease running) keeps its id. Register renews it for the same process (same
// boot_id and address) and replaces it only when the caller names the incarnation it found gone
// (`replaces`, see WorkerAdmission); anything else is ALREADY_EXISTS. An entry whose lease ran
// out is replaced by any registration.
//
// Stalls: ExpireLeases remembers when it last ran (before its first run: the first
// registration). When more than `stall_after` has passed since
// (the coordinator passes the larger of one heartbeat period, lease/3, and two of its checks),
// the coordinator itself was not running (stopped, swapped out, a paused VM) and the missing
// heartbeats say nothing about the workers: instead of expiring, every lease restarts at `now`,
// and the workers are heard from again within a heartbeat period. Until the check has run, Live
// judges by the same clock: while the last check is older than `stall_after`, every registered
// worker counts as live (ListWorkers, a holder of an id).
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
  uint64_t incarnation = 0;         // increases with every new registration
};

// INVALID_ARGUMENT naming the field for an empty or over-long id, an empty address, an unknown
// backend, a negative memory limit, a negative or non-finite speed, an over-long boot_id, or a
// device_uuid that is over-long, not printable, or set for a cpu worker.
absl::Status ValidateRegistration(const v1::RegisterWorkerRequest& request);

// ALREADY_EXISTS naming the id `holder` keeps and its address.
absl::Status IdHeldError(const RegisteredWorker& holder, absl::Duration lease);

class WorkerRegistry {
 public:
  WorkerRegistry(absl::Duration lease, absl::Duration stall_after)
      : lease_(lease), stall_after_(stall_after) {}

  // Validates (ValidateRegistration), then adds or renews the entry of request.worker_id:
  //   - none, or its lease ran out: a new entry (*replaced when there was one);
  //   - live, same non-empty boot_id and same address: renewed, incarnation kept;
  //   - live with incarnation `replaces` (non-zero): a new entry, *replaced set;
  //   - live otherwise: ALREADY_EXISTS naming the id and the holder's address.
  // Returns the entry's incarnation.
  absl::StatusOr<uint64_t> Register(const v1::RegisterWorkerRequest& request, absl::Time now,
                                    uint64_t replaces, bool* replaced);
  // NOT_FOUND when the id is not registered (expired, or the coordinator restarted), or is
  // registered by another process (the request's non-empty boot_id differs from the entry's).
  absl::Status Heartbeat(const v1::HeartbeatRequest& request, absl::Time now);
  // Removes and returns the ids of workers whose lease ran out at `now`; after a stall (see
  // above) restarts every lease at `now` instead and returns none.
  std::vector<std::string> ExpireLeases(absl::Time now);

  std::optional<RegisteredWorker> Get(const std::string& worker_id) const;
  // True when `w`'s lease has not run out at `now`, or when the lease check has not run for
  // longer than `stall_after` (a stall: the missing heartbeats are the coordinator's own).
  bool Live(const RegisteredWorker& w, absl::Time now) const;
  // Registered workers sorted by id.
  std::vector<RegisteredWorker> Snapshot() const;
  int size() const;
  absl::Duration lease() const { return lease_; }
  // How many stalls ExpireLeases has bridged (for logs and tests).
  int stalls() const;

 private:
  bool LiveLocked(const RegisteredWorker& w, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool StalledLocked(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration lease_;
  const absl::Duration stall_after_;
  mutable absl::Mutex mu_;
  std::map<std::string, RegisteredWorker> workers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_incarnation_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Time last_expiry_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int stalls_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace dfa
