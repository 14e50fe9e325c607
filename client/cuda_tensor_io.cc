#include "client/cuda_tensor_io.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/gpu/cuda_ipc.h"

namespace dfa::client {
namespace {

absl::Status CudaError(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

absl::Status SynchronizeDevice(int device) {
  int previous = 0;
  RETURN_IF_ERROR(CudaError(cudaGetDevice(&previous), "cudaGetDevice"));
  RETURN_IF_ERROR(CudaError(cudaSetDevice(device), "cudaSetDevice"));
  absl::Status st = CudaError(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  cudaSetDevice(previous);
  return st;
}

// The boot id, read once per process (it cannot change while the process runs).
absl::StatusOr<std::string> ThisHost() {
  static const absl::StatusOr<std::string> host = HostBootId();
  return host;
}

// Runs fn(rank) for every rank, in parallel threads when there are several (one rank: on this
// thread, sparing a thread's start and join per call); the first error by rank order.
template <typename Fn>
absl::Status ForEachRank(int n, Fn fn) {
  if (n == 1) return fn(0);
  std::vector<absl::Status> results(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] { results[static_cast<size_t>(rank)] = fn(rank); });
  }
  for (std::thread& th : threads) th.join();
  for (const absl::Status& st : results) RETURN_IF_ERROR(st);
  return absl::OkStatus();
}

absl::StatusOr<TransferStats> Transfer(Session& session, v1::TensorKind kind, const DeviceTensor& t,
                                       bool upload, bool synchronize) {
  if (t.data == nullptr) return absl::InvalidArgumentError("tensor.data is null");
  ASSIGN_OR_RETURN(const CudaIpcBuffer buffer, ExportCudaIpc(t.data));
  ASSIGN_OR_RETURN(const std::string host, ThisHost());
  if (upload && synchronize) RETURN_IF_ERROR(SynchronizeDevice(buffer.device));
  // Every request, checked before anything moves.
  const int n = session.num_workers();
  std::vector<std::vector<v1::DeviceTransferRequest>> requests(static_cast<size_t>(n));
  for (int rank = 0; rank < n; ++rank) {
    const v1::ShardPlacement& shard = session.info().shards(rank);
    for (const v1::RowRange& r : shard.owned()) {
      ASSIGN_OR_RETURN(
          v1::DeviceTransferRequest req,
          MakeDeviceTransferRequest(session.spec(), kind, t, buffer.handle, buffer.offset,
                                    buffer.device, r, upload, host, ShardHeads(shard, kind)));
      requests[static_cast<size_t>(rank)].push_back(std::move(req));
    }
    session.DataClient(rank);  // made here, not in the threads
  }
  const absl::Time start = absl::Now();
  std::vector<int64_t> bytes(static_cast<size_t>(n), 0);
  RETURN_IF_ERROR(ForEachRank(n, [&](int rank) -> absl::Status {
    for (const v1::DeviceTransferRequest& req : requests[static_cast<size_t>(rank)]) {
      ASSIGN_OR_RETURN(const int64_t b, session.DataClient(rank).DeviceTransfer(req));
      bytes[static_cast<size_t>(rank)] += b;
    }
    return absl::OkStatus();
  }));
  TransferStats stats;
  for (const int64_t b : bytes) stats.bytes += b;
  for (const auto& rs : requests) stats.chunks += static_cast<int64_t>(rs.size());
  stats.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return stats;
}

bool BindsInput(v1::JobKind job, v1::TensorKind k) {
  return job == v1::JOB_FORWARD ? (k == v1::TENSOR_Q || k == v1::TENSOR_K || k == v1::TENSOR_V)
                                : k == v1::TENSOR_DO;
}
bool BindsOutput(v1::JobKind job, v1::TensorKind k) {
  return job == v1::JOB_FORWARD
             ? (k == v1::TENSOR_O || k == v1::TENSOR_LSE)
             : (k == v1::TENSOR_DQ || k == v1::TENSOR_DK || k == v1::TENSOR_DV);
}

}  // namespace

absl::StatusOr<TransferStats> DeviceBindings::Bind(Session& session, v1::JobKind job,
                                                   const std::vector<DeviceBinding>& bindings,
                                                   const DeviceTransferOptions& options) {
  if (job != v1::JOB_FORWARD && job != v1::JOB_BACKWARD) {
    return absl::InvalidArgumentError(absl::StrCat("job = ", v1::JobKind_Name(job),
                                                   ": bindings are for JOB_FORWARD or "
                                                   "JOB_BACKWARD"));
  }
  ASSIGN_OR_RETURN(const std::string host, ThisHost());
  const int n = session.num_workers();
  std::vector<v1::BindDeviceTensorsRequest> requests(static_cast<size_t>(n));
  for (v1::BindDeviceTensorsRequest& r : requests) r.set_job(job);
  std::vector<int> devices;  // of the inputs, to synchronise
  for (size_t i = 0; i < bindings.size(); ++i) {
    const DeviceBinding& b = bindings[i];
    const std::string what = absl::StrCat("bindings[", i, "] (", v1::TensorKind_Name(b.kind), ")");
    if (b.tensor == nullptr || b.tensor->data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": tensor.data is null"));
    }
    if (!(b.upload ? BindsInput(job, b.kind) : BindsOutput(job, b.kind))) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " with upload = ", b.upload, " is not ", b.upload ? "an input" : "an output",
          " of ", v1::JobKind_Name(job)));
    }
    ASSIGN_OR_RETURN(const CudaIpcBuffer buffer, ExportCudaIpc(b.tensor->data));
    if (b.upload) devices.push_back(buffer.device);
    for (int rank = 0; rank < n; ++rank) {
      const v1::ShardPlacement& shard = session.info().shards(rank);
      for (const v1::RowRange& r : shard.owned()) {
        absl::StatusOr<v1::DeviceTransferRequest> req = MakeDeviceTransferRequest(
            session.spec(), b.kind, *b.tensor, buffer.handle, buffer.offset, buffer.device, r,
            b.upload, host, ShardHeads(shard, b.kind));
        if (!req.ok()) {
          return absl::Status(req.status().code(),
                              absl::StrCat(what, ": ", req.status().message()));
        }
        *requests[static_cast<size_t>(rank)].add_transfers() = *std::move(req);
      }
    }
  }
  std::vector<int> send;
  std::vector<std::string> wire(static_cast<size_t>(n));
  for (int rank = 0; rank < n; ++rank) {
    wire[static_cast<size_t>(rank)] = requests[static_cast<size_t>(rank)].SerializeAsString();
    auto it = sent_.find({session.id(), rank, static_cast<int>(job)});
    if (it == sent_.end() || it->second != wire[static_cast<size_t>(rank)]) send.push_back(rank);
    session.DataClient(rank);  // made here, not in the threads
  }
  if (options.synchronize) {
    std::sort(devices.begin(), devices.end());
    devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
    for (int d : devices) RETURN_IF_ERROR(SynchronizeDevice(d));
  }
  const absl::Time start = absl::Now();
  TransferStats stats;
  if (!send.empty()) {
    // What a worker held is unknown after a failed request: forget it, resend next time.
    for (int rank : send) sent_.erase({session.id(), rank, static_cast<int>(job)});
    RETURN_IF_ERROR(ForEachRank(static_cast<int>(send.size()), [&](int i) -> absl::Status {
      const int rank = send[static_cast<size_t>(i)];
      return session.DataClient(rank)
          .BindDeviceTensors(requests[static_cast<size_t>(rank)])
          .status();
    }));
    for (int rank : send) {
      sent_[{session.id(), rank, static_cast<int>(job)}] = std::move(wire[static_cast<size_t>(rank)]);
    }
  }
  stats.chunks = static_cast<int64_t>(send.size());
  stats.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return stats;
}

