#include "client/nccl_tensor_io.h"

#include <cuda_runtime_api.h>

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/grpc_util.h"
#include "client/shard_io.h"
#include "core/gpu/cuda_ipc.h"
#include "core/gpu/nccl_transport.h"
#include "core/session_capability.h"

namespace dfa::client {
namespace {

absl::Status CudaError(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

bool IsUploadKind(v1::TensorKind k) {
  return k == v1::TENSOR_Q || k == v1::TENSOR_K || k == v1::TENSOR_V || k == v1::TENSOR_DO;
}

std::string ShapeStr(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) absl::StrAppend(&s, i ? ", " : "", v[i]);
  return s + "]";
}

}  // namespace

DevicePath ChooseDevicePath(const v1::CreateSessionResponse& info, const std::string& this_host) {
  for (const v1::ShardPlacement& s : info.shards()) {
    if (s.host().empty() || s.host() != this_host) return DevicePath::kNccl;
  }
  return info.shards_size() > 0 ? DevicePath::kCudaIpc : DevicePath::kNccl;
}

absl::StatusOr<std::vector<PlannedClientTransfer>> PlanClientGroupTransfers(
    const v1::AttentionSpec& spec, const v1::CreateSessionResponse& info,
    const v1::JoinClientGroupResponse& group, v1::TensorKind kind, const DeviceTensor& t,
    bool upload, int timeout_ms, std::map<std::string, int64_t>* next_sequence) {
  if (kind < v1::TENSOR_Q || kind > v1::TENSOR_DV) {
    return absl::InvalidArgumentError(
        absl::StrCat("kind = ", static_cast<int>(kind), " is not a tensor kind"));
  }
  if (upload && !IsUploadKind(kind)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kind = ", v1::TensorKind_Name(kind), ": only Q, K, V and dO can be uploaded"));
  }
  if (t.data == nullptr) return absl::InvalidArgumentError("tensor.data is null");
  const bool lse = kind == v1::TENSOR_LSE;
  const int64_t heads = IsKvKind(kind) ? spec.kv_heads() : spec.q_heads();
  const std::vector<int64_t> want =
      lse ? std::vector<int64_t>{spec.batch(), heads, spec.seq_len()}
          : std::vector<int64_t>{spec.batch(), spec.seq_len(), heads, spec.head_dim()};
  if (t.shape != want) {
    return absl::InvalidArgumentError(absl::StrCat("tensor.shape = ", ShapeStr(t.shape), " for ",
                                                   v1::TensorKind_Name(kind), "; the session's is ",
                                                   ShapeStr(want)));
  }
  const DType want_dtype = lse ? DType::kF32 : static_cast<DType>(spec.dtype());
  if (t.dtype != want_dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor.dtype = ", std::string(DTypeName(t.dtype)), " for ", v1::TensorKind_Name(kind),
        "; expected ", std::string(DTypeName(want_dtype)), lse ? " (LSE is fp32)" : " (spec.dtype: the NCCL path sends the "
                                                        "session's elements as they are)"));
  }
  std::vector<int64_t> dense(want.size(), 1);
  for (int i = static_cast<int>(want.size()) - 2; i >= 0; --i) dense[i] = dense[i + 1] * want[i + 1];
  if (t.EffectiveStrides() != dense) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor.strides = ", ShapeStr(t.EffectiveStrides()), ": the NCCL path needs a dense ",
        "tensor (strides ", ShapeStr(dense), "); use .contiguous() or CUDA IPC"));
  }
  std::map<std::string, int> rank_of;
  for (const v1::ClientGroupMember& m : group.workers()) rank_of[m.worker_id()] = m.rank();
  const int64_t elem = DTypeSize(want_dtype);
  const v1::DType wire_dtype = lse ? v1::DTYPE_F32 : spec.dtype();
  std::vector<PlannedClientTransfer> out;
  std::map<std::string, int64_t> seq = *next_sequence;
  for (int i = 0; i < info.shards_size(); ++i) {
    const v1::ShardPlacement& shard = info.shards(i);
    const HeadSlice held = ShardHeads(shard, kind);
    if (!held.empty() && (held.begin != 0 || held.end != heads)) {
      return absl::UnimplementedError(absl::StrCat(
          "shard ", i, " (worker ", shard.worker_id(), ") holds heads [", held.begin, ", ",
          held.end, ") of ", heads, ": the NCCL path sends whole rows; use CUDA IPC or "
          "Upload/Download for head-split sessions"));
    }
    auto r = rank_of.find(shard.worker_id());
    if (r == rank_of.end()) {
      return absl::FailedPreconditionError(absl::StrCat("worker ", shard.worker_id(),
                                                        " is not in client group ",
                                                        group.group_id()));
    }
    for (const v1::RowRange& rows : shard.owned()) {
      const int64_t n = rows.end() - rows.begin();
      PlannedClientTransfer p;
      p.shard = i;
      p.group_rank = r->second;
      v1::ClientGroupTransferRequest& q = p.request;
      q.set_group_id(group.group_id());
      q.set_kind(kind);
      *q.mutable_rows() = rows;
      q.set_dtype(wire_dtype);
      q.set_upload(upload);
      q.set_timeout_ms(timeout_ms);
      q.set_sequence(seq[shard.worker_id()]++);
      int64_t total = 0;
      if (lse) {  // [B, H, S]: one piece per batch index and head
        for (int64_t b = 0; b < want[0]; ++b) {
          for (int64_t h = 0; h < heads; ++h) {
            p.pieces.push_back({((b * heads + h) * want[2] + rows.begin()) * elem, n * elem});
            total += n * elem;
          }
        }
      } else {  // [B, S, H, D]: one piece per batch index
        const int64_t row = heads * spec.head_dim() * elem;
        for (int64_t b = 0; b < want[0]; ++b) {
          p.pieces.push_back({(b * want[1] + rows.begin()) * row, n * row});
          total += n * row;
        }
      }
      q.set_byte_count(total);
      out.push_back(std::move(p));
    }
  }
  *next_sequence = std::move(seq);
  return out;
}

