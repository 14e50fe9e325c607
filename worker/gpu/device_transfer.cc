#include "worker/gpu/device_transfer.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/gpu/cuda_ipc.h"
#include "core/gpu/cuda_status.h"
#include "worker/session_tensors.h"

namespace dfa {
namespace {

using session_tensors::CheckReadable;
using session_tensors::CoverageOf;
using session_tensors::IsGradient;
using session_tensors::KindName;
using session_tensors::ViewOf;

using CopyKind = AttentionBackend::CopyKind;

constexpr int64_t kMaxStride = int64_t{1} << 48;  // elements; keeps byte extents from overflowing

std::string DTypeName(v1::DType t) { return v1::DType_Name(t); }

using session_tensors::IsUploadKind;
bool IsKv(v1::TensorKind k) {
  return k == v1::TENSOR_K || k == v1::TENSOR_V || k == v1::TENSOR_DK || k == v1::TENSOR_DV;
}

std::string RangeStr(int64_t b, int64_t e) { return absl::StrCat("[", b, ", ", e, ")"); }

std::string OwnedStr(const WorkerSession& s) {
  std::string out;
  for (const RowRange& r : s.storage->owned()) {
    absl::StrAppend(&out, out.empty() ? "" : " ", RangeStr(r.begin, r.end));
  }
  return out;
}

// Local row of `r` when it lies inside one owned range.
absl::StatusOr<int64_t> LocalRowOf(const WorkerSession& s, const RowRange& r) {
  int64_t local = 0;
  for (const RowRange& o : s.storage->owned()) {
    if (o.Contains(r)) return local + (r.begin - o.begin);
    local += o.size();
  }
  return absl::OutOfRangeError(absl::StrCat("rows = ", RangeStr(r.begin, r.end),
                                            " is not inside one owned range of this worker's "
                                            "shard ",
                                            OwnedStr(s), "; send one request per range"));
}

absl::Status CheckDType(const WorkerSession& s, v1::TensorKind kind, v1::DType got) {
  const v1::DType spec = s.spec.dtype();
  const bool ok = kind == v1::TENSOR_LSE ? got == v1::DTYPE_F32
                  : IsGradient(kind)     ? (got == spec || got == v1::DTYPE_F32)
                                         : got == spec;
  if (ok) return absl::OkStatus();
  const std::string want = kind == v1::TENSOR_LSE ? "DTYPE_F32"
                           : IsGradient(kind)
                               ? absl::StrCat(DTypeName(spec), " (spec.dtype) or DTYPE_F32")
                               : absl::StrCat(DTypeName(spec), " (spec.dtype)");
  return absl::InvalidArgumentError(absl::StrCat("tensor.dtype = ", DTypeName(got), " for ",
                                                 KindName(kind), "; expected ", want));
}

// A dimension of the client's tensor other than the dense innermost one.
struct Dim {
  int64_t size = 1;
  int64_t stride = 0;
  int index = 0;  // in tensor.shape
};

// The two outer dimensions must not make elements overlap: ordered by stride, each must step
// past everything inside it. `inner` is the dense innermost extent (elements).
absl::Status CheckNoOverlap(std::vector<Dim> dims, int64_t inner) {
  dims.erase(std::remove_if(dims.begin(), dims.end(), [](const Dim& d) { return d.size <= 1; }),
             dims.end());
  std::sort(dims.begin(), dims.end(),
            [](const Dim& a, const Dim& b) { return a.stride < b.stride; });
  int64_t extent = inner;
  for (const Dim& d : dims) {
    if (d.stride < extent) {
      return absl::InvalidArgumentError(absl::StrCat("tensor.strides[", d.index, "] = ", d.stride,
                                                     " makes elements overlap (needs >= ", extent,
                                                     ")"));
    }
    extent = d.stride * d.size;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateDeviceTransfer(const WorkerSession& s, const v1::DeviceTransferRequest& req,
                                    const std::string& this_host, int64_t* bytes_out) {
  const v1::TensorKind kind = req.kind();
  if (req.upload() && !IsUploadKind(kind)) {
    return absl::InvalidArgumentError(
        absl::StrCat("kind = ", KindName(kind),
                     ": only TENSOR_Q, TENSOR_K, TENSOR_V and TENSOR_DO can be "
                     "uploaded"));
  }
  RETURN_IF_ERROR(session_tensors::CheckKnownKind(kind));
  const RowRange rows{req.rows().begin(), req.rows().end()};
  if (rows.begin < 0 || rows.end <= rows.begin) {
    return absl::InvalidArgumentError(absl::StrCat("rows = ", RangeStr(rows.begin, rows.end),
                                                   " is empty or negative (it must be set)"));
  }
  RETURN_IF_ERROR(LocalRowOf(s, rows).status());

  const v1::DeviceTensorRef& t = req.tensor();
  RETURN_IF_ERROR(CheckDType(s, kind, t.dtype()));
  const bool lse = kind == v1::TENSOR_LSE;
  // The heads this worker holds: all of the spec's, or its range of a head-split plan (the
  // client's ref then starts at the range's first head, rows strided over all heads).
  const HeadRange held = IsKv(kind) ? s.kv_heads : s.q_heads;
  const int64_t heads = held.size();
  const std::string heads_name = absl::StrCat("heads (this worker's ", IsKv(kind) ? "kv" : "q",
                                              " heads [", held.begin, ", ", held.end, "))");
  const std::vector<int64_t> want =
      lse ? std::vector<int64_t>{s.spec.batch(), heads, rows.size()}
          : std::vector<int64_t>{s.spec.batch(), rows.size(), heads, s.spec.head_dim()};
  const std::string names[] = {"batch (spec.batch)", lse ? heads_name : "rows (the size of rows)",
                               lse ? "rows (the size of rows)" : heads_name,
                               "head_dim (spec.head_dim)"};
  if (t.shape_size() != static_cast<int>(want.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor.shape has ", t.shape_size(), " entries; ", KindName(kind), " needs ", want.size(),
        lse ? " ([batch, heads, rows])" : " ([batch, rows, heads, head_dim])"));
  }
  for (int i = 0; i < t.shape_size(); ++i) {
    if (t.shape(i) != want[static_cast<size_t>(i)]) {
      return absl::InvalidArgumentError(absl::StrCat("tensor.shape[", i, "] = ", t.shape(i),
                                                     " differs from ", names[i], " = ",
                                                     want[static_cast<size_t>(i)]));
    }
  }
  if (t.strides_size() != t.shape_size()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor.strides has ", t.strides_size(),
                                                   " entries; tensor.shape has ", t.shape_size()));
  }
  for (int i = 0; i < t.strides_size(); ++i) {
    if (t.strides(i) < 0 || t.strides(i) > kMaxStride) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor.strides[", i, "] = ", t.strides(i), " must be in [0, 2^48]"));
    }
  }
  const int last = t.strides_size() - 1;
  if (t.strides(last) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor.strides[", last, "] = ", t.strides(last), " must be 1 (dense)"));
  }
  if (!lse && t.strides(2) != s.spec.head_dim() && t.shape(2) > 1) {
    return absl::InvalidArgumentError(absl::StrCat("tensor.strides[2] = ", t.strides(2),
                                                   " must be head_dim = ", s.spec.head_dim(),
                                                   " (heads dense inside a row)"));
  }
  const int64_t inner = lse ? t.shape(2) : t.shape(2) * t.shape(3);
  RETURN_IF_ERROR(
      CheckNoOverlap({{t.shape(0), t.strides(0), 0}, {t.shape(1), t.strides(1), 1}}, inner));
  if (t.cuda_ipc_handle().size() != 64) {
    return absl::InvalidArgumentError(absl::StrCat("tensor.cuda_ipc_handle has ",
                                                   t.cuda_ipc_handle().size(),
                                                   " bytes; a cudaIpcMemHandle_t has 64"));
  }
  if (t.offset() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor.offset = ", t.offset(), " must be >= 0"));
  }
  if (req.host_id().empty()) {
    return absl::InvalidArgumentError(
        "host_id must be set (the client's /proc/sys/kernel/random/boot_id)");
  }
  if (req.host_id() != this_host) {
    return absl::FailedPreconditionError(absl::StrCat(
        "host_id = '", req.host_id(), "' is not this worker's host ('", this_host,
        "'): CUDA IPC works only between processes of one host; use Upload/Download (gRPC)"));
  }
  if (s.backend->Name() == "cpu") {
    return absl::FailedPreconditionError(
        "this worker computes on the cpu backend (host memory): CUDA IPC transfers need a cuda "
        "or cudnn worker; use SharedMemoryTransfer or Upload/Download");
  }
  const int64_t elems = lse ? int64_t{s.spec.batch()} * heads * rows.size()
                            : int64_t{s.spec.batch()} * rows.size() * heads * s.spec.head_dim();
  *bytes_out = elems * DTypeSize(static_cast<DType>(t.dtype()));
  return absl::OkStatus();
}

