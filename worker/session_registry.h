// The sessions open on one worker: OpenSession's validation and memory admission, lookups with
// access checks for the data plane and the coordinator's calls, CloseSession.
//
// Access: a session opened with a capability (the coordinator always sends one) is reached only
// by calls presenting it (core/session_capability.h; metadata "x-dfa-session-capability",
// compared in constant time) — client calls also with the session's client_id. A missing or
// wrong one is PERMISSION_DENIED naming the session, before the call touches anything. A session
// opened without a capability (test harnesses that open sessions directly) is checked by
// client_id alone.
//
// Threads: all methods are thread-safe. Sessions are handed out as shared_ptr; Close removes a
// session from the registry and its memory is freed (and its bytes released from the budget)
// when the last RPC using it lets go.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "core/planner/worker_memory.h"
#include "dfa/v1/worker.pb.h"
#include "kernels/attention_backend.h"
#include "worker/memory_budget.h"
#include "worker/worker_session.h"

namespace dfa {

// Makes the backend a new session computes with (one per session: a backend is used by one
// thread at a time, and sessions may run jobs concurrently).
using BackendFactory = std::function<absl::StatusOr<std::unique_ptr<AttentionBackend>>()>;

// CancellableBackend::kFlopsPerThreadPiece times the hardware threads.
double DefaultCancelPieceFlops();

class SessionRegistry {
 public:
  // `budget` must outlive the registry. `backend_name` selects the transports offered.
  SessionRegistry(std::string backend_name, int cuda_device, MemoryBudget* budget,
                  BackendFactory make_backend)
      : backend_name_(std::move(backend_name)),
        cuda_device_(cuda_device),
        budget_(budget),
        make_backend_(std::move(make_backend)),
        cancel_piece_flops_(DefaultCancelPieceFlops()) {}
  ~SessionRegistry();

  // Validates the request (INVALID_ARGUMENT naming the field), reserves the session's memory
  // (RESOURCE_EXHAUSTED naming the bytes), allocates storage and the transport.
  // ALREADY_EXISTS when the id is open here.
  absl::StatusOr<v1::OpenSessionResponse> Open(const v1::OpenSessionRequest& request);

  // The session `id` for a client's data-plane call (Upload, Download, GenerateInputs,
  // SharedMemoryTransfer, DeviceTransfer) that presented `capability`: NOT_FOUND for an unknown
  // id, PERMISSION_DENIED for a missing or wrong capability or another client_id.
  absl::StatusOr<std::shared_ptr<WorkerSession>> FindForClient(const std::string& id,
                                                               const std::string& client_id,
                                                               const std::string& capability) const;
  // The session `id` for a coordinator call about it (RunJob, CloseSession): NOT_FOUND,
  // PERMISSION_DENIED for a missing or wrong capability.
  absl::StatusOr<std::shared_ptr<WorkerSession>> FindForCoordinator(
      const std::string& id, const std::string& capability) const;
  // Lookup by id with the client_id check only (check_client) and no capability check: for
  // code that runs after FindForClient / FindForCoordinator admitted the call (JobRunner).
  absl::StatusOr<std::shared_ptr<WorkerSession>> Find(const std::string& id,
                                                      const std::string& client_id,
                                                      bool check_client) const;

  // Removes the session (NOT_FOUND when unknown). Aborts its running job, if any.
  absl::Status Close(const std::string& id);
  // Closes every session (shutdown).
  void CloseAll();

  int count() const;

  // CPU sessions compute through a CancellableBackend whose pieces are worth at most `flops`
  // (<= 0: units are not cut; cancellation then waits for the running step). Set before the
  // registry serves; the default assumes the usable CPUs (core/host_limits.h).
  void set_cancel_piece_flops(double flops) { cancel_piece_flops_ = flops; }
  // Key rows per chunk of a chunked backward (dfa-worker --step_tokens; core/planner/
  // worker_memory.h): sizes the sessions opened from now on and their backward passes.
  void set_step_tokens(int64_t rows) { step_tokens_ = rows; }
  // Counts sessions and their file descriptors before one is built (RESOURCE_EXHAUSTED over
  // its limits; worker/session_admission.h). Null: not counted. Set before the registry serves.
  void set_admission(SessionAdmission* admission) { admission_ = admission; }

 private:
  const std::string backend_name_;
  const int cuda_device_;
  MemoryBudget* budget_;
  BackendFactory make_backend_;
  double cancel_piece_flops_;
  int64_t step_tokens_ = kDefaultStepTokens;
  SessionAdmission* admission_ = nullptr;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<WorkerSession>> sessions_;
};

}  // namespace dfa