NcclTensorIo::NcclTensorIo(Client* client, Options options)
    : client_(client), options_(options) {}

NcclTensorIo::~NcclTensorIo() = default;

std::optional<v1::JoinClientGroupResponse> NcclTensorIo::group() {
  std::lock_guard<std::mutex> l(mu_);
  return group_;
}

void NcclTensorIo::DropGroup() {
  if (transport_) transport_->Abort();
  transport_.reset();
  group_.reset();
  next_sequence_.clear();
}

absl::Status NcclTensorIo::EnsureGroup(Session& session, int device) {
  if (group_ && transport_ && transport_->status().ok() && device == device_) {
    bool all = true;
    for (const v1::ShardPlacement& s : session.info().shards()) {
      bool found = false;
      for (const v1::ClientGroupMember& m : group_->workers()) found |= m.worker_id() == s.worker_id();
      all &= found;
    }
    if (all) return absl::OkStatus();
  }
  DropGroup();
  ASSIGN_OR_RETURN(std::string id, NewNcclUniqueId());
  v1::JoinClientGroupRequest req;
  req.set_session_id(session.id());
  req.set_client_id(client_->client_id());
  req.set_nccl_unique_id(id);
  req.set_init_timeout_ms(static_cast<int>(absl::ToInt64Milliseconds(options_.init_timeout)));
  req.set_client_device(device);
  v1::JoinClientGroupResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, client_->options().rpc_timeout);
  AttachCapability(&ctx, session.capability());
  RETURN_IF_ERROR(FromGrpc(client_->coordinator()->JoinClientGroup(&ctx, req, &resp),
                           "coordinator JoinClientGroup"));
  NcclTransportOptions o;
  o.device = device;
  o.rank = resp.client_rank();
  o.size = resp.size();
  o.unique_id = id;
  o.init_timeout = options_.init_timeout;
  absl::StatusOr<std::unique_ptr<NcclTransport>> t = NcclTransport::Create(o);
  if (!t.ok()) {
    return absl::Status(t.status().code(),
                        absl::StrCat("client group ", resp.group_id(), " (client rank ",
                                     resp.client_rank(), " of ", resp.size(),
                                     "): ", t.status().message()));
  }
  transport_ = *std::move(t);
  group_ = std::move(resp);
  device_ = device;
  ++groups_joined_;
  return absl::OkStatus();
}