namespace {

const absl::StatusOr<std::string>& ThisHost() {
  static const absl::StatusOr<std::string> kHost = HostBootId();
  return kHost;
}

absl::StatusOr<CudaIpcImporter*> Importer(WorkerSession* s) {
  if (s->cuda_ipc == nullptr) {
    cudaPointerAttributes attr;
    CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&attr, s->storage->q().data));
    s->cuda_ipc = std::make_shared<CudaIpcImporter>(attr.device);
  }
  return s->cuda_ipc.get();
}

// The bytes the strided client tensor spans from its first element.
size_t SpanBytes(const v1::DeviceTensorRef& t) {
  int64_t span = 1;
  for (int i = 0; i < t.shape_size(); ++i) span += (t.shape(i) - 1) * t.strides(i);
  return static_cast<size_t>(span * DTypeSize(static_cast<DType>(t.dtype())));
}

absl::Status Prefixed(const absl::Status& st, const std::string& prefix) {
  if (st.ok()) return st;
  return absl::Status(st.code(), absl::StrCat(prefix, st.message()));
}

// After an upload's copy has completed: its rows count as written; results of earlier inputs
// are stale.
void MarkUploaded(WorkerSession* s, const v1::DeviceTransferRequest& req) {
  const v1::TensorKind kind = req.kind();
  const RowRange rows{req.rows().begin(), req.rows().end()};
  const absl::StatusOr<int64_t> local = LocalRowOf(*s, rows);
  if (!local.ok()) return;  // validated before the copy
  RowCoverage* c = CoverageOf(s, kind);
  for (int b = 0; b < s->spec.batch(); ++b) c->Mark(b * s->storage->rows() + *local, rows.size());
  if (kind != v1::TENSOR_DO) s->forward_done = false;
  s->backward_done = false;
  s->rows_arrived.notify_all();  // a streaming job may wait for these rows
}

