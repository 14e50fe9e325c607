#include "coordinator/job_watch.h"

#include <memory>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dfa {
namespace {

// A WatchJob refused before it starts (limits, authorization, shutdown).
class RefusedWatch final : public grpc::ServerWriteReactor<v1::Job> {
 public:
  explicit RefusedWatch(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

// A SubmitJob call. Without wait it finishes in Start. With wait, once the job is submitted,
// exactly one of these finishes it: the job's on_final (Done) or a failed Submit (Start).
class SubmitCall final : public grpc::ServerUnaryReactor {
 public:
  SubmitCall(JobManager* jobs, v1::Job* response, std::string client_id, std::string capability,
             std::function<grpc::Status(const absl::Status&)> reply)
      : jobs_(jobs),
        response_(response),
        client_id_(std::move(client_id)),
        capability_(std::move(capability)),
        reply_(std::move(reply)) {}

  void Start(const v1::SubmitJobRequest& request,
             absl::StatusOr<std::shared_ptr<const SessionInfo>> session) {
    if (!session.ok()) return Fail(session.status());
    if (!request.wait()) {
      absl::StatusOr<v1::Job> job =
          jobs_->Submit(*std::move(session), request.kind(), nullptr, request.inputs_streaming(),
                        request.outputs_streaming());
      if (!job.ok()) return Fail(job.status());
      *response_ = *std::move(job);
      Finish(reply_(absl::OkStatus()));
      return;
    }
    // on_final may run on another thread before Submit returns (a job that fails at once); the
    // reactor lives until OnDone, which comes only after Finish and after this handler returns.
    absl::StatusOr<v1::Job> job = jobs_->Submit(
        *std::move(session), request.kind(), [this](const v1::Job& j) { Done(j); },
        request.inputs_streaming(), request.outputs_streaming());
    if (!job.ok()) return Fail(job.status());
    bool cancel = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      job_id_ = job->job_id();
      cancel = cancelled_;
    }
    if (cancel) (void)jobs_->Cancel(job->job_id(), client_id_, capability_, kCallEnded);
  }

  void OnCancel() override {
    std::string id;
    {
      std::lock_guard<std::mutex> l(mu_);
      cancelled_ = true;
      if (done_) return;
      id = job_id_;
    }
    // The job's cancellation finishes it, and on_final this call (the job id unknown yet: Start
    // cancels it once Submit returns).
    if (!id.empty()) (void)jobs_->Cancel(id, client_id_, capability_, kCallEnded);
  }
  void OnDone() override { delete this; }

 private:
  void Fail(const absl::Status& why) { Finish(reply_(why)); }
  void Done(const v1::Job& job) {
    {
      std::lock_guard<std::mutex> l(mu_);
      done_ = true;
    }
    *response_ = job;
    Finish(reply_(absl::OkStatus()));
  }

  static constexpr const char* kCallEnded =
      "(its waiting SubmitJob call ended: the client cancelled it, went away or its deadline "
      "passed)";

  JobManager* const jobs_;
  v1::Job* const response_;
  const std::string client_id_, capability_;
  const std::function<grpc::Status(const absl::Status&)> reply_;
  std::mutex mu_;
  std::string job_id_;     // once submitted
  bool cancelled_ = false; // OnCancel came
  bool done_ = false;      // the job is final (Finish called or about to be)
};

}  // namespace

grpc::ServerUnaryReactor* StartSubmitJob(
    JobManager* jobs, const v1::SubmitJobRequest& request,
    absl::StatusOr<std::shared_ptr<const SessionInfo>> session, std::string capability,
    v1::Job* response, std::function<grpc::Status(const absl::Status&)> reply) {
  auto* call =
      new SubmitCall(jobs, response, request.client_id(), std::move(capability), std::move(reply));
  call->Start(request, std::move(session));
  return call;
}

class JobWatchHub::Watch final : public grpc::ServerWriteReactor<v1::Job> {
 public:
  Watch(JobWatchHub* hub, const v1::GetJobRequest& request, std::string capability)
      : hub_(hub),
        job_id_(request.job_id()),
        client_id_(request.client_id()),
        capability_(std::move(capability)) {}

  const std::string& job_id() const { return job_id_; }
  const std::string& client_id() const { return client_id_; }

  // Sends the current state (the handler, once registered) or a newer one (the hub's thread).
  void Poke() {
    std::unique_lock<std::mutex> l(mu_);
    Step(l);
  }
  // Ends the stream with `why` once no write is in flight.
  void Stop(absl::Status why) {
    std::unique_lock<std::mutex> l(mu_);
    if (stop_.ok()) stop_ = std::move(why);
    Step(l);
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> l(mu_);
    writing_ = false;
    if (!ok && stop_.ok()) stop_ = absl::CancelledError("job_id: watcher went away");
    Step(l);
  }
  void OnCancel() override { Stop(absl::CancelledError("job_id: watch cancelled by client")); }
  void OnDone() override {
    hub_->Remove(this);
    delete this;
  }

