// Client leases: which sessions belong to which live client process, so that a client that dies
// (SIGKILL, a crashed training job, a vanished node) gives its sessions back within seconds
// instead of at their time-to-live (Coordinator.HoldLease in dfa/v1/coordinator.proto).
//
// A lease is an id (names it in logs and in CreateSessionRequest.lease_id) and a secret (256
// random bits, core/random_id.h NewCapability) that whoever holds it presents to re-attach or
// to record a session under the lease; secrets are compared in constant time and never logged.
// A lease is attached to one stream at a time (a re-attach takes it over: the older stream is
// superseded and its end changes nothing). It is lost when its stream ends without a clean
// close or when no beat arrives for `timeout`; a lost lease that nobody re-attaches to within
// `grace` expires: Expire() hands back its sessions for release. A clean close ends the lease
// at once and its sessions keep their time-to-live.
//
// This class is the bookkeeping only: it releases nothing itself and takes the time as an
// argument (tests drive it with a fake clock). Thread safety: every method may be called
// concurrently (one internal mutex, never held while calling out).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/status.h"

namespace dfa {

struct ClientLeaseOptions {
  // Clients are told to beat this often; a lease without a beat for `timeout` is lost.
  absl::Duration beat_interval = absl::Seconds(1);
  absl::Duration timeout = absl::Seconds(5);
  // How long a lost lease waits for a re-attach before its sessions are released.
  absl::Duration grace = absl::Seconds(5);
  // Leases held at once (attached or within their grace), and sessions per lease.
  int max_leases = 4096;
  int max_sessions_per_lease = 1024;
};

// Checks the options (INVALID_ARGUMENT naming the flag).
absl::Status ValidateClientLeaseOptions(const ClientLeaseOptions& options);

class ClientLeases {
 public:
  // `tick`: how often Expire is called; a gap of more than max(beat interval, two ticks)
  // between calls is a stall.
  ClientLeases(ClientLeaseOptions options, absl::Duration tick)
      : options_(options), stall_after_(std::max(options.beat_interval, 2 * tick)) {}

  struct Attachment {
    std::string lease_id;
    std::string secret;   // set only for a new lease
    uint64_t stream = 0;  // this stream's number: Beat and Detach name it
    int sessions = 0;
  };
  // Empty `lease_id` and `secret`: a new lease (RESOURCE_EXHAUSTED beyond max_leases).
  // Otherwise a re-attach: NOT_FOUND for an unknown or expired lease, PERMISSION_DENIED for a
  // wrong secret; the lease is no longer lost and the stream that held it is superseded.
  absl::StatusOr<Attachment> Attach(const std::string& lease_id, const std::string& secret,
                                    const std::string& client_id, absl::Time now);
  // A beat on `stream`: renews the lease (a lost one within its grace is attached again).
  // NOT_FOUND when the lease expired; ABORTED when another stream took it over. Returns the
  // lease's session count.
  absl::StatusOr<int> Beat(const std::string& lease_id, uint64_t stream, absl::Time now);
  // `stream` ended. clean: the lease ends now (its sessions are forgotten here and keep their
  // time-to-live). Otherwise the lease is lost from `now` and its grace begins. Nothing happens
  // when another stream holds the lease.
  void Detach(const std::string& lease_id, uint64_t stream, bool clean, absl::Time now);

  // For CreateSession: OK when `secret` is the lease's and it has room for one more session;
  // NOT_FOUND, PERMISSION_DENIED, RESOURCE_EXHAUSTED (naming lease_id / the flag) otherwise.
  absl::Status CheckCanAdd(const std::string& lease_id, const std::string& secret);
  // Records a created session under the lease (the same checks, again: the lease may have
  // expired meanwhile; the caller then releases the session).
  absl::Status AddSession(const std::string& lease_id, const std::string& secret,
                          const std::string& session_id);
  // The session was released some other way (ReleaseSession, its time-to-live).
  void ForgetSession(const std::string& lease_id, const std::string& session_id);

  struct Expired {
    std::string lease_id;
    std::string client_id;
    std::string why;  // "its stream ended" / "no beat for <timeout>"
    std::vector<std::string> session_ids;
  };
  // Marks leases without a beat for `timeout` lost, and removes the leases lost for longer than
  // `grace`, returning each with the sessions to release. Called every tick: a gap of more than
  // max(beat interval, two ticks) since the last call is a stall of the coordinator itself, and
  // every lease's timeout and grace then restart instead of running out.
  std::vector<Expired> Expire(absl::Time now);
  // Stalls Expire bridged (tests, the log).
  int stalls();

  int count();
  // Sessions recorded under `lease_id` (0 for an unknown lease).
  int sessions(const std::string& lease_id);
  const ClientLeaseOptions& options() const { return options_; }

 private:
  struct Lease {
    std::string secret;
    std::string client_id;
    std::set<std::string> sessions;
    uint64_t stream = 0;  // the stream holding it
    absl::Time last_beat;
    bool lost = false;
    absl::Time lost_at;
    std::string lost_why;
  };
  // The lease, or NOT_FOUND / PERMISSION_DENIED.
  absl::StatusOr<Lease*> Find(const std::string& lease_id, const std::string& secret)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ClientLeaseOptions options_;
  const absl::Duration stall_after_;
  absl::Mutex mu_;
  std::map<std::string, Lease> leases_ ABSL_GUARDED_BY(mu_);
  uint64_t next_stream_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Time last_expire_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int stalls_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace dfa
