// Keeps this worker registered with the coordinator: RegisterWorker at start (retrying while
// the coordinator is unreachable), then Heartbeat every lease/3; a NOT_FOUND heartbeat (the
// coordinator restarted or dropped us) registers again. Runs on its own thread.
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
  // them), so the daemon drops them and frees their memory. `security`: credentials of the
  // channel to the coordinator (null: insecure).
  Registrar(std::string coordinator_address, v1::RegisterWorkerRequest registration,
            std::function<int64_t()> memory_used, std::function<void()> on_forgotten = {},
            std::shared_ptr<const RpcSecurity> security = nullptr);
  ~Registrar();

  void Start();
  void Stop();

  // Registrations that succeeded so far (for tests and logs).
  int registrations() const;

 private:
  void Loop();
  // Sleeps up to `d`; false when stopping.
  bool Sleep(absl::Duration d);
  // Publishes the context of the call about to be made so Stop can cancel it (false: stopping).
  bool BeginCall(grpc::ClientContext* ctx);
  void EndCall();

  const std::string coordinator_;
  const v1::RegisterWorkerRequest registration_;
  std::function<int64_t()> memory_used_;
  std::function<void()> on_forgotten_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  grpc::ClientContext* in_flight_ = nullptr;  // guarded by mu_; the call Loop is making
  int registrations_ = 0;
  std::thread thread_;
};

}  // namespace dfa
