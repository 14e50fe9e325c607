// Shared pieces of the Python extension dfa._dfa (client/python/src): how an absl::Status
// becomes a Python exception, how a blocking call runs without the GIL while Ctrl-C still
// works, and the conversions of the protocol's messages and names to Python values.
//
// Errors: every failed status is thrown as StatusError; the translator registered by
// RegisterStatusTranslator turns it into dfa.errors.from_status(code, name, message): a
// dfa.DfaError with `code` (the status code's name, e.g. "UNAVAILABLE"), and for
// INVALID_ARGUMENT a dfa.InvalidArgumentError, which is also a ValueError.
#pragma once

#include <nanobind/nanobind.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "client/client.h"
#include "core/dtype.h"
#include "core/status.h"

namespace dfa::python {

namespace nb = nanobind;
using client::TransferOptions;

class StatusError : public std::exception {
 public:
  explicit StatusError(absl::Status status)
      : status_(std::move(status)), what_(status_.ToString()) {}
  const absl::Status& status() const { return status_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  absl::Status status_;
  std::string what_;
};

inline void Check(const absl::Status& s) {
  if (!s.ok()) throw StatusError(s);
}
template <typename T>
T Value(absl::StatusOr<T> v) {
  if (!v.ok()) throw StatusError(v.status());
  return std::move(*v);
}
// An INVALID_ARGUMENT StatusError whose message names the argument first ("q: ...").
[[noreturn]] void ThrowInvalid(const std::string& message);

void RegisterStatusTranslator();

// This thread is Python's main thread (where signal handlers run). With the GIL held.
bool OnMainThread();

// While armed (RAII, by RunBlocking's direct path): a SIGINT calls `on_interrupt` once, from
// the module's one interrupt thread, and still reaches Python's own handler (chained: the C
// handler Python installed runs after ours), so KeyboardInterrupt follows once the GIL is back.
// Usable() — on the main thread, with the GIL, Python's SIGINT handler the default one
// (signal.default_int_handler: Ctrl-C raises KeyboardInterrupt) and no other call armed — says
// when it may be armed. One arm at a time.
class SigintArm {
 public:
  static bool Usable();
  explicit SigintArm(const std::function<void()>* on_interrupt);  // on_interrupt may be null
  ~SigintArm();  // disarms (waiting for an on_interrupt in progress), restores the handler
  SigintArm(const SigintArm&) = delete;
  SigintArm& operator=(const SigintArm&) = delete;
  // A SIGINT arrived while armed.
  bool fired() const;