 private:
  // With mu_ held: the next action. Unlocks before calling into gRPC and never touches the
  // object afterwards (a reaction on another thread may end it at once).
  void Step(std::unique_lock<std::mutex>& l) {
    if (finished_ || writing_) return;
    absl::Status end;
    if (!stop_.ok()) {
      end = stop_;
    } else if (final_sent_) {
      end = absl::OkStatus();
    } else {
      absl::StatusOr<v1::Job> job = hub_->jobs_->WaitForChange(
          job_id_, client_id_, capability_, &version_, absl::ZeroDuration());
      if (!job.ok()) {
        end = job.status();
      } else {
        if (version_ == sent_) return;  // nothing new
        out_ = *std::move(job);
        sent_ = version_;
        final_sent_ = out_.state() >= v1::JOB_SUCCEEDED;
        writing_ = true;
        l.unlock();
        StartWrite(&out_);
        return;
      }
    }
    finished_ = true;
    const grpc::Status status = hub_->reply_(end);
    l.unlock();
    Finish(status);
  }

  JobWatchHub* const hub_;
  const std::string job_id_, client_id_, capability_;
  std::mutex mu_;
  bool writing_ = false;     // a write is with gRPC (out_ must stay as it is)
  bool finished_ = false;    // Finish was called
  bool final_sent_ = false;  // out_ holds a final state
  absl::Status stop_;        // not OK: finish with it
  uint64_t version_ = 0;     // the JobManager's version last read
  uint64_t sent_ = 0;        // the version last written
  v1::Job out_;
};

JobWatchHub::JobWatchHub(JobManager* jobs, WatchLimits limits,
                         std::function<grpc::Status(const absl::Status&)> reply)
    : jobs_(jobs), limits_(limits), reply_(std::move(reply)) {
  thread_ = std::thread([this] { Loop(); });
}

JobWatchHub::~JobWatchHub() { Shutdown(); }

grpc::ServerWriteReactor<v1::Job>* JobWatchHub::Start(const v1::GetJobRequest& request,
                                                       const absl::Status& admitted,
                                                       std::string capability) {
  if (!admitted.ok()) return new RefusedWatch(reply_(admitted));
  Watch* w = nullptr;
  {
    std::lock_guard<std::mutex> l(mu_);
    absl::Status refused;
    if (shut_down_) {
      refused = absl::UnavailableError("the coordinator is shutting down");
    } else if (total_ >= limits_.max_streams) {
      refused = absl::ResourceExhaustedError(absl::StrCat(
          "WatchJob: ", total_, " watch streams are open, the coordinator's limit ",
          "(--max_watch_streams = ", limits_.max_streams, "); poll GetJob or retry later"));
    } else if (per_client_[request.client_id()] >= limits_.max_streams_per_client) {
      refused = absl::ResourceExhaustedError(absl::StrCat(
          "WatchJob: client_id = '", request.client_id().substr(0, 64), "' has ",
          per_client_[request.client_id()], " watch streams open, the limit per client ",
          "(--max_watch_streams_per_client = ", limits_.max_streams_per_client, ")"));
    }
    if (!refused.ok()) {
      if (per_client_[request.client_id()] == 0) per_client_.erase(request.client_id());
      return new RefusedWatch(reply_(refused));
    }
    w = new Watch(this, request, std::move(capability));
    by_job_[w->job_id()].insert(w);
    ++per_client_[w->client_id()];
    ++total_;
  }
  // Registered first, so that no change between here and the first read is missed.
  w->Poke();
  return w;
}

void JobWatchHub::Remove(Watch* w) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = by_job_.find(w->job_id());
  if (it != by_job_.end()) {
    it->second.erase(w);
    if (it->second.empty()) by_job_.erase(it);
  }
  auto c = per_client_.find(w->client_id());
  if (c != per_client_.end() && --c->second <= 0) per_client_.erase(c);
  --total_;
}

void JobWatchHub::Notify(const std::string& job_id) {
  std::lock_guard<std::mutex> l(pending_mu_);
  if (stop_) return;
  pending_.insert(job_id);
  pending_cv_.notify_one();
}

void JobWatchHub::Loop() {
  while (true) {
    std::set<std::string> changed;
    {
      std::unique_lock<std::mutex> l(pending_mu_);
      pending_cv_.wait(l, [this] { return stop_ || !pending_.empty(); });
      if (stop_) return;
      changed.swap(pending_);
    }
    std::lock_guard<std::mutex> l(mu_);
    for (const std::string& id : changed) {
      auto it = by_job_.find(id);
      if (it == by_job_.end()) continue;
      for (Watch* w : it->second) w->Poke();
    }
  }
}

void JobWatchHub::Shutdown() {
  {
    std::lock_guard<std::mutex> l(pending_mu_);
    stop_ = true;
    pending_cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> l(mu_);
  shut_down_ = true;
  for (auto& [id, watches] : by_job_) {
    for (Watch* w : watches) w->Stop(absl::UnavailableError("the coordinator is shutting down"));
  }
}

int JobWatchHub::streams() const {
  std::lock_guard<std::mutex> l(mu_);
  return total_;
}

}  // namespace dfa
