#include "worker/client_groups.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/random_id.h"
#include "core/session_capability.h"
#include "worker/tensor_io.h"
#ifdef DFA_HAVE_NCCL
#include <cuda_runtime_api.h>

#include "core/gpu/cuda_status.h"
#include "core/gpu/nccl_transport.h"
#include "worker/transport/nccl_bootstrap.h"
#endif

namespace dfa {
namespace {

constexpr size_t kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES (core/gpu/nccl_transport.h)
constexpr int kMinInitTimeoutMs = 100;

using session_tensors::KindName;

using session_tensors::IsUploadKind;

int TimeoutMs(int ms) { return ms == 0 ? kDefaultClientGroupTimeoutMs : ms; }

}  // namespace

struct ClientGroups::Group {
  std::string id;
  std::string client_id;
  std::string secret;
  int rank = 0;
  int size = 0;
  absl::Duration ttl;
  std::mutex mu;                  // one transfer at a time
  absl::Time expires;             // guarded by ClientGroups::mu_
  int64_t next_sequence = 0;      // guarded by mu
#ifdef DFA_HAVE_NCCL
  std::unique_ptr<NcclBootstrap> bootstrap;
#endif
  int client_rank() const { return size - 1; }
  std::string Peer() const {
    return absl::StrCat("client rank ", client_rank(), " (client '", client_id, "') of group ", id);
  }
};

absl::Status ValidateJoinClientGroup(const v1::WorkerJoinClientGroupRequest& req) {
  if (req.group_id().empty() || req.group_id().size() > 128) {
    return absl::InvalidArgumentError(absl::StrCat("group_id has ", req.group_id().size(),
                                                   " characters; it must have 1 to 128"));
  }
  if (req.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "size = ", req.size(), ": a client group has at least one worker and the client"));
  }
  if (req.rank() < 0 || req.rank() >= req.size() - 1) {
    return absl::InvalidArgumentError(absl::StrCat("rank = ", req.rank(), " is not a worker rank ",
                                                   "of a group of size ", req.size(), " (0 to ",
                                                   req.size() - 2, "; the client is ",
                                                   req.size() - 1, ")"));
  }
  if (req.nccl_unique_id().size() != kUniqueIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("nccl_unique_id has ",
                                                   req.nccl_unique_id().size(),
                                                   " bytes; an NCCL unique id has 128"));
  }
  const int init = TimeoutMs(req.init_timeout_ms());
  if (init < kMinInitTimeoutMs || init > kMaxClientGroupTimeoutMs) {
    return absl::InvalidArgumentError(absl::StrCat("init_timeout_ms = ", req.init_timeout_ms(),
                                                   " must be in [", kMinInitTimeoutMs, ", ",
                                                   kMaxClientGroupTimeoutMs, "] (0: default)"));
  }
  if (req.group_secret().empty() || req.group_secret().size() > kMaxCapabilityLength) {
    return absl::InvalidArgumentError(absl::StrCat("group_secret has ", req.group_secret().size(),
                                                   " characters; it must have 1 to ",
                                                   kMaxCapabilityLength));
  }
  if (absl::FromUnixMillis(req.expires_unix_ms()) <= absl::Now()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expires_unix_ms = ", req.expires_unix_ms(), " is not in the future"));
  }
  return absl::OkStatus();
}

