// The same-host GPU path (client/cuda_tensor_io.h: CUDA IPC of the caller's device tensors) for
// Python, where the extension is built with CUDA (a repository build that has dfa_client_cuda);
// dfa._dfa.HAVE_CUDA says which. dfa/cuda_ipc.py is the Python face (torch CUDA tensors).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <vector>

#include "binding_util.h"

#if DFA_PY_HAVE_CUDA
#include "absl/strings/str_cat.h"
#include "client/cuda_tensor_io.h"
#include "core/gpu/cuda_ipc.h"
#endif

namespace dfa::python {

#if DFA_PY_HAVE_CUDA
namespace {

using client::DeviceTensor;
using client::Session;

DeviceTensor Tensor(uintptr_t ptr, const std::string& dtype, std::vector<int64_t> shape,
                    std::vector<int64_t> strides) {
  return DeviceTensor{reinterpret_cast<void*>(ptr), ParseTensorDType(dtype, "tensor"),
                      std::move(shape), std::move(strides)};
}

nb::dict RequestToDict(const v1::DeviceTransferRequest& r) {
  nb::dict d;
  d["kind"] = static_cast<int>(r.kind());
  d["rows"] = nb::make_tuple(r.rows().begin(), r.rows().end());
  d["upload"] = r.upload();
  d["host_id"] = r.host_id();
  d["offset"] = r.tensor().offset();
  d["device"] = r.tensor().device();
  d["shape"] = std::vector<int64_t>(r.tensor().shape().begin(), r.tensor().shape().end());
  d["strides"] = std::vector<int64_t>(r.tensor().strides().begin(), r.tensor().strides().end());
  return d;
}

v1::DeviceTransferRequest MakeRequest(const v1::AttentionSpec& spec, int kind,
                                      const DeviceTensor& t, nb::bytes handle, int64_t offset,
                                      int device, int64_t begin, int64_t end, bool upload,
                                      const std::string& host_id, int head_begin, int head_end) {
  v1::RowRange rows;
  rows.set_begin(begin);
  rows.set_end(end);
  return Value(client::MakeDeviceTransferRequest(
      spec, ParseTensorKind(kind, "kind"), t, std::string(handle.c_str(), handle.size()), offset,
      device, rows, upload, host_id, client::HeadSlice{head_begin, head_end}));
}

}  // namespace

void BindCuda(nb::module_& m) {
  m.attr("HAVE_CUDA") = true;
  m.def("upload_device",
        [](Session& s, int kind, uintptr_t ptr, const std::string& dtype,
           std::vector<int64_t> shape, std::vector<int64_t> strides) {
          const DeviceTensor t = Tensor(ptr, dtype, std::move(shape), std::move(strides));
          const v1::TensorKind k = ParseTensorKind(kind, "kind");
          return Value(RunBlocking([&] { return client::UploadDevice(s, k, t); })).bytes;
        },
        nb::arg("session"), nb::arg("kind"), nb::arg("data_ptr"), nb::arg("dtype"),
        nb::arg("shape"), nb::arg("strides"));
  m.def("download_device",
        [](Session& s, int kind, uintptr_t ptr, const std::string& dtype,
           std::vector<int64_t> shape, std::vector<int64_t> strides) {
          const DeviceTensor t = Tensor(ptr, dtype, std::move(shape), std::move(strides));
          const v1::TensorKind k = ParseTensorKind(kind, "kind");
          return Value(RunBlocking([&] { return client::DownloadDevice(s, k, t); })).bytes;
        },
        nb::arg("session"), nb::arg("kind"), nb::arg("data_ptr"), nb::arg("dtype"),
        nb::arg("shape"), nb::arg("strides"));
  // MakeDeviceTransferRequest (pure) as a dict of the request's fields.
  m.def("make_device_transfer_request",
        [](nb::dict spec, int kind, std::vector<int64_t> shape, std::vector<int64_t> strides,
           const std::string& dtype, nb::bytes handle, int64_t offset, int device, int64_t begin,
           int64_t end, bool upload, const std::string& host_id, int head_begin, int head_end) {
          const v1::AttentionSpec sp = SpecFromDict(spec);
          return RequestToDict(MakeRequest(sp, kind, Tensor(0, dtype, shape, strides), handle,
                                           offset, device, begin, end, upload, host_id,
                                           head_begin, head_end));
        },
        nb::arg("spec"), nb::arg("kind"), nb::arg("shape"), nb::arg("strides"),
        nb::arg("dtype"), nb::arg("handle"), nb::arg("offset"), nb::arg("device"),
        nb::arg("begin"), nb::arg("end"), nb::arg("upload"), nb::arg("host_id"),
        nb::arg("head_begin") = 0, nb::arg("head_end") = 0);
  // One raw DeviceTransfer to the worker of `rank` with a caller-made handle (tests: a cpu
  // worker's and another host's refusals). Returns the bytes the worker moved.
  m.def("device_transfer",
        [](Session& s, int rank, int kind, std::vector<int64_t> shape,
           std::vector<int64_t> strides, const std::string& dtype, nb::bytes handle,
           int64_t begin, int64_t end, bool upload, const std::string& host_id) {
          if (rank < 0 || rank >= s.num_workers()) {
            ThrowInvalid(absl::StrCat("rank: must be in [0, ", s.num_workers(), "), got ", rank));
          }
          v1::DeviceTransferRequest req = MakeRequest(s.spec(), kind, Tensor(0, dtype, shape,
                                                                             strides),
                                                      handle, 0, 0, begin, end, upload, host_id,
                                                      0, 0);
          return Value(RunBlocking([&] { return s.DataClient(rank).DeviceTransfer(req); }));
        },
        nb::arg("session"), nb::arg("rank"), nb::arg("kind"), nb::arg("shape"),
        nb::arg("strides"), nb::arg("dtype"), nb::arg("handle"), nb::arg("begin"),
        nb::arg("end"), nb::arg("upload"), nb::arg("host_id"));
  m.def("host_boot_id", [] { return Value(HostBootId()); });
  // What the workers receive for the device memory at `data_ptr`: the 64-byte handle of the
  // whole cudaMalloc allocation that holds it (not of a caching allocator's sub-range), the
  // pointer's offset in it, the allocation's size and device.
  m.def("export_cuda_ipc",
        [](uintptr_t ptr) {
          const CudaIpcBuffer b = Value(ExportCudaIpc(reinterpret_cast<const void*>(ptr)));
          nb::dict d;
          d["handle"] = nb::bytes(b.handle.data(), b.handle.size());
          d["offset"] = b.offset;
          d["allocation_bytes"] = b.allocation_bytes;
          d["device"] = b.device;
          return d;
        },
        nb::arg("data_ptr"));
}
#else
void BindCuda(nb::module_& m) { m.attr("HAVE_CUDA") = false; }
#endif

}  // namespace dfa::python
