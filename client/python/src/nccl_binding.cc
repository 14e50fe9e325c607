// The client's GPU path to workers on another host (client/nccl_tensor_io.h: the client joins
// its session's workers as one extra NCCL rank, bootstrapped through Coordinator.JoinClientGroup)
// for Python: dfa._dfa.NcclTensorIo and dfa._dfa.choose_device_path. Compiled where the
// extension is built with CUDA and NCCL (dfa_client_cuda with dfa_core_nccl); dfa._dfa.HAVE_NCCL
// says which. Elsewhere both names exist and raise UNIMPLEMENTED naming what the build lacks.
// dfa/device_io.py is the Python face (torch CUDA tensors, one NcclTensorIo per dfa.Client).
//
//   io = _dfa.NcclTensorIo(client._c, init_timeout=60.0, transfer_timeout=60.0)
//   io.upload(session._s, kind, data_ptr, dtype, shape, strides)  # -> {bytes, chunks, seconds}
//   io.download(...), io.upload_auto(...), io.download_auto(...)
//   io.group            # the group in use as a dict (no secret), None before the first transfer
//   io.groups_joined    # groups joined so far (1 while every session reused the first)
//   _dfa.choose_device_path(session.shards, this_host=None)  # "ipc" | "nccl"
//
// A transfer first checks that this process sees a CUDA device (FAILED_PRECONDITION naming the
// path the transfer takes and cudaGetDeviceCount's answer otherwise), then runs without the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "binding_util.h"

#if DFA_PY_HAVE_NCCL
#include <cuda_runtime_api.h>

#include "client/nccl_tensor_io.h"
#endif

namespace dfa::python {

#if DFA_PY_HAVE_NCCL
namespace {

using client::DeviceTensor;
using client::NcclTensorIo;
using client::Session;

// The NCCL path sends from (receives into) this process's GPU memory: without a visible device
// nothing can work, and NCCL's own errors would not say why.
void RequireCudaDevice(const char* path) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    const std::string why =
        e != cudaSuccess ? absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorString(e))
                         : std::string("cudaGetDeviceCount: 0 devices");
    (void)cudaGetLastError();
    throw StatusError(absl::FailedPreconditionError(absl::StrCat(
        "device_path = '", path, "': no CUDA device is visible to this process (", why,
        "); the device paths send from and receive into the caller's GPU memory")));
  }
}

nb::object GroupToPython(const std::optional<v1::JoinClientGroupResponse>& g) {
  if (!g) return nb::none();
  nb::dict d;
  d["group_id"] = g->group_id();
  d["client_rank"] = g->client_rank();
  d["size"] = g->size();
  d["init_timeout_ms"] = g->init_timeout_ms();
  d["expires_unix_ms"] = g->expires_unix_ms();
  nb::list workers;
  for (const v1::ClientGroupMember& m : g->workers()) {
    nb::dict w;
    w["rank"] = m.rank();
    w["worker_id"] = m.worker_id();
    w["address"] = m.address();
    w["host"] = m.host();
    workers.append(w);
  }
  d["workers"] = workers;
  return d;
}

nb::dict StatsToDict(const client::TransferStats& s) {
  nb::dict d;
  d["bytes"] = s.bytes;
  d["chunks"] = s.chunks;
  d["seconds"] = s.seconds;
  return d;
}

class PyNcclTensorIo {
 public:
  PyNcclTensorIo(client::Client& c, double init_timeout, double transfer_timeout)
      : io_(std::make_unique<NcclTensorIo>(
            &c, NcclTensorIo::Options{Seconds(init_timeout, "init_timeout"),
                                      Seconds(transfer_timeout, "transfer_timeout")})) {}

  ~PyNcclTensorIo() {
    nb::gil_scoped_release release;  // aborting a communicator may wait on NCCL
    io_.reset();
  }

  // upload: Q, K, V, dO; download: O, LSE, dQ, dK, dV (the C++ checks the rest).
  nb::dict Move(Session& s, int kind, uintptr_t ptr, const std::string& dtype,
                std::vector<int64_t> shape, std::vector<int64_t> strides, bool upload,
                bool automatic) {
    const v1::TensorKind k = ParseTensorKind(kind, "kind");
    const DeviceTensor t{reinterpret_cast<void*>(ptr), ParseTensorDType(dtype, "tensor"),
                         std::move(shape), std::move(strides)};
    if (t.data == nullptr) ThrowInvalid("data_ptr: is null");
    const bool nccl = !automatic || client::ChooseDevicePath(s.info(), client::LocalHostName()) ==
                                        client::DevicePath::kNccl;
    RequireCudaDevice(nccl ? "nccl" : "ipc");
    return StatsToDict(Value(RunBlocking([&]() -> absl::StatusOr<client::TransferStats> {
      if (automatic) return upload ? io_->UploadAuto(s, k, t) : io_->DownloadAuto(s, k, t);
      return upload ? io_->Upload(s, k, t) : io_->Download(s, k, t);
    })));
  }

