// dfa._dfa.DeviceAttentionJob: the C++ device training flow (client/device_attention_job.h) for
// Python, where the extension is built with CUDA. Tensors are passed as (data_ptr, dtype,
// shape, strides) tuples of torch CUDA tensors (dfa/torch/_device.py makes them); nothing is
// copied through host memory. forward(q, k, v, o) hands Q, K, V to the workers by CUDA IPC, runs
// the forward job and writes O into `o` (None: not written — a re-forward for a backward);
// backward(dout, dq, dk, dv) hands over dO and writes the gradients. Retries (a lost worker) are
// the C++ job's, each reason kept for take_retry_log(). Ctrl-C during a call cancels the running
// job, waits for the call and releases the session before KeyboardInterrupt propagates.
// Threads: one call at a time per object; calls run without the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "binding_util.h"

#if DFA_PY_HAVE_CUDA
#include "absl/strings/str_cat.h"
#include "client/device_attention_job.h"
#endif

namespace dfa::python {

#if DFA_PY_HAVE_CUDA
namespace {

using client::AttentionJobOptions;
using client::Client;
using client::DeviceAttentionJob;
using client::DeviceTensor;

// (data_ptr, dtype, shape, strides) -> DeviceTensor; INVALID_ARGUMENT naming `what`.
DeviceTensor TensorOf(nb::handle t, const char* what) {
  nb::tuple tu;
  if (!nb::try_cast(t, tu) || tu.size() != 4) {
    ThrowInvalid(absl::StrCat(what, ": expected a (data_ptr, dtype, shape, strides) tuple"));
  }
  DeviceTensor out;
  out.data = reinterpret_cast<void*>(nb::cast<uintptr_t>(tu[0]));
  if (out.data == nullptr) ThrowInvalid(absl::StrCat(what, ": data_ptr is null"));
  out.dtype = ParseTensorDType(nb::cast<std::string>(tu[1]), what);
  out.shape = nb::cast<std::vector<int64_t>>(tu[2]);
  out.strides = nb::cast<std::vector<int64_t>>(tu[3]);
  return out;
}

nb::dict TimesToDict(const client::DevicePhaseTimes& t) {
  nb::dict d;
  d["transfer"] = t.transfer;
  d["run"] = t.run;
  d["job"] = t.job;
  d["job_transfer"] = t.job_transfer;
  d["compute"] = t.compute();
  d["engine"] = t.engine;
  d["dispatch"] = t.dispatch();
  d["control"] = t.control();
  d["bytes"] = t.bytes;
  d["requests"] = t.requests;
  return d;
}

class PyDeviceAttentionJob {
 public:
  PyDeviceAttentionJob(Client& client, nb::dict spec, int num_workers, const std::string& schedule,
                       int max_retries, double recovery_timeout)
      : client_(&client) {
    AttentionJobOptions o;
    o.session.spec = SpecFromDict(spec);
    if (num_workers < 0) ThrowInvalid(absl::StrCat("num_workers: must be >= 0, got ", num_workers));
    if (max_retries < 0) ThrowInvalid(absl::StrCat("max_retries: must be >= 0, got ", max_retries));
    o.session.num_workers = num_workers;
    o.session.schedule = schedule;
    o.max_retries = max_retries;
    o.recovery_timeout = Seconds(recovery_timeout, "recovery_timeout");
    interrupts_.Install(&o);
    job_.emplace(client_, std::move(o));
  }

  ~PyDeviceAttentionJob() {
    nb::gil_scoped_release release;  // Release is an RPC
    job_.reset();
  }

  nb::dict Forward(nb::handle q, nb::handle k, nb::handle v, nb::handle o) {
    const DeviceTensor qt = TensorOf(q, "q"), kt = TensorOf(k, "k"), vt = TensorOf(v, "v");
    std::optional<DeviceTensor> ot;
    if (!o.is_none()) ot = TensorOf(o, "o");
    v1::Job job = Call([&] { return job_->Forward(qt, kt, vt, ot ? &*ot : nullptr); });
    return JobToDict(job);
  }

  nb::dict Backward(nb::handle dout, nb::handle dq, nb::handle dk, nb::handle dv) {
    const DeviceTensor d = TensorOf(dout, "grad_out"), a = TensorOf(dq, "dq"),
                       b = TensorOf(dk, "dk"), c = TensorOf(dv, "dv");
    v1::Job job = Call([&] { return job_->Backward(d, a, b, c); });
    return JobToDict(job);
  }

  void Release() { Check(RunBlocking([&] { return job_->Release(); })); }

  std::string session_id() {
    client::Session* s = job_->session();
    return s == nullptr ? "" : s->id();
  }
  int num_workers() {
    client::Session* s = job_->session();
    return s == nullptr ? 0 : s->num_workers();
  }
  int retries_done() const { return job_->retries_done(); }
  int64_t ipc_bytes() const { return job_->ipc_bytes(); }
  nb::dict last_times() const { return TimesToDict(job_->last_times()); }
  std::vector<std::string> TakeRetryLog() { return interrupts_.TakeRetryLog(); }

 private:
  template <typename F>
  auto Call(F&& fn) -> typename decltype(fn())::value_type {
    interrupts_.Begin();
    job_->run_cancel().Reset();
    try {
      // Ctrl-C: the job's waiting SubmitJob is cancelled (the coordinator cancels the job); a
      // job followed by id (an older coordinator) is cancelled through CancelJob.
      return Value(RunBlocking(fn, [this] {
        job_->run_cancel().Cancel();
        interrupts_.Interrupt();
      }));
    } catch (nb::python_error&) {
      {
        nb::gil_scoped_release release;
        (void)job_->Release();
      }
      throw;
    }
  }

  Client* client_;
  std::optional<DeviceAttentionJob> job_;
  JobInterrupts interrupts_{client_};
};

}  // namespace

void BindDeviceAttentionJob(nb::module_& m) {
  nb::class_<PyDeviceAttentionJob>(m, "DeviceAttentionJob")
      .def(nb::init<Client&, nb::dict, int, const std::string&, int, double>(), nb::arg("client"),
           nb::arg("spec"), nb::arg("num_workers") = 0, nb::arg("schedule") = "",
           nb::arg("max_retries") = 1, nb::arg("recovery_timeout") = 15.0,
           nb::keep_alive<1, 2>())
      .def("forward", &PyDeviceAttentionJob::Forward, nb::arg("q"), nb::arg("k"), nb::arg("v"),
           nb::arg("o").none())
      .def("backward", &PyDeviceAttentionJob::Backward, nb::arg("grad_out"), nb::arg("dq"),
           nb::arg("dk"), nb::arg("dv"))
      .def("release", &PyDeviceAttentionJob::Release)
      .def("take_retry_log", &PyDeviceAttentionJob::TakeRetryLog)
      .def_prop_ro("session_id", &PyDeviceAttentionJob::session_id)
      .def_prop_ro("num_workers", &PyDeviceAttentionJob::num_workers)
      .def_prop_ro("retries_done", &PyDeviceAttentionJob::retries_done)
      .def_prop_ro("ipc_bytes", &PyDeviceAttentionJob::ipc_bytes)
      .def_prop_ro("last_times", &PyDeviceAttentionJob::last_times);
}
#else
void BindDeviceAttentionJob(nb::module_&) {}
#endif

}  // namespace dfa::python
