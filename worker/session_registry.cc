#include "worker/session_registry.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "absl/strings/str_cat.h"
#include "coordinator/planner/plan_checker.h"
#include "coordinator/planner/plan_proto.h"
#include "worker/cancellable_backend.h"

namespace dfa {
namespace {

constexpr int kMaxIdLength = 256;
constexpr int64_t kMaxSeqLen = int64_t{1} << 40;
constexpr int kMaxHeads = 1 << 16;
constexpr int kMaxBatch = 1 << 20;

// The spec's per-token shape cut to the key/value heads `kv` (with their query groups).
SessionShape LocalShapeOf(const v1::AttentionSpec& spec, const HeadRange& kv) {
  SessionShape s;
  s.batch = spec.batch();
  s.kv_heads = kv.size();
  s.q_heads = kv.size() * (spec.q_heads() / spec.kv_heads());
  s.head_dim = spec.head_dim();
  s.dtype = static_cast<DType>(spec.dtype());
  return s;
}

// Frees the session's memory back to the budget once the last user lets go.
struct SessionDeleter {
  MemoryBudget* budget;
  void operator()(WorkerSession* s) const {
    const int64_t bytes = s->bytes_reserved;
    delete s;
    budget->Release(bytes);
  }
};

}  // namespace

double DefaultCancelPieceFlops() {
  return CancellableBackend::kFlopsPerThreadPiece *
         std::max(1u, std::thread::hardware_concurrency());
}

absl::Status ValidateSpec(const v1::AttentionSpec& spec) {
  if (spec.batch() < 1 || spec.batch() > kMaxBatch) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.batch = ", spec.batch(), " must be in [1, ", kMaxBatch, "]"));
  }
  if (spec.q_heads() < 1 || spec.q_heads() > kMaxHeads) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.q_heads = ", spec.q_heads(), " must be in [1, ", kMaxHeads, "]"));
  }
  if (spec.kv_heads() < 1 || spec.kv_heads() > spec.q_heads()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.kv_heads = ", spec.kv_heads(),
                                                   " must be in [1, q_heads = ", spec.q_heads(),
                                                   "]"));
  }
  if (spec.q_heads() % spec.kv_heads() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("spec.q_heads = ", spec.q_heads(),
                                                   " is not a multiple of spec.kv_heads = ",
                                                   spec.kv_heads()));
  }
  if (spec.head_dim() < 1 || spec.head_dim() > 512) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.head_dim = ", spec.head_dim(), " must be in [1, 512]"));
  }
  if (spec.seq_len() < 1 || spec.seq_len() > kMaxSeqLen) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.seq_len = ", spec.seq_len(), " must be in [1, ", kMaxSeqLen, "]"));
  }
  if (spec.dtype() != v1::DTYPE_F32 && spec.dtype() != v1::DTYPE_BF16 &&
      spec.dtype() != v1::DTYPE_F16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.dtype = ", static_cast<int>(spec.dtype()), " is not one of F32, BF16, F16"));
  }
  if (!std::isfinite(spec.softmax_scale()) || spec.softmax_scale() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.softmax_scale = ", spec.softmax_scale(), " must be finite and >= 0"));
  }
  return absl::OkStatus();
}

SessionRegistry::~SessionRegistry() { CloseAll(); }