// Validates `req` and queues its copy on the session's io stream (not synchronised).
absl::StatusOr<int64_t> EnqueueDeviceTransfer(WorkerSession* s,
                                              const v1::DeviceTransferRequest& req) {
  if (!ThisHost().ok()) return ThisHost().status();
  int64_t bytes = 0;
  RETURN_IF_ERROR(ValidateDeviceTransfer(*s, req, *ThisHost(), &bytes));
  const v1::TensorKind kind = req.kind();
  if (!req.upload()) RETURN_IF_ERROR(CheckReadable(*s, kind));
  const RowRange rows{req.rows().begin(), req.rows().end()};
  ASSIGN_OR_RETURN(const int64_t local, LocalRowOf(*s, rows));
  const v1::DeviceTensorRef& t = req.tensor();
  const bool lse = kind == v1::TENSOR_LSE;
  const DType dtype = static_cast<DType>(t.dtype());

  ASSIGN_OR_RETURN(CudaIpcImporter * importer, Importer(s));
  ASSIGN_OR_RETURN(void* remote, importer->Map(t.cuda_ipc_handle(), t.offset(), SpanBytes(t)));

  // The session's rows and the client's tensor as views of one shape.
  TensorView mine, theirs;
  if (lse) {
    // [B, H, n] as a view of B "batches" of H "rows" of one n-long "head".
    const RowStatView st = s->storage->lse();
    mine = TensorView{
        st.data + local, DType::kF32,     st.batch, st.heads, 1, static_cast<int>(rows.size()),
        st.HeadStride(), st.BatchStride()};
    theirs =
        TensorView{remote,       DType::kF32, st.batch, st.heads, 1, static_cast<int>(rows.size()),
                   t.strides(1), t.strides(0)};
  } else {
    mine = ViewOf(*s, kind).Slice(local, rows.size());
    theirs = TensorView{remote,
                        dtype,
                        static_cast<int>(t.shape(0)),
                        t.shape(1),
                        static_cast<int>(t.shape(2)),
                        static_cast<int>(t.shape(3)),
                        t.strides(1),
                        t.strides(0)};
  }
  // TensorView treats a 0 stride as dense; a size-1 dimension's stride does not matter.
  if (theirs.rows == 1) theirs.row_stride = 0;
  if (theirs.batch == 1) theirs.batch_stride = 0;
  const TensorView& src = req.upload() ? theirs : mine;
  const TensorView& dst = req.upload() ? mine : theirs;
  AttentionBackend* be = s->backend.get();
  const int64_t row_elems = int64_t{mine.heads} * mine.head_dim;
  const bool dense_rows = !lse && theirs.RowStride() == row_elems;
  if (mine.dtype == theirs.dtype && dense_rows) {
    // One copy-engine transfer per batch (peer copy when the memory is on another GPU).
    const size_t n = static_cast<size_t>(rows.size() * row_elems * DTypeSize(dtype));
    for (int b = 0; b < mine.batch; ++b) {
      const auto* from =
          static_cast<const uint8_t*>(src.data) + b * src.BatchStride() * DTypeSize(dtype);
      auto* to = static_cast<uint8_t*>(dst.data) + b * dst.BatchStride() * DTypeSize(dtype);
      RETURN_IF_ERROR(be->Copy(to, from, n, CopyKind::kDeviceToDevice, s->io_stream.get()));
    }
  } else {
    RETURN_IF_ERROR(be->Convert(src, dst, s->io_stream.get()));
  }
  return bytes;
}