absl::Status ValidateClientGroupTransfer(const WorkerSession& s,
                                         const v1::ClientGroupTransferRequest& req,
                                         int64_t* local_row) {
  const v1::TensorKind kind = req.kind();
  RETURN_IF_ERROR(session_tensors::CheckKnownKind(kind));
  if (req.upload() && !IsUploadKind(kind)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kind = ", KindName(kind), ": only TENSOR_Q, TENSOR_K, TENSOR_V and TENSOR_DO can be "
        "uploaded (upload = true)"));
  }
  if (req.rows().begin() < 0 || req.rows().end() <= req.rows().begin()) {
    return absl::InvalidArgumentError(absl::StrCat("rows = [", req.rows().begin(), ", ",
                                                   req.rows().end(),
                                                   ") is empty or negative (it must be set)"));
  }
  ASSIGN_OR_RETURN(const std::vector<RowRange> pieces, ResolveRows(s, req.rows(), "rows"));
  const RowRange rows{req.rows().begin(), req.rows().end()};
  if (pieces.size() != 1 || pieces[0].begin != rows.begin || pieces[0].end != rows.end) {
    return absl::OutOfRangeError(absl::StrCat("rows = [", rows.begin, ", ", rows.end,
                                              ") is not inside one owned range of this worker's "
                                              "shard; send one request per range"));
  }
  int64_t local = 0;
  for (const RowRange& o : s.storage->owned()) {
    if (o.Contains(rows)) {
      local += rows.begin - o.begin;
      break;
    }
    local += o.size();
  }
  const bool lse = kind == v1::TENSOR_LSE;
  const v1::DType want = lse ? v1::DTYPE_F32 : s.spec.dtype();
  if (req.dtype() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dtype = ", v1::DType_Name(req.dtype()), " for ", KindName(kind), "; expected ",
        v1::DType_Name(want), lse ? " (LSE is fp32)" : " (spec.dtype)"));
  }
  const HeadRange heads = TransitHeads(s, kind);
  const int64_t elem = DTypeSize(static_cast<DType>(want));
  const int64_t bytes = lse ? int64_t{s.spec.batch()} * heads.size() * rows.size() * elem
                            : int64_t{s.spec.batch()} * rows.size() * heads.size() *
                                  s.spec.head_dim() * elem;
  if (req.byte_count() != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "byte_count = ", req.byte_count(), " differs from the ", bytes, " bytes of ",
        KindName(kind), " rows [", rows.begin, ", ", rows.end, ") (batch ", s.spec.batch(),
        ", heads [", heads.begin, ", ", heads.end, ")", lse ? "" : absl::StrCat(", head_dim ", s.spec.head_dim()),
        ", ", elem, "-byte elements)"));
  }
  if (req.timeout_ms() < 0 || req.timeout_ms() > kMaxClientGroupTimeoutMs) {
    return absl::InvalidArgumentError(absl::StrCat("timeout_ms = ", req.timeout_ms(),
                                                   " must be in [0, ", kMaxClientGroupTimeoutMs,
                                                   "] (0: default)"));
  }
  if (req.sequence() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence = ", req.sequence(), " must be >= 0"));
  }
  *local_row = local;
  return absl::OkStatus();
}

ClientGroups::~ClientGroups() = default;

int ClientGroups::count() {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(groups_.size());
}

void ClientGroups::DropExpiredLocked(absl::Time now,
                                     std::vector<std::shared_ptr<Group>>* dropped) {
  for (auto it = groups_.begin(); it != groups_.end();) {
    if (it->second->expires <= now) {
      dropped->push_back(std::move(it->second));
      it = groups_.erase(it);
    } else {
      ++it;
    }
  }
}

void ClientGroups::Forget(const std::string& id) {
  std::shared_ptr<Group> gone;  // destroyed outside the lock (it may join a bootstrap thread)
  absl::MutexLock lock(&mu_);
  auto it = groups_.find(id);
  if (it == groups_.end()) return;
  gone = std::move(it->second);
  groups_.erase(it);
}

absl::Status ClientGroups::Join(const WorkerSession& s,
                                const v1::WorkerJoinClientGroupRequest& req) {
  RETURN_IF_ERROR(ValidateJoinClientGroup(req));
  if (req.session_id() != s.id) {
    return absl::InvalidArgumentError(absl::StrCat("session_id = '", req.session_id(),
                                                   "' is not the session the call is about"));
  }
  if (req.client_id() != s.client_id) {
    return absl::PermissionDeniedError(absl::StrCat("client_id = '", req.client_id(),
                                                    "' does not own session ", s.id));
  }
  if (req.rank() != s.rank) {
    return absl::InvalidArgumentError(absl::StrCat("rank = ", req.rank(), " differs from this ",
                                                   "worker's rank ", s.rank, " in session ", s.id));
  }
  if (s.backend->Name() == "cpu") {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", s.id, ": this worker computes on the cpu backend (host memory): NCCL client "
        "groups need a cuda or cudnn worker; use Upload/Download"));
  }
