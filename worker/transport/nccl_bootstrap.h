// NcclBootstrap: brings up a session's NcclTransport without blocking the worker's RPCs.
//
// How the service uses it (coordinator/session_manager.cc opens rank 0 first):
//   OpenSession(rank 0, nccl_unique_id empty): Start() makes a new unique id; the worker returns
//     it as OpenSessionResponse.transport_address; the coordinator passes it to the other ranks.
//   OpenSession(rank r > 0, nccl_unique_id set): Start() with that id.
//   Each Start() begins ncclCommInitRank on a background thread at once, so every rank joins
//   while the coordinator is still opening the others; OpenSession returns immediately.
//   RunJob: Get() waits (bounded) for the communicator and hands out the transport.
// A failed bootstrap (a rank never joined) is reported by Get() as DEADLINE_EXCEEDED or
// UNAVAILABLE; the session must then be reopened (a new unique id).
// Thread-safe. Owns the transport; destroy it only when no job uses the transport.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/status.h"
#include "core/transport.h"

namespace dfa {

class NcclTransport;

class NcclBootstrap {
 public:
  // `unique_id` empty: only valid for rank 0, which then creates the id. INVALID_ARGUMENT for
  // bad rank/size/device or an empty id on another rank.
  static absl::StatusOr<std::unique_ptr<NcclBootstrap>> Start(int device, int rank, int size,
                                                             std::string unique_id,
                                                             absl::Duration init_timeout);
  ~NcclBootstrap();

  // The group's id (what rank 0 hands to the coordinator).
  const std::string& unique_id() const { return unique_id_; }
  // The transport once all ranks joined; the bootstrap's error otherwise; DEADLINE_EXCEEDED if
  // it is still joining after `timeout`. The pointer stays valid while this object lives.
  absl::StatusOr<Transport*> Get(absl::Duration timeout);
  // The concrete transport (Drain, status) once Get() succeeded; nullptr before.
  NcclTransport* nccl();

 private:
  NcclBootstrap() = default;
  std::string unique_id_;
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<NcclTransport> transport_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace dfa