bool IsJobInput(v1::JobKind job, v1::TensorKind k) {
  return job == v1::JOB_FORWARD ? (k == v1::TENSOR_Q || k == v1::TENSOR_K || k == v1::TENSOR_V)
                                : k == v1::TENSOR_DO;
}
bool IsJobOutput(v1::JobKind job, v1::TensorKind k) {
  return job == v1::JOB_FORWARD ? (k == v1::TENSOR_O || k == v1::TENSOR_LSE) : IsGradient(k);
}

std::vector<v1::DeviceTransferRequest>* BoundOf(WorkerSession* s, v1::JobKind job) {
  if (job == v1::JOB_FORWARD) return &s->bound_forward;
  if (job == v1::JOB_BACKWARD) return &s->bound_backward;
  return nullptr;
}

}  // namespace

absl::StatusOr<int64_t> RunDeviceTransfer(WorkerSession* s, const v1::DeviceTransferRequest& req) {
  ASSIGN_OR_RETURN(const int64_t bytes, EnqueueDeviceTransfer(s, req));
  RETURN_IF_ERROR(s->backend->Synchronize(s->io_stream.get()));
  if (req.upload()) MarkUploaded(s, req);
  return bytes;
}

absl::Status ValidateBinding(const WorkerSession& s, const v1::BindDeviceTensorsRequest& req,
                             const std::string& this_host, int64_t* bytes_out) {
  const v1::JobKind job = req.job();
  if (job != v1::JOB_FORWARD && job != v1::JOB_BACKWARD) {
    return absl::InvalidArgumentError(absl::StrCat("job = ", static_cast<int>(job),
                                                   " is not JOB_FORWARD or JOB_BACKWARD"));
  }
  if (req.transfers_size() > kMaxBoundTransfers) {
    return absl::InvalidArgumentError(absl::StrCat("transfers has ", req.transfers_size(),
                                                   " entries; at most ", kMaxBoundTransfers));
  }
  // Every entry's fields first; what no entry can fix (another host, a cpu worker) after.
  int64_t total = 0;
  absl::Status refusal;
  for (int i = 0; i < req.transfers_size(); ++i) {
    const v1::DeviceTransferRequest& t = req.transfers(i);
    const std::string prefix = absl::StrCat("transfers[", i, "]: ");
    const bool fits = t.upload() ? IsJobInput(job, t.kind()) : IsJobOutput(job, t.kind());
    if (!fits) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "kind = ", v1::TensorKind_Name(t.kind()), " with upload = ", t.upload(),
          " is not ", t.upload() ? "an input" : "an output", " of ", v1::JobKind_Name(job),
          job == v1::JOB_FORWARD ? " (inputs Q, K, V; outputs O, LSE)"
                                 : " (input dO; outputs dQ, dK, dV)"));
    }
    int64_t bytes = 0;
    const absl::Status st = Prefixed(ValidateDeviceTransfer(s, t, this_host, &bytes), prefix);
    if (st.code() == absl::StatusCode::kFailedPrecondition) {
      if (refusal.ok()) refusal = st;
    } else {
      RETURN_IF_ERROR(st);
    }
    total += bytes;
  }
  RETURN_IF_ERROR(refusal);
  *bytes_out = total;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> BindDeviceTensors(WorkerSession* s,
                                          const v1::BindDeviceTensorsRequest& req) {
  if (!ThisHost().ok()) return ThisHost().status();
  int64_t total = 0;
  RETURN_IF_ERROR(ValidateBinding(*s, req, *ThisHost(), &total));
  // Every handle opened (and its range checked) now, so a job never meets a bad one.
  for (int i = 0; i < req.transfers_size(); ++i) {
    const v1::DeviceTensorRef& t = req.transfers(i).tensor();
    ASSIGN_OR_RETURN(CudaIpcImporter * importer, Importer(s));
    RETURN_IF_ERROR(Prefixed(
        importer->Map(t.cuda_ipc_handle(), t.offset(), SpanBytes(t)).status(),
        absl::StrCat("transfers[", i, "]: ")));
  }
  std::vector<v1::DeviceTransferRequest>& bound = *BoundOf(s, req.job());
  bound.assign(req.transfers().begin(), req.transfers().end());
  for (v1::DeviceTransferRequest& t : bound) {
    t.clear_session_id();
    t.clear_client_id();
  }
  return total;
}

absl::Status RunBoundTransfers(WorkerSession* s, v1::JobKind job, bool inputs,
                               BoundTransferStats* stats) {
  std::vector<v1::DeviceTransferRequest>* bound = BoundOf(s, job);
  if (bound == nullptr) return absl::OkStatus();
  const absl::Time start = absl::Now();
  int n = 0;
  for (const v1::DeviceTransferRequest& req : *bound) {
    if (req.upload() != inputs) continue;
    ASSIGN_OR_RETURN(const int64_t bytes, EnqueueDeviceTransfer(s, req));
    stats->bytes += bytes;
    ++n;
  }
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(s->backend->Synchronize(s->io_stream.get()));
  if (inputs) {
    for (const v1::DeviceTransferRequest& req : *bound) {
      if (req.upload()) MarkUploaded(s, req);
    }
  }
  stats->seconds += absl::ToDoubleSeconds(absl::Now() - start);
  return absl::OkStatus();
}

}  // namespace dfa
