#include "worker/session_registry.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/host_limits.h"
#include "core/planner/plan_checker.h"
#include "core/planner/plan_proto.h"
#include "core/session_capability.h"
#include "core/spec_validation.h"
#include "worker/cancellable_backend.h"

namespace dfa {
namespace {

constexpr int kMaxIdLength = 256;
// A worker takes any spec the coordinator's limits allow; these only keep byte counts in range.
constexpr SpecLimits kWorkerSpecLimits{/*max_seq_len=*/int64_t{1} << 40, /*max_batch=*/1 << 20,
                                       /*max_heads=*/1 << 16, /*max_head_dim=*/kMaxHeadDim,
                                       /*max_documents=*/int64_t{1} << 30};

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
  return CancellableBackend::kFlopsPerThreadPiece * UsableCpus();
}

SessionRegistry::~SessionRegistry() { CloseAll(); }

absl::StatusOr<v1::OpenSessionResponse> SessionRegistry::Open(
    const v1::OpenSessionRequest& req) {
  if (req.session_id().empty() || req.session_id().size() > kMaxIdLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("session_id must have 1 to ", kMaxIdLength, " characters"));
  }
  if (req.session_capability().size() > kMaxCapabilityLength) {
    return absl::InvalidArgumentError(absl::StrCat("session_capability: longer than ",
                                                   kMaxCapabilityLength, " characters"));
  }
  RETURN_IF_ERROR(ValidateSpec(req.spec(), kWorkerSpecLimits));
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
  // The plan's mask is the spec's (documents, window): checked and run under it.
  const MaskSpec mask_spec = MaskSpecOf(req.spec());
  plan->mask_spec = mask_spec;
  CheckOptions check;
  check.shape = ShapeOf(req.spec());
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
  const AttentionShape shape = LocalShape(check.shape, mine);
  // In double first: a huge spec must be refused, not overflow.
  const double approx = static_cast<double>(SessionStorageBytes(shape, 1)) * rows;
  if (approx > 9.0e18) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session needs about ", approx, " bytes on this worker"));
  }
  // What the session will peak at here (core/planner/worker_memory.h): the storage with the work
  // region its plan needs, the backward's key chunk, the executor's peak scratch.
  ASSIGN_OR_RETURN(const WorkerMemory memory,
                   PlanWorkerMemory(*plan, req.rank(), shape, *report, step_tokens_));
  // A masked spec's interval arrays (worker/session_mask.h) are part of it (WorkerMemory::mask).
  const int64_t bytes = memory.peak();
  {
    std::lock_guard<std::mutex> l(mu_);
    if (sessions_.count(req.session_id())) {
      return absl::AlreadyExistsError(
          absl::StrCat("session_id = ", req.session_id(), " is already open on this worker"));
    }
  }
  std::unique_ptr<SessionAdmission::Ticket> admitted;
  if (admission_ != nullptr) {
    ASSIGN_OR_RETURN(admitted, admission_->Admit(workers));
  }
  RETURN_IF_ERROR(budget_->Reserve(bytes));
  std::shared_ptr<WorkerSession> s(new WorkerSession, SessionDeleter{budget_});
  s->bytes_reserved = bytes;  // released by the deleter from here on
  s->admission = std::move(admitted);
  s->id = req.session_id();
  s->client_id = req.client_id();
  s->capability = req.session_capability();
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
  ASSIGN_OR_RETURN(s->compute_stream, OwnedStream::Create(s->backend.get()));
  ASSIGN_OR_RETURN(s->io_stream, OwnedStream::Create(s->backend.get()));
  s->step_tokens = step_tokens_;
  ASSIGN_OR_RETURN(s->storage,
                   SessionStorage::Create(s->backend.get(), shape, owned, memory.layout));
  ASSIGN_OR_RETURN(s->transport, CreateSessionTransport(backend_name_, req, cuda_device_));
  ASSIGN_OR_RETURN(s->mask, SessionMask::Create(s->backend.get(), mask_spec, shape.batch,
                                                 req.spec().seq_len()));
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

absl::StatusOr<std::shared_ptr<WorkerSession>> SessionRegistry::FindForClient(
    const std::string& id, const std::string& client_id, const std::string& capability) const {
  ASSIGN_OR_RETURN(std::shared_ptr<WorkerSession> s, Find(id, client_id, false));
  if (!s->capability.empty()) {
    RETURN_IF_ERROR(VerifyCapability(s->capability, capability, absl::StrCat("'", id, "'")));
  }
  if (s->client_id != client_id) {
    return absl::PermissionDeniedError(absl::StrCat(
        "session_id = '", id, "' belongs to another client (client_id = '", client_id, "')"));
  }
  return s;
}

absl::StatusOr<std::shared_ptr<WorkerSession>> SessionRegistry::FindForCoordinator(
    const std::string& id, const std::string& capability) const {
  ASSIGN_OR_RETURN(std::shared_ptr<WorkerSession> s, Find(id, "", false));
  if (!s->capability.empty()) {
    RETURN_IF_ERROR(VerifyCapability(s->capability, capability, absl::StrCat("'", id, "'")));
  }
  return s;
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
