// What a session costs a worker besides memory (worker/memory_budget.h), and the admission that
// counts it: threads (the transport's progress thread, the cpu backend's pool) and file
// descriptors (a UCX transport opens about 12, and about 3 more per peer at a job's first
// connect; the session's shared-memory segments one each).
//
// Admit(ranks) is called before a session is built. It refuses with RESOURCE_EXHAUSTED, naming
// the limit, when
//   - the worker already holds max_sessions sessions (--max_sessions), or
//   - the descriptors the open sessions may still need, plus this one's FdsPerSession(ranks),
//     plus a reserve for gRPC connections and the daemon itself, would exceed RLIMIT_NOFILE
//     (re-read at each call), counting both from the descriptors open now and from the
//     daemon's baseline plus every admitted session's estimate.
// So running out of descriptors refuses the new session and leaves the open ones what their
// jobs need. The ticket Admit returns frees the session's share when destroyed (after the
// session's transport, storage and backend: WorkerSession holds it first).
//
// Threads: thread-safe.
#pragma once

#include <memory>
#include <mutex>

#include "core/status.h"

namespace dfa {

struct SessionAdmissionOptions {
  int max_sessions = 256;  // sessions open at once on this worker
  // Descriptors kept free for gRPC connections and the daemon (0: max(64, limit / 8)).
  int fd_reserve = 0;
};

class SessionAdmission {
 public:
  class Ticket {
   public:
    ~Ticket();
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;

   private:
    friend class SessionAdmission;
    Ticket(SessionAdmission* owner, int fds) : owner_(owner), fds_(fds) {}
    SessionAdmission* const owner_;
    const int fds_;
  };

  // Measures the baseline (descriptors open now: call once the daemon's server listens).
  explicit SessionAdmission(SessionAdmissionOptions options);

  absl::StatusOr<std::unique_ptr<Ticket>> Admit(int ranks);

  // The descriptor estimate of a session of `ranks` workers (an upper bound on loopback).
  static int FdsPerSession(int ranks);

  int sessions() const;
  const SessionAdmissionOptions& options() const { return options_; }

 private:
  void Release(int fds);

  const SessionAdmissionOptions options_;
  const int baseline_fds_;
  mutable std::mutex mu_;
  int sessions_ = 0;
  int committed_fds_ = 0;  // sum of FdsPerSession over admitted sessions
};

}  // namespace dfa