#ifndef DFA_HAVE_NCCL
  return absl::FailedPreconditionError(
      "this worker was built without NCCL: client groups need a cuda worker built with NCCL");
#else
  std::shared_ptr<Group> g = NewGroup(req);
  std::vector<std::shared_ptr<Group>> dropped;  // destroyed after the lock is released
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckRoomLocked(g->id, &dropped));
  }
  cudaPointerAttributes attr;
  CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&attr, s.storage->q().data));
  ASSIGN_OR_RETURN(g->bootstrap,
                   NcclBootstrap::Start(attr.device, g->rank, g->size, req.nccl_unique_id(),
                                        absl::Milliseconds(TimeoutMs(req.init_timeout_ms()))));
  absl::Status room;
  {
    absl::MutexLock lock(&mu_);
    room = CheckRoomLocked(g->id, &dropped);
    if (room.ok()) groups_.emplace(g->id, g);
  }
  return room;  // a group not kept is destroyed here, outside the lock (it joins its thread)
#endif
}

absl::Status ClientGroups::Register(const v1::WorkerJoinClientGroupRequest& req) {
  RETURN_IF_ERROR(ValidateJoinClientGroup(req));
  std::shared_ptr<Group> g = NewGroup(req);
  std::vector<std::shared_ptr<Group>> dropped;  // destroyed after the lock is released
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckRoomLocked(g->id, &dropped));
  groups_.emplace(g->id, std::move(g));
  return absl::OkStatus();
}

std::shared_ptr<ClientGroups::Group> ClientGroups::NewGroup(
    const v1::WorkerJoinClientGroupRequest& req) {
  auto g = std::make_shared<Group>();
  g->id = req.group_id();
  g->client_id = req.client_id();
  g->secret = req.group_secret();
  g->rank = req.rank();
  g->size = req.size();
  g->expires = absl::FromUnixMillis(req.expires_unix_ms());
  g->ttl = g->expires - absl::Now();
  return g;
}

absl::Status ClientGroups::CheckRoomLocked(const std::string& id,
                                           std::vector<std::shared_ptr<Group>>* dropped) {
  DropExpiredLocked(absl::Now(), dropped);
  if (groups_.count(id)) {
    return absl::AlreadyExistsError(absl::StrCat("group_id = ", id, " is already known"));
  }
  if (static_cast<int>(groups_.size()) >= options_.max_groups) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this worker already serves ", groups_.size(), " client groups (the most it keeps)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<ClientGroups::Group>> ClientGroups::Find(
    const std::string& id, const std::string& client_id, const std::string& secret) {
  std::vector<std::shared_ptr<Group>> dropped;  // destroyed after the lock is released
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  DropExpiredLocked(now, &dropped);
  auto it = groups_.find(id);
  if (it == groups_.end()) {
    return absl::NotFoundError(absl::StrCat("group_id = '", id, "' is not a client group of this ",
                                            "worker (never joined, expired or failed: join a "
                                            "new one at the coordinator)"));
  }
  const Group& g = *it->second;
  if (!ConstantTimeEquals(g.secret, secret)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "group_id = ", id, ": missing or wrong ", kClientGroupSecretMetadata, " metadata"));
  }
  if (g.client_id != client_id) {
    return absl::PermissionDeniedError(absl::StrCat(
        "group_id = ", id, " belongs to another client than '", client_id, "'"));
  }
  it->second->expires = now + g.ttl;
  return it->second;
}

absl::StatusOr<int64_t> ClientGroups::NextSequence(const std::string& id,
                                                   const std::string& client_id,
                                                   const std::string& secret) {
  ASSIGN_OR_RETURN(std::shared_ptr<Group> g, Find(id, client_id, secret));
  std::lock_guard<std::mutex> l(g->mu);
  return g->next_sequence;
}