absl::StatusOr<TransferStats> NcclTensorIo::Transfer(Session& session, v1::TensorKind kind,
                                                     const DeviceTensor& t, bool upload) {
  std::lock_guard<std::mutex> l(mu_);
  if (t.data == nullptr) return absl::InvalidArgumentError("tensor.data is null");
  cudaPointerAttributes attr;
  RETURN_IF_ERROR(CudaError(cudaPointerGetAttributes(&attr, t.data), "cudaPointerGetAttributes"));
  if (attr.type != cudaMemoryTypeDevice) {
    return absl::InvalidArgumentError(
        "tensor.data is not CUDA device memory (host tensors go through Session::Upload)");
  }
  const int timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(options_.transfer_timeout));
  // The tensor's own checks first, so a bad tensor never makes a group.
  {
    v1::JoinClientGroupResponse probe;
    for (const v1::ShardPlacement& s : session.info().shards()) {
      probe.add_workers()->set_worker_id(s.worker_id());
    }
    std::map<std::string, int64_t> seq;
    RETURN_IF_ERROR(PlanClientGroupTransfers(session.spec(), session.info(), probe, kind, t,
                                             upload, timeout_ms, &seq)
                        .status());
  }
  RETURN_IF_ERROR(EnsureGroup(session, attr.device));
  std::map<std::string, int64_t> seq = next_sequence_;
  ASSIGN_OR_RETURN(std::vector<PlannedClientTransfer> plan,
                   PlanClientGroupTransfers(session.spec(), session.info(), *group_, kind, t,
                                            upload, timeout_ms, &seq));
  if (upload) {
    RETURN_IF_ERROR(CudaError(cudaSetDevice(attr.device), "cudaSetDevice"));
    RETURN_IF_ERROR(CudaError(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
  }
  // The client's side: one NCCL group of every piece, in each worker's request order.
  std::vector<TransportMessage> msgs;
  for (const PlannedClientTransfer& p : plan) {
    for (const PlannedClientTransfer::Piece& piece : p.pieces) {
      msgs.push_back({p.group_rank, static_cast<uint8_t*>(t.data) + piece.offset,
                      static_cast<size_t>(piece.bytes)});
    }
  }
  const absl::Time start = absl::Now();
  const std::span<const TransportMessage> none;
  absl::StatusOr<std::unique_ptr<PendingGroup>> posted =
      upload ? transport_->Post(msgs, none, nullptr) : transport_->Post(none, msgs, nullptr);
  if (!posted.ok()) {
    DropGroup();
    return posted.status();
  }
  next_sequence_ = seq;  // posted: the workers expect these numbers next
  // The workers' side: one call per range, the workers in parallel.
  const int n = session.num_workers();
  for (int i = 0; i < n; ++i) session.DataClient(i);  // made here, not in the threads
  std::vector<absl::Status> results(static_cast<size_t>(n));
  std::vector<int64_t> bytes(static_cast<size_t>(n), 0);
  const std::string secret = group_->group_secret();
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      for (const PlannedClientTransfer& p : plan) {
        if (p.shard != i) continue;
        absl::StatusOr<int64_t> b = session.DataClient(i).ClientGroupTransfer(p.request, secret);
        if (!b.ok()) {
          results[static_cast<size_t>(i)] = b.status();
          return;
        }
        bytes[static_cast<size_t>(i)] += *b;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (const absl::Status& st : results) {
    if (!st.ok()) {
      posted->reset();
      DropGroup();  // the client's messages to that worker will never match: abort
      return st;
    }
  }
  absl::Status drained = transport_->Drain(options_.transfer_timeout);
  posted->reset();
  if (!drained.ok()) {
    const std::string gid = group_->group_id();
    DropGroup();
    return absl::Status(drained.code(), absl::StrCat("client group ", gid, ": ", drained.message()));
  }
  TransferStats stats;
  for (const int64_t b : bytes) stats.bytes += b;
  stats.chunks = static_cast<int64_t>(plan.size());
  stats.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return stats;
}

absl::StatusOr<TransferStats> NcclTensorIo::Upload(Session& session, v1::TensorKind kind,
                                                   const DeviceTensor& t) {
  return Transfer(session, kind, t, true);
}

absl::StatusOr<TransferStats> NcclTensorIo::Download(Session& session, v1::TensorKind kind,
                                                     const DeviceTensor& t) {
  return Transfer(session, kind, t, false);
}

absl::StatusOr<TransferStats> NcclTensorIo::UploadAuto(Session& session, v1::TensorKind kind,
                                                       const DeviceTensor& t) {
  if (ChooseDevicePath(session.info(), LocalHostName()) == DevicePath::kCudaIpc) {
    return UploadDevice(session, kind, t);
  }
  return Upload(session, kind, t);
}

absl::StatusOr<TransferStats> NcclTensorIo::DownloadAuto(Session& session, v1::TensorKind kind,
                                                         const DeviceTensor& t) {
  if (ChooseDevicePath(session.info(), LocalHostName()) == DevicePath::kCudaIpc) {
    return DownloadDevice(session, kind, t);
  }
  return Download(session, kind, t);
}

}  // namespace dfa::client
