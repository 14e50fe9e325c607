// dfa._dfa.AttentionJob: the C++ training flow with retries (client/attention_job.h) for
// Python. forward(q, k, v) uploads the three tensors straight from the caller's memory (views,
// no copy), runs the forward job and returns O (and LSE when asked); backward(dO) uploads only
// dO (the session kept Q, K, V, O, LSE on the workers) and returns dQ, dK, dV. A lost worker
// (UNAVAILABLE) is retried as AttentionJob does: a new session on the live workers, inputs
// re-sent from the arrays this object holds (it keeps references to q, k, v and dO until the
// next forward / release), at most max_retries times; each retry's reason is kept for
// take_retry_log(). Ctrl-C during a call cancels the running job, waits for the call to end and
// releases the session before KeyboardInterrupt propagates.
//
// Threads: one call at a time per object (the Python side holds a lock); calls run without the
// GIL, so objects of different layers may run in parallel threads.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "binding_util.h"
#include "client/attention_job.h"
#include "tensors.h"

namespace dfa::python {
namespace {

using client::AttentionJob;
using client::AttentionJobOptions;
using client::Client;

class PyAttentionJob {
 public:
  PyAttentionJob(Client& client, nb::dict spec, int num_workers, const std::string& schedule,
                 int ttl_seconds, const std::string& path, int64_t chunk_bytes,
                 int64_t segment_bytes, int max_retries, double recovery_timeout,
                 bool download_lse)
      : client_(&client) {
    AttentionJobOptions o;
    o.session.spec = SpecFromDict(spec);
    if (num_workers < 0) ThrowInvalid(absl::StrCat("num_workers: must be >= 0, got ", num_workers));
    if (max_retries < 0) ThrowInvalid(absl::StrCat("max_retries: must be >= 0, got ", max_retries));
    o.session.num_workers = num_workers;
    o.session.schedule = schedule;
    o.session.ttl_seconds = ttl_seconds;
    o.transfer = MakeTransferOptions(path, chunk_bytes, segment_bytes);
    o.max_retries = max_retries;
    o.recovery_timeout = Seconds(recovery_timeout, "recovery_timeout");
    o.download_lse = download_lse;
    interrupts_.Install(&o);
    spec_ = o.session.spec;
    job_.emplace(client_, std::move(o));
  }

  ~PyAttentionJob() {
    nb::gil_scoped_release release;  // Release is an RPC
    job_.reset();
  }

  nb::tuple Forward(const InputArray& q, const InputArray& k, const InputArray& v) {
    // Checked before anything is held or sent.
    client::HostTensor qv = InputView(q, spec_, v1::TENSOR_Q, "q");
    client::HostTensor kv = InputView(k, spec_, v1::TENSOR_K, "k");
    client::HostTensor vv = InputView(v, spec_, v1::TENSOR_V, "v");
    q_ = q;
    k_ = k;
    v_ = v;
    inputs_held_ = true;
    qv_ = std::move(qv);
    kv_ = std::move(kv);
    vv_ = std::move(vv);
    v1::Job job;
    client::ForwardOutputs out = Call([&] { return job_->Forward(qv_, kv_, vv_, &job); });
    nb::object lse = out.lse.bytes.empty() ? nb::none() : OutputArray(std::move(out.lse));
    return nb::make_tuple(OutputArray(std::move(out.o)), lse, JobToDict(job));
  }

  nb::tuple Backward(const InputArray& dout) {
    if (!inputs_held_) {
      Check(absl::FailedPreconditionError(
          "backward: the last forward ran without gradients (forget_inputs); run forward again"));
    }
    client::HostTensor dv = InputView(dout, spec_, v1::TENSOR_DO, "grad_out");
    do_ = dout;
    dov_ = std::move(dv);
    v1::Job job;
    client::BackwardOutputs out = Call([&] { return job_->Backward(dov_, &job); });
    do_ = InputArray();  // dO is not needed after its backward
    return nb::make_tuple(OutputArray(std::move(out.dq)), OutputArray(std::move(out.dk)),
                          OutputArray(std::move(out.dv)), JobToDict(job));
  }

