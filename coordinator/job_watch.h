// Coordinator.WatchJob as gRPC callback reactors: a watch costs a small object, not a thread.
//
// Each WatchJob call becomes a Watch registered under its job id. The JobManager calls
// Notify(job_id) on every change of a job (under its own lock; Notify only records the id);
// the hub's one thread then lets that job's watches send the new state. A watch writes one
// message at a time: changes that arrive while a write is in flight are folded into the next
// (the newest state is sent, as the polling loop did). The stream ends OK after the write of a
// final state (SUCCEEDED, FAILED, CANCELLED), with the JobManager's error when the job is
// unknown or the caller may not see it, CANCELLED when the client goes away, and UNAVAILABLE
// when the coordinator shuts down.
//
// Limits: at most `max_streams` watches at once and `max_streams_per_client` per client_id;
// beyond them a new WatchJob is answered RESOURCE_EXHAUSTED naming the flag
// (--max_watch_streams, --max_watch_streams_per_client), and the open ones are unaffected.
//
// Threads: Notify may be called from any thread, also with the JobManager's lock held (it takes
// only the hub's own short lock). Lock order: the watch registry, then one watch, then the
// JobManager. Shutdown ends every stream and joins the thread; the hub must outlive the gRPC
// server's callbacks (CoordinatorServer shuts the server down before destroying the service).
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "coordinator/job_manager.h"
#include "dfa/v1/coordinator.pb.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/server_callback.h"

namespace dfa {

// Coordinator.SubmitJob as a callback reactor (no thread, no poll). `session` is the call's
// authorization and session lookup (an error finishes the call with it at once). Without
// request.wait the job is answered as queued. With it the answer is the job in its final state,
// written when the JobManager finishes it (its on_final); a call its client cancels (gone, or
// past its deadline) cancels the job, so a waiting submit never leaves a job nobody waits for.
// At most one waiting call per session (a session has one job queued or running at a time).
// `reply` converts the final absl::Status as the service's handlers do.
grpc::ServerUnaryReactor* StartSubmitJob(
    JobManager* jobs, const v1::SubmitJobRequest& request,
    absl::StatusOr<std::shared_ptr<const SessionInfo>> session, std::string capability,
    v1::Job* response, std::function<grpc::Status(const absl::Status&)> reply);

struct WatchLimits {
  int max_streams = 4096;
  int max_streams_per_client = 256;
};

class JobWatchHub {
 public:
  // `reply` converts a watch's final absl::Status into the grpc::Status it finishes with (and
  // counts errors), as the service's other handlers do.
  JobWatchHub(JobManager* jobs, WatchLimits limits,
              std::function<grpc::Status(const absl::Status&)> reply);
  ~JobWatchHub();  // Shutdown()

  // The reactor of one WatchJob call. `admitted` is the call's authorization: not OK finishes
  // the stream with it at once. `capability` is what the call presented.
  grpc::ServerWriteReactor<v1::Job>* Start(const v1::GetJobRequest& request,
                                           const absl::Status& admitted, std::string capability);

  // A job changed (JobManager's change listener).
  void Notify(const std::string& job_id);

  // Ends every open stream with UNAVAILABLE, refuses new ones, stops the thread. Idempotent.
  void Shutdown();

  // Open watches now (tests, metrics).
  int streams() const;

  class Watch;

 private:
  void Loop();
  void Remove(Watch* w);

  JobManager* const jobs_;
  const WatchLimits limits_;
  const std::function<grpc::Status(const absl::Status&)> reply_;

  // The registry of open watches.
  mutable std::mutex mu_;
  std::map<std::string, std::set<Watch*>> by_job_;
  std::map<std::string, int> per_client_;
  int total_ = 0;
  bool shut_down_ = false;

  // Jobs changed since the thread last looked (Notify's only state).
  std::mutex pending_mu_;
  std::condition_variable pending_cv_;
  std::set<std::string> pending_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dfa
