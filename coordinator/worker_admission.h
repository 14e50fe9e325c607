// The checks between a RegisterWorker request and the registry.
//
//   1. The id. When a live worker holds it and the request is not that same process renewing
//      (same boot_id and address), the holder is asked, at its address and over a fresh
//      channel, whether it still serves its boot_id (the standard gRPC health service, service
//      name WorkerBootHealthService(boot_id), core/rpc_security.h). A holder that answers keeps
//      its id: ALREADY_EXISTS naming it, and nothing of the holder changes. One that does not
//      (its process is gone, or another process now serves that address) is replaced, and what
//      it held is lost. A holder that registered without a boot_id is replaced by a
//      registration at its own address; otherwise it keeps its id while any gRPC server
//      answers at its address.
//   2. The address. The registrant is asked the same at its advertised address for its own
//      boot_id: no answer (refused, unreachable, TLS failure) or an answer from a server that
//      does not serve that boot_id is UNAVAILABLE naming the address, so no session is placed
//      on an address the coordinator cannot reach or that belongs to someone else; the worker
//      retries. A registrant without a boot_id passes when any gRPC server answers. The
//      channel the check used, now connected, becomes the one that sessions on this worker use
//      (WorkerStubs::Install): calls to a worker that restarted on the same address do not wait
//      out the old channel's reconnect backoff.
// Each check waits at most `check_timeout`. A renewal (the same process registering again)
// skips both.
//
// Thread safety: Admit may be called from any number of threads; the registry serializes the
// final decision (a holder that changed between check and decision is re-examined by the
// worker's retry, never overwritten).
#pragma once

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "coordinator/worker_registry.h"
#include "coordinator/worker_stubs.h"
#include "core/status.h"
#include "dfa/v1/coordinator.pb.h"
#include "grpcpp/channel.h"

namespace dfa {

// What a server's standard health service says about one service name.
enum class HealthAnswer {
  kServing,     // SERVING
  kOther,       // answered: not serving, unknown name, or no health service
  kNoAnswer,    // nothing answered in time (refused, unreachable, TLS failure, deadline)
};
struct HealthCheck {
  HealthAnswer answer = HealthAnswer::kNoAnswer;
  std::string detail;  // the gRPC status or serving status, for messages
};

// grpc.health.v1.Health/Check of `service` ("" for the whole server) on `channel`, fail-fast
// (the first connection attempt decides), within `timeout`.
HealthCheck CheckHealth(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                        absl::Duration timeout);

struct Admission {
  uint64_t incarnation = 0;
  bool replaced = false;  // an entry of the same id was replaced: what it held is lost
};

class WorkerAdmission {
 public:
  WorkerAdmission(WorkerRegistry* registry, WorkerStubs* stubs, absl::Duration check_timeout)
      : registry_(registry), stubs_(stubs), check_timeout_(check_timeout) {}

  // INVALID_ARGUMENT (ValidateRegistration), ALREADY_EXISTS or UNAVAILABLE as above.
  absl::StatusOr<Admission> Admit(const v1::RegisterWorkerRequest& request);

 private:
  // True when `holder` still answers at its address (see 1. above) for a request from
  // `request`.
  bool HolderAnswers(const RegisteredWorker& holder, const v1::RegisterWorkerRequest& request);

  WorkerRegistry* const registry_;
  WorkerStubs* const stubs_;
  const absl::Duration check_timeout_;
};

}  // namespace dfa