  // Drops the references to the last forward's inputs (a forward without gradients: nothing
  // is kept for a backward, which then fails FAILED_PRECONDITION until the next forward).
  void ForgetInputs() {
    inputs_held_ = false;
    q_ = k_ = v_ = do_ = InputArray();
  }

  void Release() {
    Check(RunBlocking([&] { return job_->Release(); }));
    ForgetInputs();
  }

  std::string session_id() {
    client::Session* s = job_->session();
    return s == nullptr ? "" : s->id();
  }
  int num_workers() {
    client::Session* s = job_->session();
    return s == nullptr ? 0 : s->num_workers();
  }
  nb::list shards() {
    nb::list out;
    if (client::Session* s = job_->session()) {
      for (const auto& sh : s->info().shards()) out.append(ShardToDict(sh));
    }
    return out;
  }
  int retries_done() const { return job_->retries_done(); }
  int64_t bytes_uploaded() const { return job_->bytes_uploaded(); }
  nb::dict spec() const { return SpecToDict(spec_); }
  std::vector<std::string> TakeRetryLog() { return interrupts_.TakeRetryLog(); }

 private:
  // Runs a blocking AttentionJob call; Ctrl-C cancels its job, and the session is released
  // before the KeyboardInterrupt propagates.
  template <typename F>
  auto Call(F&& fn) -> typename decltype(fn())::value_type {
    interrupts_.Begin();
    job_->run_cancel().Reset();
    try {
      // Ctrl-C: a streaming job's waiting SubmitJob is cancelled (the coordinator cancels the
      // job); a job followed by id is cancelled through CancelJob.
      return Value(RunBlocking(fn, [this] {
        job_->run_cancel().Cancel();
        interrupts_.Interrupt();
      }));
    } catch (nb::python_error&) {
      {
        nb::gil_scoped_release release;
        (void)job_->Release();
      }
      ForgetInputs();
      throw;
    }
  }

  Client* client_;
  v1::AttentionSpec spec_;
  std::optional<AttentionJob> job_;
  // The caller's arrays behind the views AttentionJob holds pointers to (inputs of a retry).
  InputArray q_, k_, v_, do_;
  bool inputs_held_ = false;
  client::HostTensor qv_, kv_, vv_, dov_;
  JobInterrupts interrupts_{client_};
};

}  // namespace

void BindAttentionJob(nb::module_& m) {
  nb::class_<PyAttentionJob>(m, "AttentionJob")
      .def(nb::init<Client&, nb::dict, int, const std::string&, int, const std::string&, int64_t,
                    int64_t, int, double, bool>(),
           nb::arg("client"), nb::arg("spec"), nb::arg("num_workers") = 0,
           nb::arg("schedule") = "", nb::arg("ttl_seconds") = 0, nb::arg("path") = "auto",
           nb::arg("chunk_bytes") = client::kDefaultChunkBytes,
           nb::arg("segment_bytes") = int64_t{64} << 20, nb::arg("max_retries") = 1,
           nb::arg("recovery_timeout") = 15.0, nb::arg("download_lse") = false,
           nb::keep_alive<1, 2>())
      .def("forward", &PyAttentionJob::Forward, nb::arg("q"), nb::arg("k"), nb::arg("v"))
      .def("backward", &PyAttentionJob::Backward, nb::arg("grad_out"))
      .def("release", &PyAttentionJob::Release)
      .def("forget_inputs", &PyAttentionJob::ForgetInputs)
      .def("take_retry_log", &PyAttentionJob::TakeRetryLog)
      .def_prop_ro("session_id", &PyAttentionJob::session_id)
      .def_prop_ro("num_workers", &PyAttentionJob::num_workers)
      .def_prop_ro("shards", &PyAttentionJob::shards)
      .def_prop_ro("retries_done", &PyAttentionJob::retries_done)
      .def_prop_ro("bytes_uploaded", &PyAttentionJob::bytes_uploaded)
      .def_prop_ro("spec", &PyAttentionJob::spec);
}

}  // namespace dfa::python