absl::StatusOr<int64_t> ClientGroups::Transfer(WorkerSession* s,
                                               const v1::ClientGroupTransferRequest& req,
                                               const std::string& secret) {
  int64_t local = 0;
  RETURN_IF_ERROR(ValidateClientGroupTransfer(*s, req, &local));
  ASSIGN_OR_RETURN(std::shared_ptr<Group> g, Find(req.group_id(), s->client_id, secret));
  std::lock_guard<std::mutex> gl(g->mu);
  if (req.sequence() != g->next_sequence) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sequence = ", req.sequence(), ": group ", g->id, " expects ", g->next_sequence,
        " next (number a group's transfers with one worker 0, 1, 2, ... in posting order)"));
  }
  if (s->backend->Name() == "cpu") {
    return absl::FailedPreconditionError(
        "this worker computes on the cpu backend: NCCL transfers need a cuda or cudnn worker");
  }
  const v1::TensorKind kind = req.kind();
  if (!req.upload()) RETURN_IF_ERROR(CheckReadable(*s, kind));
#ifndef DFA_HAVE_NCCL
  return absl::FailedPreconditionError("this worker was built without NCCL");
#else
  if (g->bootstrap == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(g->Peer(), " has no communicator"));
  }
  // The messages: one per batch index (LSE: per batch index and head), contiguous in storage.
  const RowRange rows{req.rows().begin(), req.rows().end()};
  const int64_t n = rows.size();
  const int peer = g->client_rank();
  std::vector<TransportMessage> msgs;
  if (kind == v1::TENSOR_LSE) {
    const RowStatView st = s->storage->lse();
    for (int b = 0; b < st.batch; ++b) {
      for (int h = 0; h < st.heads; ++h) {
        float* p = st.data + b * st.BatchStride() + h * st.HeadStride() + local;
        msgs.push_back({peer, p, static_cast<size_t>(n) * sizeof(float)});
      }
    }
  } else {
    const TensorView v = session_tensors::ViewOf(*s, kind).Slice(local, n);
    if (v.dtype != static_cast<DType>(s->spec.dtype()) ||
        v.RowStride() != int64_t{v.heads} * v.head_dim) {
      return absl::UnimplementedError(absl::StrCat(
          "kind = ", KindName(kind), ": this session's storage is not dense rows of the spec's "
          "dtype, which the NCCL path sends as they are; use DeviceTransfer or Upload/Download"));
    }
    const int64_t elem = DTypeSize(v.dtype);
    const size_t bytes = static_cast<size_t>(n * v.RowStride() * elem);
    for (int b = 0; b < v.batch; ++b) {
      msgs.push_back({peer, static_cast<uint8_t*>(v.data) + b * v.BatchStride() * elem, bytes});
    }
  }
  ++g->next_sequence;  // from here on both sides have posted (or the group fails)
  const absl::Duration timeout = absl::Milliseconds(TimeoutMs(req.timeout_ms()));
  auto fail = [&](const absl::Status& st) {
    Forget(g->id);
    return absl::Status(st.code(), absl::StrCat(g->Peer(), ": ", st.message(),
                                                " (the group is closed; join a new one)"));
  };
  absl::StatusOr<Transport*> t = g->bootstrap->Get(timeout);
  if (!t.ok()) return fail(t.status());
  if (!req.upload()) RETURN_IF_ERROR(s->backend->Synchronize(nullptr));
  const std::span<const TransportMessage> none;
  absl::StatusOr<std::unique_ptr<PendingGroup>> posted =
      req.upload() ? (*t)->Post(none, msgs, nullptr) : (*t)->Post(msgs, none, nullptr);
  if (!posted.ok()) return fail(posted.status());
  absl::Status drained = g->bootstrap->nccl()->Drain(timeout);
  posted->reset();
  if (!drained.ok()) return fail(drained);
  if (req.upload()) {
    RowCoverage* c = session_tensors::CoverageOf(s, kind);
    for (int b = 0; b < s->spec.batch(); ++b) c->Mark(b * s->storage->rows() + local, n);
    if (kind != v1::TENSOR_DO) s->forward_done = false;
    s->backward_done = false;
    s->rows_arrived.notify_all();  // a streaming job may wait for these rows
  }
  return req.byte_count();
#endif
}

}  // namespace dfa
