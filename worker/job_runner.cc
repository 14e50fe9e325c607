#include "worker/job_runner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/executor/plan_executor.h"
#include "worker/session_input_gate.h"
#include "worker/session_output_gate.h"

namespace dfa {
namespace {

constexpr size_t kMaxRememberedCancels = 1024;

absl::Status CheckCovered(const RowCoverage& c, const char* tensor, const char* job) {
  if (c.complete()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(job, " needs all of ", tensor, " on this worker: ", c.count(), " of ",
                   c.total(), " (batch, row) pairs have been uploaded or generated"));
}

}  // namespace

absl::Status JobRunner::Prepare(WorkerSession* s, const v1::RunJobRequest& req) {
  std::lock_guard<std::mutex> l(s->mu);
  if (s->job_running) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session_id = '", s->id, "' already runs job '", s->running_job_id, "'"));
  }
  // A streaming job's inputs are still arriving: its executor waits for the rows each unit and
  // send reads (SessionInputGate) instead of the checks of complete inputs here.
  if (req.kind() == v1::JOB_FORWARD && !req.inputs_streaming()) {
    if (s->inputs_consumed &&
        !(s->q_rows.complete() && s->k_rows.complete() && s->v_rows.complete())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "a forward job needs TENSOR_Q, TENSOR_K and TENSOR_V on this worker: inputs were "
          "overwritten by gradients; upload q/k/v again (the backward of session '", s->id,
          "' left dQ, dK, dV in their memory)"));
    }
    RETURN_IF_ERROR(CheckCovered(s->q_rows, "TENSOR_Q", "a forward job"));
    RETURN_IF_ERROR(CheckCovered(s->k_rows, "TENSOR_K", "a forward job"));
    RETURN_IF_ERROR(CheckCovered(s->v_rows, "TENSOR_V", "a forward job"));
  }
  if (req.kind() == v1::JOB_BACKWARD) {
    if (!s->forward_done && s->inputs_consumed) {
      return absl::FailedPreconditionError(absl::StrCat(
          "kind = JOB_BACKWARD: the last backward of session '", s->id,
          "' consumed the forward's state (its gradients took the memory of Q, K, V and O); "
          "upload q/k/v again and run the forward"));
    }
    if (!s->forward_done) {
      return absl::FailedPreconditionError(absl::StrCat(
          "kind = JOB_BACKWARD before a forward job completed on session '", s->id,
          "' (the backward uses the forward's saved O and LSE)"));
    }
    if (!req.inputs_streaming()) {
      RETURN_IF_ERROR(CheckCovered(s->dout_rows, "TENSOR_DO", "a backward job"));
    }
  }
  s->job_running = true;
  s->running_job_id = req.job_id();
  s->running_kind = req.kind();
  s->inputs_streaming = req.inputs_streaming();
  s->cancel = false;
  BeginJobOutputs(s, req.job_id(), req.kind());
  return absl::OkStatus();
}