 private:
  bool armed_ = false;
  uint64_t armed_at_ = 0;
};

// The polled way (any Python signal handler): fn() on a helper thread, the GIL released;
// every 50 ms the waiting thread takes the GIL and runs Python's signal handlers (main thread
// only; elsewhere they never run). When one raises, `on_interrupt` is called once, fn is still
// awaited, and the Python exception is thrown as nb::python_error.
template <typename F>
auto RunBlockingPolled(F&& fn, const std::function<void()>& on_interrupt) -> decltype(fn()) {
  using R = decltype(fn());
  std::optional<R> result;
  std::unique_ptr<nb::python_error> interrupted;
  {
    nb::gil_scoped_release release;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::thread worker([&] {
      R r = fn();
      std::lock_guard<std::mutex> lock(mu);
      result.emplace(std::move(r));
      done = true;
      cv.notify_all();
    });
    std::unique_lock<std::mutex> lock(mu);
    while (!done) {
      cv.wait_for(lock, std::chrono::milliseconds(50));
      if (done || interrupted) continue;
      lock.unlock();
      {
        nb::gil_scoped_acquire gil;
        if (PyErr_CheckSignals() != 0) interrupted = std::make_unique<nb::python_error>();
      }
      if (interrupted && on_interrupt) on_interrupt();
      lock.lock();
    }
    lock.unlock();
    worker.join();
  }
  if (interrupted) throw nb::python_error(*interrupted);
  return std::move(*result);
}

// Runs a blocking call fn() with the GIL released, so that Ctrl-C stops it: `on_interrupt`
// (optional) cancels what fn waits for, fn is still awaited, then KeyboardInterrupt (or what
// Python's handler raised) is thrown as nb::python_error; otherwise returns fn()'s result.
// Called with the GIL held.
//   * Directly on this thread (no thread per call) where SigintArm is usable: the main thread
//     with Python's default SIGINT handler. Python handlers of other signals run once the call
//     has returned.
//   * Elsewhere: on the main thread with another SIGINT handler, RunBlockingPolled (every
//     Python handler runs during the call); on other threads, directly (Python runs signal
//     handlers on the main thread only, so there is nothing to poll for).
template <typename F>
auto RunBlocking(F&& fn, const std::function<void()>& on_interrupt = nullptr) -> decltype(fn()) {
  using R = decltype(fn());
  const bool main = OnMainThread();
  if (main && !SigintArm::Usable()) return RunBlockingPolled(std::forward<F>(fn), on_interrupt);
  std::optional<R> result;
  bool fired = false;
  {
    std::optional<SigintArm> arm;
    if (main) arm.emplace(on_interrupt ? &on_interrupt : nullptr);
    nb::gil_scoped_release release;
    result.emplace(fn());
    fired = arm && arm->fired();
  }  // the GIL is back, then the handler restored
  if (fired && PyErr_CheckSignals() != 0) throw nb::python_error();
  return std::move(*result);
}

// Python dicts of protocol messages (field names as in the .proto files; enums by name).
nb::dict JobToDict(const v1::Job& job);
nb::dict WorkerToDict(const v1::WorkerInfo& w);
nb::dict StatusToDict(const v1::ClusterStatus& s);
nb::dict ShardToDict(const v1::ShardPlacement& s);
nb::dict SpecToDict(const v1::AttentionSpec& spec);

// An AttentionSpec from its fields; the checks of ValidateSpec (core/spec_validation.h), whose
// messages name the field ("spec.q_heads: must be a multiple of kv_heads (4), got 6").
// doc_offsets: packed documents per batch row (cu_seqlens; empty: none, one row: every row);
// window_left / window_right: the sliding window (-1: unbounded).
v1::AttentionSpec MakeSpec(int batch, int64_t seq_len, int q_heads, int kv_heads, int head_dim,
                           bool causal, const std::string& dtype, double softmax_scale,
                           const std::vector<std::vector<int64_t>>& doc_offsets = {},
                           int64_t window_left = -1, int64_t window_right = -1);
// MakeSpec from a dict of the same keys (dfa.AttentionSpec.as_dict(); the mask keys may be
// absent).
v1::AttentionSpec SpecFromDict(const nb::dict& spec);

// "forward" | "backward" -> JobKind; TensorKind from its proto value (1..9). INVALID_ARGUMENT
// naming `what` otherwise.
v1::JobKind ParseJobKind(const std::string& name);
v1::TensorKind ParseTensorKind(int kind, const char* what);
// "bf16" | "f16" | "f32" -> DType; INVALID_ARGUMENT naming `what`.dtype otherwise.
DType ParseTensorDType(const std::string& name, const char* what);

// TransferOptions from the binding's keyword arguments: path "auto" | "grpc" | "shm".
TransferOptions MakeTransferOptions(const std::string& path, int64_t chunk_bytes,
                                    int64_t segment_bytes);

absl::Duration Seconds(double s, const char* what);

// What a Python job object needs for Ctrl-C and retries, once for every job binding: the id of
// the job in flight (from AttentionJobOptions::observer), a cancel asked for before that id was
// known, and the log of retried errors (AttentionJobOptions::on_retry). Install() points the
// options' callbacks at this object, which must outlive the job.
class JobInterrupts {
 public:
  explicit JobInterrupts(client::Client* client) : client_(client) {}
  JobInterrupts(const JobInterrupts&) = delete;
  JobInterrupts& operator=(const JobInterrupts&) = delete;

  template <typename Options>
  void Install(Options* o) {
    o->observer = [this](const v1::Job& job) { Observe(job); };
    o->on_retry = [this](const absl::Status& s) {
      std::lock_guard<std::mutex> lock(mu_);
      retry_log_.push_back(s.ToString());
    };
  }
  // Before each blocking call: no cancel pending, no job known yet.
  void Begin() {
    std::lock_guard<std::mutex> lock(mu_);
    cancel_ = false;
    job_id_.clear();
  }
  // The on_interrupt of RunBlocking: cancels the job in flight, or the next one to start.
  void Interrupt() {
    std::lock_guard<std::mutex> lock(mu_);
    cancel_ = true;
    if (!job_id_.empty()) (void)client_->CancelJob(job_id_);
  }
  std::vector<std::string> TakeRetryLog() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    out.swap(retry_log_);
    return out;
  }

 private:
  void Observe(const v1::Job& job) {
    std::lock_guard<std::mutex> lock(mu_);
    if (job.job_id() != job_id_) {
      job_id_ = job.job_id();
      if (cancel_) (void)client_->CancelJob(job_id_);
    }
  }

  client::Client* client_;
  std::mutex mu_;
  bool cancel_ = false;
  std::string job_id_;
  std::vector<std::string> retry_log_;
};

}  // namespace dfa::python