  nb::object group() { return GroupToPython(io_->group()); }
  int groups_joined() const { return io_->groups_joined(); }

 private:
  std::unique_ptr<NcclTensorIo> io_;
};

}  // namespace

void BindNccl(nb::module_& m) {
  m.attr("HAVE_NCCL") = true;
  auto move = [](bool upload, bool automatic) {
    return [upload, automatic](PyNcclTensorIo& io, Session& s, int kind, uintptr_t ptr,
                               const std::string& dtype, std::vector<int64_t> shape,
                               std::vector<int64_t> strides) {
      return io.Move(s, kind, ptr, dtype, std::move(shape), std::move(strides), upload,
                     automatic);
    };
  };
  nb::class_<PyNcclTensorIo>(m, "NcclTensorIo")
      .def(nb::init<client::Client&, double, double>(), nb::arg("client"),
           nb::arg("init_timeout") = 60.0, nb::arg("transfer_timeout") = 60.0,
           nb::keep_alive<1, 2>())
      .def("upload", move(true, false), nb::arg("session"), nb::arg("kind"),
           nb::arg("data_ptr"), nb::arg("dtype"), nb::arg("shape"), nb::arg("strides"))
      .def("download", move(false, false), nb::arg("session"), nb::arg("kind"),
           nb::arg("data_ptr"), nb::arg("dtype"), nb::arg("shape"), nb::arg("strides"))
      .def("upload_auto", move(true, true), nb::arg("session"), nb::arg("kind"),
           nb::arg("data_ptr"), nb::arg("dtype"), nb::arg("shape"), nb::arg("strides"))
      .def("download_auto", move(false, true), nb::arg("session"), nb::arg("kind"),
           nb::arg("data_ptr"), nb::arg("dtype"), nb::arg("shape"), nb::arg("strides"))
      .def_prop_ro("group", &PyNcclTensorIo::group)
      .def_prop_ro("groups_joined", &PyNcclTensorIo::groups_joined);
  // ChooseDevicePath of a placement given as Session.shards (dicts with "worker_id", "host").
  m.def("choose_device_path",
        [](const nb::list& shards, std::optional<std::string> this_host) {
          v1::CreateSessionResponse info;
          for (size_t i = 0; i < shards.size(); ++i) {
            nb::dict d;
            if (!nb::try_cast(shards[i], d) || !d.contains("host") ||
                !nb::isinstance<nb::str>(d["host"])) {
              ThrowInvalid(absl::StrCat("shards[", i, "]: expected a dict with a string 'host' "
                                        "(Session.shards)"));
            }
            v1::ShardPlacement* p = info.add_shards();
            p->set_host(nb::cast<std::string>(d["host"]));
            if (d.contains("worker_id")) p->set_worker_id(nb::cast<std::string>(d["worker_id"]));
          }
          const std::string host = this_host ? *this_host : client::LocalHostName();
          return client::ChooseDevicePath(info, host) == client::DevicePath::kCudaIpc ? "ipc"
                                                                                      : "nccl";
        },
        nb::arg("shards"), nb::arg("this_host").none() = nb::none(),
        "'ipc' when every shard's host is this_host (default: this host's name), else 'nccl'.");
}
#else
namespace {
[[noreturn]] void NoNccl(const char* what) {
  throw StatusError(absl::UnimplementedError(absl::StrCat(
      what, ": this build of dfa._dfa has no NCCL path (it needs CUDA and NCCL at build "
      "time: ",
#if DFA_PY_HAVE_CUDA
      "NCCL was not found",
#else
      "built without CUDA",
#endif
      "); use device_path='ipc' for workers on this host, or host tensors")));
}
}  // namespace

void BindNccl(nb::module_& m) {
  m.attr("HAVE_NCCL") = false;
  m.def("NcclTensorIo", [](nb::args, nb::kwargs) { NoNccl("NcclTensorIo"); });
  m.def("choose_device_path", [](nb::args, nb::kwargs) { NoNccl("choose_device_path"); });
}
#endif

}  // namespace dfa::python
