// The client's lease on the coordinator (Coordinator.HoldLease, dfa/v1/coordinator.proto): one
// long-lived stream per Client, opened at the first CreateSession, on which a background thread
// beats at the interval the coordinator asks for. Sessions are created under the lease, so
// that when this process dies (SIGKILL, a crash, the node vanishes) the coordinator releases
// them — and the workers free their memory and shared-memory segments — after its grace
// (dfa-coordinator --client_lease_grace_ms) instead of at their time-to-live.
//
// A broken stream is re-opened with the same lease id and secret (a network blip, a coordinator
// restart), backing off from 100 ms to 2 s (at once when a CreateSession waits); a re-attach the
// coordinator refuses (NOT_FOUND: the lease expired or the coordinator restarted) opens a new
// lease. A coordinator without HoldLease (UNIMPLEMENTED) leaves sessions without a lease: their
// time-to-live alone applies. Destruction closes the lease cleanly (a close beat; the coordinator
// keeps the sessions not yet released to their time-to-live), waiting at most kCloseTimeout.
//
// Thread safety: Get may be called from any thread. Ownership: the stub must outlive the holder.
// fork(): the child's copy never beats, cuts or closes the parent's lease, which the parent
// goes on holding: its Get is FAILED_PRECONDITION without an rpc (the channel's connections
// are the parent's sockets, and gRPC does not run in a fork()ed child: a call there hangs and
// corrupts the parent's streams, losing its lease), its lease_id() is "", Forget and
// destruction do nothing (none of them takes the copy's lock, which the parent's thread may
// have held at the fork).
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "core/status.h"
#include "dfa/v1/coordinator.grpc.pb.h"

namespace dfa::client {

struct LeaseCredentials {
  std::string lease_id;  // empty: no lease (the coordinator does not offer them)
  std::string secret;
};

class LeaseHolder {
 public:
  static constexpr absl::Duration kCloseTimeout = absl::Seconds(2);

  LeaseHolder(v1::Coordinator::Stub* stub, std::string client_id);
  ~LeaseHolder();
  LeaseHolder(const LeaseHolder&) = delete;
  LeaseHolder& operator=(const LeaseHolder&) = delete;

  // The lease to create sessions under: starts the stream on the first call and waits up to
  // `timeout` for the coordinator's answer. Empty credentials when the coordinator has no
  // HoldLease. Errors: the coordinator's refusal (RESOURCE_EXHAUSTED beyond its
  // --max_client_leases, UNAUTHENTICATED, ...), or UNAVAILABLE when no answer came in time.
  absl::StatusOr<LeaseCredentials> Get(absl::Duration timeout);

  // The coordinator does not know `lease_id` (NOT_FOUND on CreateSession): when it is still the
  // one held, drops it and re-opens the stream at once for a new lease (the next Get waits
  // for it).
  void Forget(const std::string& lease_id);
  // The lease's id now ("" before the first answer or without a lease); starts nothing.
  std::string lease_id();

 private:
  void Loop();
  // True in a fork()ed child of the process that created this holder.
  bool Forked() const;
  // One stream: attaches, then beats until it breaks or stop_. Returns how it ended.
  grpc::Status RunStream();
  // Sleeps up to `d` unless stop_ or a caller of Get waits for the lease (retry_now_); true
  // when stopped.
  bool WaitBackoff(absl::Duration d);

  v1::Coordinator::Stub* const stub_;
  const std::string client_id_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false;
  bool stop_ = false;
  bool attached_ = false;
  bool unsupported_ = false;
  bool done_ = false;
  bool retry_now_ = false;
  bool forgot_ = false;  // Forget cut the stream: its end is no failure
  int failures_ = 0;  // attempts that ended before an answer
  absl::Status last_error_;
  LeaseCredentials lease_;
  grpc::ClientContext* stream_ctx_ = nullptr;  // the open stream's, for TryCancel on close
  std::thread thread_;
  const int creator_pid_;  // the process whose holder this is (a fork()ed copy is not)
};

}  // namespace dfa::client