absl::StatusOr<v1::WorkerJobStats> JobRunner::Run(const v1::RunJobRequest& req,
                                                  const std::function<bool()>& rpc_cancelled) {
  const absl::Time rpc_start = absl::Now();
  if (req.session_id().empty()) return absl::InvalidArgumentError("session_id is empty");
  if (req.job_id().empty()) return absl::InvalidArgumentError("job_id is empty");
  if (req.kind() != v1::JOB_FORWARD && req.kind() != v1::JOB_BACKWARD) {
    return absl::InvalidArgumentError(
        absl::StrCat("kind = ", static_cast<int>(req.kind()), " is not JOB_FORWARD or JOB_BACKWARD"));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<WorkerSession> s,
                   sessions_->Find(req.session_id(), "", /*check_client=*/false));
  // A job refused before it runs still ends for the downloads that await its outputs.
  auto refused = [&](absl::Status st) {
    std::lock_guard<std::mutex> l(s->mu);
    EndJobOutputs(s.get(), req.job_id(), st);
    return st;
  };
  const int size = s->plan.num_workers();
  if (req.peer_transport_addresses_size() != size) {
    return refused(absl::InvalidArgumentError(
        absl::StrCat("peer_transport_addresses has ", req.peer_transport_addresses_size(),
                     " entries; the session has ", size, " ranks")));
  }
  {
    std::unique_lock<std::mutex> l(mu_);
    absl::Status early;
    if (shutting_down_) {
      early = absl::UnavailableError("worker is shutting down");
    } else if (cancelled_early_.erase(req.job_id())) {
      early = absl::CancelledError(absl::StrCat("job_id = '", req.job_id(), "' was cancelled"));
    } else if (running_.count(req.job_id())) {
      return absl::AlreadyExistsError(
          absl::StrCat("job_id = '", req.job_id(), "' is already running on this worker"));
    }
    if (!early.ok()) {
      l.unlock();
      return refused(early);
    }
  }
  if (absl::Status st = Prepare(s.get(), req); !st.ok()) return refused(st);
  {
    std::lock_guard<std::mutex> l(mu_);
    running_[req.job_id()] = s;
  }
  const bool forward = req.kind() == v1::JOB_FORWARD;
  const std::string kind = forward ? "forward" : "backward";
  const std::vector<int64_t> sent0 = s->transport->BytesSentPerPeer();
  const std::vector<int64_t> recv0 = s->transport->BytesReceivedPerPeer();

  // The caller is watched while the job runs: a cancelled RPC cancels the job.
  {
    std::lock_guard<std::mutex> l(mu_);
    if (rpc_cancelled) watched_[req.job_id()] = Watched{s, &rpc_cancelled};
    if (!watcher_.joinable()) watcher_ = std::thread([this] { WatchLoop(); });
  }

  absl::StatusOr<PassStats> result;
  SessionInputGate gate(s.get());  // used by a streaming job only
  SessionOutputGate outputs(s.get());  // used by a job that streams its outputs only
  bool ran_executor = false;
  (void)s->transport->TakeDeviceIdleSeconds();  // drop what an earlier, failed job left
  const absl::Time job_start = absl::Now();
  absl::Time executor_start = job_start;
  {
    std::vector<std::string> addrs(req.peer_transport_addresses().begin(),
                                   req.peer_transport_addresses().end());
    absl::StatusOr<Transport*> transport = s->transport->ForJob(req.job_id(), addrs, step_timeout_);
    if (!transport.ok()) {
      result = transport.status();
    } else if (s->cancel) {
      result = absl::CancelledError("job cancelled");
    } else {
      ExecutorOptions opts;
      opts.softmax_scale = s->spec.softmax_scale();
      if (s->step_tokens > 0) opts.step_tokens = s->step_tokens;
      opts.step_timeout = step_timeout_;
      opts.cancel = &s->cancel;
      if (s->mask != nullptr) opts.mask_intervals = s->mask->intervals();
      if (req.inputs_streaming()) opts.inputs = &gate;
      if (req.outputs_streaming()) opts.outputs = &outputs;
      // Computes on the session's own stream, so the data plane's copies (io_stream) run
      // beside them instead of queueing behind them.
      opts.compute_stream = s->compute_stream.get();
      PlanExecutor executor(s->backend.get(), *transport, s->storage.get(), opts);
      executor_start = absl::Now();
      ran_executor = true;
      result = forward ? executor.RunForward(s->plan) : executor.RunBackward(s->plan);
      // The default stream's synchronisation: the device memory the pass released is reusable.
      const absl::Status reclaimed = s->backend->Synchronize(nullptr);
      if (result.ok() && !reclaimed.ok()) result = reclaimed;
    }
  }
  const absl::Time executor_end = absl::Now();
  {
    std::lock_guard<std::mutex> l(mu_);
    watched_.erase(req.job_id());
  }
  if (trace_jobs_) {
    // DFA_TRACE_OPS=1: where the worker's part of a job's wall time goes (host clock, ms).
    absl::FPrintF(stderr,
                  "job trace %s %s: rpc at %d us, rpc->start %.3f ms, start->executor %.3f ms, "
                  "executor %.3f ms, after %.3f ms\n",
                  req.job_id(), kind, absl::ToUnixMicros(rpc_start),
                  absl::ToDoubleMilliseconds(job_start - rpc_start),
                  absl::ToDoubleMilliseconds(executor_start - job_start),
                  absl::ToDoubleMilliseconds(executor_end - executor_start),
                  absl::ToDoubleMilliseconds(absl::Now() - executor_end));
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    running_.erase(req.job_id());
  }
  {
    std::lock_guard<std::mutex> l(s->mu);
    s->job_running = false;
    s->running_job_id.clear();
    s->inputs_streaming = false;
    // The next streaming job of the session waits for rows written after this one.
    if (forward) {
      s->q_rows.ClearArrivals();
      s->k_rows.ClearArrivals();
      s->v_rows.ClearArrivals();
    } else {
      s->dout_rows.ClearArrivals();
    }
    if (forward) {
      s->forward_done = result.ok();
      s->backward_done = false;
      if (result.ok()) s->inputs_consumed = false;
    } else {
      s->backward_done = result.ok();
      if (ran_executor) {
        // The backward writes its gradients into the memory of Q, K, V (and over O), also when
        // it fails half-way: the inputs and the forward's state are gone.
        s->inputs_consumed = true;
        s->forward_done = false;
        s->q_rows.Clear();
        s->k_rows.Clear();
        s->v_rows.Clear();
      }
    }
    absl::Status outcome = result.status();
    if (!outcome.ok() && s->cancel && outcome.code() != absl::StatusCode::kCancelled) {
      outcome = absl::CancelledError(absl::StrCat("job cancelled (", outcome.message(), ")"));
    }
    EndJobOutputs(s.get(), req.job_id(), outcome);
  }
  if (!result.ok()) {
    absl::Status st = result.status();
    bool stopping;
    {
      std::lock_guard<std::mutex> l(mu_);
      stopping = shutting_down_;
    }
    if (stopping) {
      // The worker is going away, not the job: UNAVAILABLE lets the coordinator and the client
      // treat it as a lost worker and retry elsewhere.
      return absl::UnavailableError(absl::StrCat("worker is shutting down; job_id = '",
                                                 req.job_id(), "' stopped (", st.message(),
                                                 ")"));
    }
    if (s->cancel && st.code() != absl::StatusCode::kCancelled) {
      st = absl::CancelledError(absl::StrCat("job_id = '", req.job_id(), "' cancelled (",
                                             st.message(), ")"));
    }
    return st;
  }

  WorkerMetrics* metrics = metrics_.load();
  v1::WorkerJobStats stats;
  stats.set_rank(s->rank);
  // GPU transports measure the compute stream's waits on the device; busy is the rest.
  const double device_idle = s->transport->TakeDeviceIdleSeconds();
  if (device_idle >= 0) {
    const double wall = absl::ToDoubleSeconds(absl::Now() - job_start);
    stats.set_busy_seconds(std::max(0.0, wall - device_idle));
    stats.set_idle_seconds(device_idle);
  } else {
    stats.set_busy_seconds(result->busy_seconds);
    stats.set_idle_seconds(result->idle_seconds);
  }
  stats.set_bytes_sent(result->bytes_sent);
  stats.set_bytes_received(result->bytes_received);
  int64_t fwd = 0, bwd = 0, merge = 0, delta = 0, other = 0;
  for (const StepStats& st : result->steps) {
    fwd += st.forward_launches;
    bwd += st.backward_launches;
    merge += st.merge_launches;
    delta += st.delta_launches;
    other += st.other_launches;
    if (metrics) metrics->ObserveStep(kind, st.busy_seconds, st.idle_seconds);
  }
  // Attention kernel calls (units, merges, delta); packing copies are not kernel launches.
  stats.set_kernel_launches(fwd + bwd + merge + delta);
  if (metrics) {
    metrics->AddFlops(kind, result->flops);
    metrics->AddLaunches("forward", static_cast<double>(fwd));
    metrics->AddLaunches("backward", static_cast<double>(bwd));
    metrics->AddLaunches("merge", static_cast<double>(merge));
    metrics->AddLaunches("delta", static_cast<double>(delta));
    const std::vector<int64_t> sent1 = s->transport->BytesSentPerPeer();
    const std::vector<int64_t> recv1 = s->transport->BytesReceivedPerPeer();
    for (size_t p = 0; p < sent1.size() && p < sent0.size(); ++p) {
      metrics->AddTransportBytes(std::string(s->transport->Name()), static_cast<int>(p),
                                  static_cast<double>(sent1[p] - sent0[p]),
                                  static_cast<double>(recv1[p] - recv0[p]));
    }
  }
  return stats;
}

