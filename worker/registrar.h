// Keeps this worker registered with the coordinator: RegisterWorker at start, then Heartbeat
// every heartbeat period (lease/3, the lease from the coordinator's answer); a NOT_FOUND
// heartbeat (the coordinator restarted, dropped us, or another process holds our id) registers
// again. Runs on its own thread.
//
// Recovery is bounded by the heartbeat period: calls wait for the channel to connect (gRPC
// wait_for_ready) up to their deadline instead of failing at once, the channel's reconnect
// backoff is capped at half a heartbeat period (and so is each connection attempt), and a
// refused registration is retried after at most a heartbeat period. So a coordinator that comes
// back after any outage hears from every worker within about one heartbeat period.
//
// The registration carries the worker's boot_id (RegisterWorkerRequest.boot_id); heartbeats
// repeat it. `security` gives the channel's TLS credentials and its bearer token: the worker
// token (dfa-worker --worker_token), not the clients' token.
// Threads: Start once; Stop (idempotent) wakes and joins the thread. Deregistering is not part
// of the protocol: the lease simply runs out.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "dfa/v1/coordinator.grpc.pb.h"
#include "core/rpc_security.h"

namespace dfa {

class Registrar {
 public:
  // `memory_used` is called for every heartbeat. `on_forgotten` runs (on the registrar's
  // thread) when the coordinator answers a heartbeat with NOT_FOUND, before registering again:
  // the coordinator then treats this worker's sessions as lost (and a restarted one never knew
  // them), so the daemon drops them and frees their memory. `security`: credentials and token
  // of the channel to the coordinator (null: insecure, no token).
  Registrar(std::string coordinator_address, v1::RegisterWorkerRequest registration,
            std::function<int64_t()> memory_used, std::function<void()> on_forgotten = {},
            std::shared_ptr<const RpcSecurity> security = nullptr);
  ~Registrar();

  void Start();
  void Stop();

  // Registrations that succeeded so far (for tests and logs).
  int registrations() const;
  // Until when this worker counts as registered: the send time of the coordinator's latest
  // successful answer (RegisterWorker or Heartbeat) plus the lease it gave. InfinitePast before
  // the first registration and once the coordinator answers NOT_FOUND. The daemon is ready
  // (/readyz, gRPC health) while now is before it, so a coordinator outage makes the worker
  // not ready within one lease.
  absl::Time registered_until() const;

 private:
  void Loop();
  // Registers once; true when registered (sets *period from the answer).
  bool Register(absl::Duration* period);
  // A channel whose reconnect backoff fits `period` (replaces stub_).
  void Connect(absl::Duration period);
  // Sleeps up to `d`; false when stopping.
  bool Sleep(absl::Duration d);
  // Publishes the context of the call about to be made so Stop can cancel it (false: stopping).
  bool BeginCall(grpc::ClientContext* ctx);
  void EndCall();
  // Logs `what` unless it is what was logged last.
  void Warn(const std::string& what);

  const std::string coordinator_;
  const v1::RegisterWorkerRequest registration_;
  std::function<int64_t()> memory_used_;
  std::function<void()> on_forgotten_;
  const std::shared_ptr<const RpcSecurity> security_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;  // used by the registrar's thread only
  absl::Duration channel_period_ = absl::ZeroDuration();
  std::string last_warning_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  grpc::ClientContext* in_flight_ = nullptr;  // guarded by mu_; the call Loop is making
  int registrations_ = 0;
  absl::Time registered_until_ = absl::InfinitePast();  // guarded by mu_
  std::thread thread_;
};

}  // namespace dfa
