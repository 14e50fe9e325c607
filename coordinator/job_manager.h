// Jobs: a forward or backward pass of one session, driven through
//   QUEUED -> RUNNING -> SUCCEEDED | FAILED | CANCELLED.
//
// A job is queued at submission and starts once none of its workers runs another job (one job
// per worker at a time, first come first served). Running means one RunJob call per worker,
// all in flight at once (gRPC async callbacks, no thread per call). The job reaches its final
// state when every call has returned: SUCCEEDED when all succeeded; otherwise the first error
// decides (a failing worker makes the coordinator cancel the others through Worker.CancelJob,
// and, if they do not return within the control deadline, by cancelling the calls).
// A worker lost mid-job fails the job at once with UNAVAILABLE naming the worker. A submitter
// may ask to be told the final state (Submit's on_final: what SubmitJob with `wait` answers).
//
// Access: the job rpcs take the capability of the job's session (and its client_id), checked as
// SessionManager checks it (CheckSessionAccess). Job ids are random (core/random_id.h) but not
// secrets. RunJob calls carry the session's capability to the workers.
//
// Per session: at most one job queued or running (FAILED_PRECONDITION otherwise), and a
// backward job needs the session's last forward job to have succeeded.
//
// Thread safety: all methods may be called from any thread; gRPC callbacks update state under
// the manager's lock; no call into SessionManager or gRPC is made with the lock held.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/options.h"
#include "coordinator/session_manager.h"
#include "coordinator/worker_stubs.h"
#include "dfa/v1/coordinator.pb.h"
#include "grpcpp/support/status.h"
#include "core/status.h"

namespace dfa {

class JobManager {
 public:
  JobManager(const CoordinatorOptions& options, WorkerStubs* stubs, SessionManager* sessions,
             CoordinatorMetrics* metrics);
  // Shuts down (see Shutdown).
  ~JobManager();

  // Told once, with the job in its final state (SUCCEEDED, FAILED, CANCELLED), from whichever
  // thread finished it, without the manager's lock held (it may call back into the manager).
  using FinalFn = std::function<void(const v1::Job&)>;

  // INVALID_ARGUMENT for an unknown kind; FAILED_PRECONDITION as described above. `on_final`
  // (optional) is called once the job is final — also when it fails, is cancelled or the
  // manager shuts down — never when Submit returns an error. It may run before Submit returns.
  // `inputs_streaming` and `outputs_streaming` (SubmitJobRequest's) are passed to every
  // worker's RunJob.
  absl::StatusOr<v1::Job> Submit(std::shared_ptr<const SessionInfo> session, v1::JobKind kind,
                                 FinalFn on_final = nullptr, bool inputs_streaming = false,
                                 bool outputs_streaming = false);
  // NOT_FOUND (unknown or forgotten job), PERMISSION_DENIED (missing or wrong capability of
  // the job's session, or another client's job).
  absl::StatusOr<v1::Job> Get(const std::string& job_id, const std::string& client_id,
                              const std::string& capability);
  // Waits up to `timeout` for a change after `*version` (0: return at once) and returns the
  // job with *version updated. Returns the same version when nothing changed.
  absl::StatusOr<v1::Job> WaitForChange(const std::string& job_id, const std::string& client_id,
                                        const std::string& capability, uint64_t* version,
                                        absl::Duration timeout);
  // Cancels a queued or running job; a finished job is returned unchanged (idempotent).
  // `reason` (default: cancelled by the client) goes into the job's error message.
  absl::StatusOr<v1::Job> Cancel(const std::string& job_id, const std::string& client_id,
                                 const std::string& capability, absl::string_view reason = "");

  // The session is being released: cancel its jobs and forget its forward state.
  void ReleaseSession(const std::string& session_id);
  // True while a job of the session is queued or running.
  bool SessionBusy(const std::string& session_id);
  // Fails every queued or running job placed on the worker (incarnation below the given one).
  void OnWorkerLost(const std::string& worker_id, uint64_t below_incarnation,
                    absl::string_view reason);
  // Periodic: cancels the calls of jobs whose workers ignore a cancellation.
  void Tick(absl::Time now);
  // Cancels everything and waits until every call has returned. Idempotent.
  void Shutdown();

  int running();
  int queued();

  // Called after every change of a job, with the manager's lock held: it must not call back
  // into the manager (WatchJob's hub only records the id, coordinator/job_watch.h).
  void SetChangeListener(std::function<void(const std::string& job_id)> listener);

 private:
  struct Record;
  struct SessionJobs {
    bool forward_done = false;
    std::string active_job;  // queued or running
  };

  // Moves startable queued jobs to RUNNING and queues them in to_launch_.
  void TakeStartable() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Does, without the lock, what the locked parts queued: launches calls, asks workers to stop,
  // cancels calls, renews sessions. Every public method and callback ends with it.
  void Flush() ABSL_LOCKS_EXCLUDED(mu_);
  void SendWorkerCancels(const std::shared_ptr<Record>& rec) ABSL_LOCKS_EXCLUDED(mu_);
  void OnWorkerDone(const std::shared_ptr<Record>& rec, int rank, const grpc::Status& status);
  // Records the job's failure reason (first one wins); a queued job finishes at once, a running
  // one asks its workers to stop and finishes when their calls return.
  void FailLocked(Record& rec, absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Final state, metrics, bookkeeping; starts what may start now.
  void FinishLocked(Record& rec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<Record>> FindLocked(const std::string& job_id,
                                                     const std::string& client_id,
                                                     const std::string& capability)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A job's state changed: bumps its version and tells the listener.
  void Changed(Record& rec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CoordinatorOptions options_;
  WorkerStubs* const stubs_;
  SessionManager* const sessions_;
  CoordinatorMetrics* const metrics_;

  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Record>> jobs_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> finished_ ABSL_GUARDED_BY(mu_);  // oldest first, for retention
  std::map<std::string, SessionJobs> session_jobs_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> busy_workers_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  int calls_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void(const std::string&)> listener_ ABSL_GUARDED_BY(mu_);
  // Work queued under the lock for Flush().
  std::vector<std::shared_ptr<Record>> to_launch_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Record>> to_stop_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::shared_ptr<Record>, int>> to_try_cancel_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> to_touch_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<FinalFn, v1::Job>> to_tell_ ABSL_GUARDED_BY(mu_);  // on_final calls
};

}  // namespace dfa
