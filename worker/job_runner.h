// Runs a session's forward or backward job on this worker (Worker.RunJob) through the
// PlanExecutor, and cancels it (Worker.CancelJob).
//
// Preconditions (FAILED_PRECONDITION naming what is missing): forward needs every owned row of
// Q, K and V written; backward needs a completed forward on the current Q, K, V (the session
// keeps Q, K, V, O and LSE: the forward is never recomputed, Q/K/V never re-sent) and every
// owned row of dO. One job per session at a time.
// Threads: Run blocks its caller until the job ends; Cancel may come from any thread, also
// before the job's RunJob arrived (the id is remembered, and that job ends CANCELLED at once).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "core/trace.h"
#include "dfa/v1/worker.pb.h"
#include "worker/session_registry.h"
#include "worker/worker_metrics.h"

namespace dfa {

class JobRunner {
 public:
  // `sessions` and `metrics` must outlive the runner. `metrics` may be null.
  JobRunner(SessionRegistry* sessions, WorkerMetrics* metrics, absl::Duration step_timeout)
      : sessions_(sessions), metrics_(metrics), step_timeout_(step_timeout) {}
  ~JobRunner();
  JobRunner(const JobRunner&) = delete;
  JobRunner& operator=(const JobRunner&) = delete;

  // `rpc_cancelled` is polled while the job runs; true cancels it (the caller went away).
  absl::StatusOr<v1::WorkerJobStats> Run(const v1::RunJobRequest& request,
                                         const std::function<bool()>& rpc_cancelled);
  // Cancels the job `job_id` (INVALID_ARGUMENT for an empty id). Idempotent.
  absl::Status Cancel(const std::string& job_id);
  // Cancels every running job (shutdown): they, and any later Run, end UNAVAILABLE ("worker is
  // shutting down"), so callers treat this worker as lost and retry elsewhere.
  void CancelAll();
  int running() const;
  // Each plan step's longest wait for its data (--step_timeout_s).
  absl::Duration step_timeout() const { return step_timeout_; }
  // Attaches metrics (before the service is reachable; see worker_daemon.cc).
  void set_metrics(WorkerMetrics* m) { metrics_ = m; }

 private:
  absl::Status Prepare(WorkerSession* s, const v1::RunJobRequest& request);
  // One thread for all running jobs polls their callers (every 20 ms) and cancels the jobs of
  // callers that went away; started with the first job. A job only registers and unregisters
  // (no thread per job: joining one cost a wake-up, ~0.1-0.4 ms, at the end of every job).
  void WatchLoop();

  struct Watched {
    std::shared_ptr<WorkerSession> session;
    const std::function<bool()>* rpc_cancelled;  // valid while the job's Run() runs
  };

  SessionRegistry* sessions_;
  std::atomic<WorkerMetrics*> metrics_;
  const absl::Duration step_timeout_;
  // DFA_TRACE_OPS=1 (core/trace.h): one stderr line per job with its host times.
  const bool trace_jobs_ = TraceOpsEnabled();
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<WorkerSession>> running_;  // job id -> session
  std::set<std::string> cancelled_early_;    // cancelled before they started (bounded)
  std::deque<std::string> cancelled_order_;  // eviction order of cancelled_early_
  bool shutting_down_ = false;
  std::map<std::string, Watched> watched_;  // job id -> caller to poll (under mu_)
  std::condition_variable watch_cv_;
  bool watch_stop_ = false;  // under mu_
  std::thread watcher_;      // started by the first Run (under mu_)
};

}  // namespace dfa