absl::StatusOr<v1::OpenSessionResponse> SessionRegistry::Open(
    const v1::OpenSessionRequest& req) {
  if (req.session_id().empty() || req.session_id().size() > kMaxIdLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("session_id must have 1 to ", kMaxIdLength, " characters"));
  }
  RETURN_IF_ERROR(ValidateSpec(req.spec()));
  const int workers = req.plan().workers_size();
  if (workers < 1) return absl::InvalidArgumentError("plan.workers is empty");
  if (req.rank() < 0 || req.rank() >= workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank = ", req.rank(), " is outside [0, ", workers, ") (plan.workers)"));
  }
  if (req.peers_size() != 0 && req.peers_size() != workers) {
    return absl::InvalidArgumentError(absl::StrCat("peers has ", req.peers_size(),
                                                   " entries; plan.workers has ", workers));
  }
  if (req.plan().seq_len() != req.spec().seq_len()) {
    return absl::InvalidArgumentError(absl::StrCat("plan.seq_len = ", req.plan().seq_len(),
                                                   " differs from spec.seq_len = ",
                                                   req.spec().seq_len()));
  }
  if (req.plan().causal() != req.spec().causal()) {
    return absl::InvalidArgumentError("plan.causal differs from spec.causal");
  }
  auto plan = PlanFromProto(req.plan());
  if (!plan.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("plan: ", plan.status().message()));
  }
  CheckOptions check;
  check.shape.batch = req.spec().batch();
  check.shape.q_heads = req.spec().q_heads();
  check.shape.kv_heads = req.spec().kv_heads();
  check.shape.head_dim = req.spec().head_dim();
  check.shape.dtype = static_cast<DType>(req.spec().dtype());
  auto report = CheckPlan(*plan, check);
  if (!report.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("plan: ", report.status().message()));
  }
  const WorkerPlan& mine = plan->workers[req.rank()];
  const std::vector<RowRange>& owned = mine.owned;
  int64_t rows = 0;
  for (const RowRange& r : owned) rows += r.size();
  const HeadRange kv_heads = WorkerKvHeads(mine, req.spec().kv_heads());
  if (kv_heads.begin < 0 || kv_heads.end > req.spec().kv_heads()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan.workers[", req.rank(), "].kv_heads = [", kv_heads.begin, ", ", kv_heads.end,
        ") is outside [0, spec.kv_heads = ", req.spec().kv_heads(), ")"));
  }
  // This worker's storage holds its heads only (a head-split plan: schedule "heads").
  const SessionShape shape = LocalShapeOf(req.spec(), kv_heads);
  // In double first: a huge spec must be refused, not overflow.
  const double approx = static_cast<double>(SessionStorageBytes(shape, 1)) * rows;
  if (approx > 9.0e18) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session needs about ", approx, " bytes on this worker"));
  }
  const int64_t scratch = std::max(report->peak_forward_bytes[req.rank()],
                                   report->peak_backward_bytes[req.rank()]);
  const int64_t bytes = SessionStorageBytes(shape, rows) + scratch;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (sessions_.count(req.session_id())) {
      return absl::AlreadyExistsError(
          absl::StrCat("session_id = ", req.session_id(), " is already open on this worker"));
    }
  }
  RETURN_IF_ERROR(budget_->Reserve(bytes));
  std::shared_ptr<WorkerSession> s(new WorkerSession, SessionDeleter{budget_});
  s->bytes_reserved = bytes;  // released by the deleter from here on
  s->id = req.session_id();
  s->client_id = req.client_id();
  s->spec = req.spec();
  s->rank = req.rank();
  s->plan = *std::move(plan);
  const int group = req.spec().q_heads() / req.spec().kv_heads();
  s->kv_heads = kv_heads;
  s->q_heads = HeadRange{kv_heads.begin * group, kv_heads.end * group};
  ASSIGN_OR_RETURN(s->backend, make_backend_());
  if (backend_name_ == "cpu" && cancel_piece_flops_ > 0) {
    // A CPU step computes for seconds: cut units so a cancel lands within ~0.2 s.
    s->backend = std::make_unique<CancellableBackend>(std::move(s->backend), &s->cancel,
                                                      cancel_piece_flops_);
  }
  ASSIGN_OR_RETURN(s->storage, SessionStorage::Create(s->backend.get(), shape, owned));
  ASSIGN_OR_RETURN(s->transport, CreateSessionTransport(backend_name_, req, cuda_device_));
  const int64_t pairs = int64_t{shape.batch} * rows;
  for (RowCoverage* c : {&s->q_rows, &s->k_rows, &s->v_rows, &s->dout_rows}) c->Reset(pairs);

  v1::OpenSessionResponse resp;
  resp.set_bytes_reserved(bytes);
  resp.set_transport_address(s->transport->address());
  std::lock_guard<std::mutex> l(mu_);
  if (!sessions_.emplace(req.session_id(), std::move(s)).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("session_id = ", req.session_id(), " is already open on this worker"));
  }
  return resp;
}

absl::StatusOr<std::shared_ptr<WorkerSession>> SessionRegistry::Find(
    const std::string& id, const std::string& client_id, bool check_client) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("session_id = '", id, "' is not open on this worker"));
  }
  if (check_client && it->second->client_id != client_id) {
    return absl::PermissionDeniedError(absl::StrCat(
        "session_id = '", id, "' belongs to another client (client_id = '", client_id, "')"));
  }
  return it->second;
}

absl::Status SessionRegistry::Close(const std::string& id) {
  std::shared_ptr<WorkerSession> s;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) {
      return absl::NotFoundError(
          absl::StrCat("session_id = '", id, "' is not open on this worker"));
    }
    s = std::move(it->second);
    sessions_.erase(it);
  }
  s->cancel = true;
  s->transport->Abort();
  return absl::OkStatus();
}

void SessionRegistry::CloseAll() {
  std::map<std::string, std::shared_ptr<WorkerSession>> all;
  {
    std::lock_guard<std::mutex> l(mu_);
    all.swap(sessions_);
  }
  for (auto& [id, s] : all) {
    s->cancel = true;
    s->transport->Abort();
  }
}

int SessionRegistry::count() const {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<int>(sessions_.size());
}

}  // namespace dfa