JobRunner::~JobRunner() {
  {
    std::lock_guard<std::mutex> l(mu_);
    watch_stop_ = true;
  }
  watch_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

void JobRunner::WatchLoop() {
  std::unique_lock<std::mutex> l(mu_);
  while (!watch_stop_) {
    watch_cv_.wait_for(l, std::chrono::milliseconds(20));
    for (auto& [id, w] : watched_) {
      if (!w.session->cancel && (*w.rpc_cancelled)()) {
        w.session->cancel = true;
        w.session->transport->Abort();
      }
    }
  }
}

absl::Status JobRunner::Cancel(const std::string& job_id) {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id is empty");
  std::shared_ptr<WorkerSession> s;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = running_.find(job_id);
    if (it == running_.end()) {
      if (cancelled_early_.insert(job_id).second) {
        cancelled_order_.push_back(job_id);
        if (cancelled_order_.size() > kMaxRememberedCancels) {
          cancelled_early_.erase(cancelled_order_.front());
          cancelled_order_.pop_front();
        }
      }
      return absl::OkStatus();
    }
    s = it->second;
  }
  s->cancel = true;
  s->transport->Abort();
  s->rows_arrived.notify_all();  // a unit waiting for streamed inputs
  return absl::OkStatus();
}

void JobRunner::CancelAll() {
  std::vector<std::shared_ptr<WorkerSession>> all;
  {
    std::lock_guard<std::mutex> l(mu_);
    shutting_down_ = true;
    for (auto& [id, s] : running_) all.push_back(s);
  }
  for (auto& s : all) {
    s->cancel = true;
    s->transport->Abort();
  }
}

int JobRunner::running() const {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<int>(running_.size());
}

}  // namespace dfa