std::vector<int64_t> DeviceTensor::EffectiveStrides() const {
  if (!strides.empty()) return strides;
  std::vector<int64_t> out(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) out[i - 1] = out[i] * shape[i];
  return out;
}

absl::StatusOr<v1::DeviceTransferRequest> MakeDeviceTransferRequest(
    const v1::AttentionSpec& spec, v1::TensorKind kind, const DeviceTensor& t,
    const std::string& ipc_handle, int64_t base_offset, int device, const v1::RowRange& r,
    bool upload, const std::string& host_id, HeadSlice heads) {
  const bool lse = kind == v1::TENSOR_LSE;
  const size_t dims = lse ? 3 : 4;
  const size_t row_dim = lse ? 2 : 1;
  const size_t head_dim = lse ? 1 : 2;  // the heads dimension
  if (t.shape.size() != dims) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor.shape has ", t.shape.size(), " dimensions; ", v1::TensorKind_Name(kind), " needs ",
        dims, lse ? " ([batch, heads, seq_len])" : " ([batch, seq_len, heads, head_dim])"));
  }
  if (!t.strides.empty() && t.strides.size() != dims) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor.strides has ", t.strides.size(), " entries; tensor.shape has ", dims));
  }
  if (t.shape[row_dim] != spec.seq_len()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor.shape[", row_dim, "] = ", t.shape[row_dim],
                     " differs from spec.seq_len = ", spec.seq_len()));
  }
  if (r.begin() < 0 || r.end() <= r.begin() || r.end() > spec.seq_len()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows = [", r.begin(), ", ", r.end(), ") is not inside the sequence"));
  }
  const int64_t all_heads = t.shape[head_dim];
  if (!heads.empty() && (heads.begin < 0 || heads.end > all_heads)) {
    return absl::InvalidArgumentError(absl::StrCat("heads [", heads.begin, ", ", heads.end,
                                                   ") of the shard lie outside tensor.shape[",
                                                   head_dim, "] = ", all_heads));
  }
  const std::vector<int64_t> strides = t.EffectiveStrides();
  v1::DeviceTransferRequest req;
  req.set_kind(kind);
  *req.mutable_rows() = r;
  req.set_upload(upload);
  req.set_host_id(host_id);
  v1::DeviceTensorRef* ref = req.mutable_tensor();
  ref->set_cuda_ipc_handle(ipc_handle);
  ref->set_offset(base_offset + (r.begin() * strides[row_dim] + heads.First() * strides[head_dim]) *
                                    DTypeSize(t.dtype));
  ref->set_dtype(ToProtoDType(t.dtype));
  ref->set_device(device);
  for (size_t i = 0; i < dims; ++i) {
    const int64_t size = i == row_dim    ? r.end() - r.begin()
                         : i == head_dim ? heads.Count(static_cast<int>(all_heads))
                                         : t.shape[i];
    ref->add_shape(size);
    ref->add_strides(strides[i]);
  }
  return req;
}

absl::StatusOr<TransferStats> UploadDevice(Session& session, v1::TensorKind kind,
                                           const DeviceTensor& t,
                                           const DeviceTransferOptions& options) {
  if (kind != v1::TENSOR_Q && kind != v1::TENSOR_K && kind != v1::TENSOR_V &&
      kind != v1::TENSOR_DO) {
    return absl::InvalidArgumentError(absl::StrCat("kind = ", v1::TensorKind_Name(kind),
                                                   ": only Q, K, V and dO can be uploaded"));
  }
  return Transfer(session, kind, t, /*upload=*/true, options.synchronize);
}

absl::StatusOr<TransferStats> DownloadDevice(Session& session, v1::TensorKind kind,
                                             const DeviceTensor& t) {
  return Transfer(session, kind, t, /*upload=*/false, /*synchronize=*/false);
}

}  // namespace dfa::client
