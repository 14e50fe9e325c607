#include "coordinator/session_manager.h"

#include <algorithm>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "core/grpc_status.h"
#include "core/log.h"
#include "core/random_id.h"
#include "core/session_capability.h"
#include "coordinator/session_memory.h"
#include "coordinator/session_plan.h"
#include "core/spec_validation.h"

namespace dfa {
namespace {

constexpr size_t kMaxTombstones = 100000;
constexpr int kMaxWorkersPerSession = 4096;

// Runs fn(i) for i in [0, n) on n threads and waits for all.
template <typename Fn>
void ParallelFor(int n, Fn fn) {
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int i = 0; i < n; ++i) threads.emplace_back([&fn, i] { fn(i); });
  for (std::thread& t : threads) t.join();
}

std::string WorkerName(const SessionShard& s) {
  return absl::StrCat("worker ", s.worker_id, " (", s.address, ")");
}

}  // namespace

absl::Status CheckSessionAccess(absl::string_view session_id, const std::string& owner_client_id,
                                const std::string& owner_capability, const std::string& client_id,
                                const std::string& capability) {
  RETURN_IF_ERROR(VerifyCapability(owner_capability, capability, session_id));
  if (owner_client_id != client_id) {
    return absl::PermissionDeniedError(
        absl::StrCat("client_id: session ", session_id, " belongs to another client"));
  }
  return absl::OkStatus();
}

SessionManager::SessionManager(const CoordinatorOptions& options, WorkerRegistry* registry,
                               WorkerStubs* stubs)
    : options_(options), registry_(registry), stubs_(stubs) {}

int64_t SessionManager::ReservedLocked(const std::string& worker_id) const {
  int64_t total = 0;
  for (const auto& [id, e] : sessions_) {
    if (e.lost) continue;
    for (const SessionShard& s : e.info->shards) {
      if (s.worker_id == worker_id) total += s.bytes;
    }
  }
  return total;
}

absl::StatusOr<std::vector<RegisteredWorker>> SessionManager::Place(
    const v1::CreateSessionRequest& request) {
  std::vector<RegisteredWorker> live = registry_->Snapshot();
  if (live.empty()) return absl::UnavailableError("no live workers are registered");
  const int requested = request.num_workers();
  absl::Status why = absl::OkStatus();
  // GPU workers first: a session lives on workers of one backend (one transport).
  for (const char* backend : {"cuda", "cpu"}) {
    std::vector<RegisteredWorker> group;
    for (const RegisteredWorker& w : live) {
      if (w.info.backend() == backend) group.push_back(w);
    }
    if (group.empty()) continue;
    absl::Status fits = ValidateSpecForPlacement(request.spec(), backend, 1);
    if (fits.ok() && requested > static_cast<int>(group.size())) {
      fits = absl::ResourceExhaustedError(
          absl::StrCat("num_workers: ", requested, " requested but only ", group.size(), " live ",
                       backend, " workers are registered"));
    }
    if (!fits.ok()) {
      if (why.ok()) why = fits;
      continue;
    }
    auto free_bytes = [&](const RegisteredWorker& w) {
      const int64_t limit = w.info.memory_limit_bytes();
      return limit == 0 ? std::numeric_limits<int64_t>::max()
                        : limit - ReservedLocked(w.info.worker_id());
    };
    std::stable_sort(group.begin(), group.end(),
                     [&](const RegisteredWorker& a, const RegisteredWorker& b) {
                       return free_bytes(a) > free_bytes(b);
                     });
    // One worker per GPU: NCCL refuses two ranks of one communicator on one device.
    std::vector<RegisteredWorker> distinct;
    std::vector<std::string> shared;  // "worker (uuid)" of the workers left out
    for (RegisteredWorker& w : group) {
      const std::string& uuid = w.info.device_uuid();
      const bool taken = !uuid.empty() && std::any_of(distinct.begin(), distinct.end(),
                                                      [&](const RegisteredWorker& d) {
                                                        return d.info.device_uuid() == uuid;
                                                      });
      if (taken) {
        shared.push_back(absl::StrCat(w.info.worker_id(), " (", uuid, ")"));
      } else {
        distinct.push_back(std::move(w));
      }
    }
    if (requested > static_cast<int>(distinct.size())) {
      if (why.ok()) {
        why = absl::ResourceExhaustedError(absl::StrCat(
            "num_workers: ", requested, " requested but the ", group.size(), " live ", backend,
            " workers run on ", distinct.size(), " distinct GPUs (on a GPU of another worker: ",
            absl::StrJoin(shared, ", "), "; every worker of a session needs a device of its own, "
            "as NCCL refuses two ranks of one communicator on one GPU)"));
      }
      continue;
    }
    if (requested > 0) distinct.resize(requested);
    return distinct;
  }
  return why;
}

absl::StatusOr<v1::CreateSessionResponse> SessionManager::Create(
    const v1::CreateSessionRequest& request) {
  const CoordinatorLimits& limits = options_.limits;
  RETURN_IF_ERROR(ValidateSpec(request.spec(), limits));
  RETURN_IF_ERROR(ValidateSchedule(request.schedule()));
  if (request.num_workers() < 0 || request.num_workers() > kMaxWorkersPerSession) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_workers: must be in [0, ", kMaxWorkersPerSession, "], got ", request.num_workers()));
  }
  if (request.ttl_seconds() < 0 || request.ttl_seconds() > limits.max_ttl_seconds) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ttl_seconds: must be in [0, ", limits.max_ttl_seconds, "], got ", request.ttl_seconds()));
  }
  if (static_cast<int>(request.client_id().size()) > limits.max_client_id_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("client_id: longer than ", limits.max_client_id_len, " bytes"));
  }

  // Sizes near the limits would overflow 64-bit byte counts: refuse what no worker can hold.
  constexpr double kMaxSessionBytes = 1e17;
  if (const double estimate = SessionBytesEstimate(request.spec()); estimate > kMaxSessionBytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "memory: the session would hold about %.3g bytes, more than any cluster can", estimate));
  }

  std::vector<RegisteredWorker> placed;
  {
    absl::MutexLock lock(&mu_);
    if (static_cast<int>(sessions_.size()) >= limits.max_sessions) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "sessions: the coordinator holds its limit of ", limits.max_sessions, " sessions"));
    }
    ASSIGN_OR_RETURN(placed, Place(request));
  }
  const int n = static_cast<int>(placed.size());
  const std::string backend = placed[0].info.backend();
  RETURN_IF_ERROR(ValidateSpecForPlacement(request.spec(), backend, n));

  std::vector<double> speeds;
  for (const RegisteredWorker& w : placed) speeds.push_back(w.info.speed());
  auto info = std::make_shared<SessionInfo>();
  ASSIGN_OR_RETURN(SessionPlan planned,
                   MakeSessionPlan(request.spec(), request.schedule(), speeds, backend));
  info->plan = std::move(planned.plan);
  if (info->plan.workers_size() != n || static_cast<int>(planned.bytes_per_rank.size()) != n) {
    return absl::InternalError(absl::StrCat("planner returned ", info->plan.workers_size(),
                                            " worker plans for ", n, " workers"));
  }
  info->session_id = RandomId("s-");
  info->client_id = request.client_id();
  info->lease_id = request.lease_id();
  info->capability = NewCapability();
  info->spec = request.spec();
  info->transport = backend == "cuda" ? "nccl" : "ucx";
  for (int r = 0; r < n; ++r) {
    SessionShard s;
    s.rank = r;
    s.worker_id = placed[r].info.worker_id();
    s.address = placed[r].info.address();
    s.host = placed[r].info.host();
    s.incarnation = placed[r].incarnation;
    s.bytes = planned.bytes_per_rank[r];
    info->shards.push_back(std::move(s));
  }

  {  // Admission: reserve on every worker, atomically with respect to other sessions.
    absl::MutexLock lock(&mu_);
    for (const SessionShard& s : info->shards) {
      std::optional<RegisteredWorker> w = registry_->Get(s.worker_id);
      if (!w || w->incarnation != s.incarnation) {
        return absl::UnavailableError(
            absl::StrCat(WorkerName(s), " left the cluster during placement; retry"));
      }
      const int64_t limit = w->info.memory_limit_bytes();
      const int64_t free_bytes = limit - ReservedLocked(s.worker_id);
      if (limit > 0 && s.bytes > free_bytes) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "memory: the session needs ", s.bytes, " bytes on ", WorkerName(s), " (rank ", s.rank,
            ") but only ", std::max<int64_t>(free_bytes, 0), " of its ", limit,
            " bytes are free; use fewer tokens, a smaller batch or more workers"));
      }
    }
    Entry entry;
    entry.info = info;
    entry.ttl =
        request.ttl_seconds() > 0 ? absl::Seconds(request.ttl_seconds()) : options_.session_ttl;
    entry.last_active = absl::Now();
    sessions_.emplace(info->session_id, std::move(entry));
  }

  std::vector<int64_t> worker_bytes;
  absl::Status opened = OpenOnWorkers(info.get(), &worker_bytes);
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(info->session_id);
    if (opened.ok() && it->second.lost) opened = absl::UnavailableError(it->second.lost_reason);
    if (!opened.ok()) {
      sessions_.erase(it);
    } else {
      // A worker that reserved more than estimated is accounted at its own figure.
      for (SessionShard& shard : info->shards) {
        shard.bytes = std::max(shard.bytes, worker_bytes[shard.rank]);
      }
      it->second.open = true;
      it->second.last_active = absl::Now();
    }
  }
  if (!opened.ok()) {
    CloseOnWorkers(*info, std::vector<bool>(n, true));
    return opened;
  }

  v1::CreateSessionResponse response;
  response.set_session_id(info->session_id);
  response.set_session_capability(info->capability);
  int64_t most = 0;
  for (const SessionShard& s : info->shards) {
    v1::ShardPlacement* p = response.add_shards();
    p->set_rank(s.rank);
    p->set_worker_id(s.worker_id);
    p->set_address(s.address);
    p->set_host(s.host);
    *p->mutable_owned() = info->plan.workers(s.rank).owned();
    {
      // The heads this shard holds (all unless the plan splits heads: schedule "heads").
      const v1::WorkerPlan& wp = info->plan.workers(s.rank);
      const int kv = info->spec.kv_heads();
      const int group = kv > 0 ? info->spec.q_heads() / kv : 1;
      int kb = 0, ke = kv;
      if (wp.has_kv_heads() && wp.kv_heads().end() > wp.kv_heads().begin()) {
        kb = wp.kv_heads().begin();
        ke = wp.kv_heads().end();
      }
      p->mutable_kv_heads()->set_begin(kb);
      p->mutable_kv_heads()->set_end(ke);
      p->mutable_q_heads()->set_begin(kb * group);
      p->mutable_q_heads()->set_end(ke * group);
    }
    most = std::max(most, s.bytes);
  }
  *response.mutable_plan() = info->plan;
  response.set_bytes_per_worker(most);
  {
    std::string workers;
    for (const SessionShard& s : info->shards) {
      absl::StrAppend(&workers, workers.empty() ? "" : ",", s.worker_id);
    }
    const v1::AttentionSpec& sp = info->spec;
    DFA_LOG(INFO) << "session " << info->session_id << " created for client "
                  << (info->client_id.empty() ? "(unnamed)" : info->client_id) << ": B="
                  << sp.batch() << " S=" << sp.seq_len() << " Hq=" << sp.q_heads()
                  << " Hkv=" << sp.kv_heads() << " D=" << sp.head_dim() << " "
                  << v1::DType_Name(sp.dtype()) << (sp.causal() ? " causal" : " full")
                  << ", schedule " << info->plan.schedule() << ", " << n << " workers ["
                  << workers << "] over " << info->transport << ", up to " << most
                  << " bytes per worker";
  }
  return response;
}

absl::Status SessionManager::OpenOnWorkers(SessionInfo* info, std::vector<int64_t>* worker_bytes) {
  const int n = static_cast<int>(info->shards.size());
  std::vector<int64_t>& reserved_by_worker = *worker_bytes;
  reserved_by_worker.assign(n, 0);
  info->transport_addresses.assign(n, "");
  std::vector<absl::Status> results(n);
  std::string nccl_id;
  auto open = [&](int r) {
    const SessionShard& s = info->shards[r];
    v1::OpenSessionRequest req;
    req.set_session_id(info->session_id);
    *req.mutable_spec() = info->spec;
    req.set_rank(r);
    for (const SessionShard& p : info->shards) {
      v1::PeerInfo* peer = req.add_peers();
      peer->set_rank(p.rank);
      peer->set_worker_id(p.worker_id);
      peer->set_address(p.address);
      peer->set_host(p.host);
    }
    *req.mutable_plan() = info->plan;
    req.set_transport(info->transport);
    req.set_nccl_unique_id(nccl_id);
    req.set_client_id(info->client_id);
    req.set_session_capability(info->capability);
    v1::OpenSessionResponse resp;
    auto ctx = ContextWithTimeout(options_.rpc_timeout);
    results[r] = FromGrpcStatus(stubs_->Get(s.address)->OpenSession(ctx.get(), req, &resp),
                                absl::StrCat(WorkerName(s), " OpenSession"));
    if (results[r].ok()) {
      info->transport_addresses[r] = resp.transport_address();
      reserved_by_worker[r] = resp.bytes_reserved();
    }
  };
  // NCCL: rank 0 creates the group's unique id and returns it as its transport address; the
  // other ranks receive it in nccl_unique_id. UCX: all ranks open at once.
  int first = 0;
  if (info->transport == "nccl") {
    open(0);
    if (!results[0].ok()) return results[0];
    nccl_id = info->transport_addresses[0];
    first = 1;
  }
  ParallelFor(n - first, [&](int i) { open(first + i); });
  for (int r = 0; r < n; ++r) {
    if (results[r].ok()) continue;
    std::vector<bool> opened(n);
    for (int k = 0; k < n; ++k) opened[k] = results[k].ok();
    CloseOnWorkers(*info, opened);
    return results[r];
  }
  return absl::OkStatus();
}

void SessionManager::CloseOnWorkers(const SessionInfo& info, const std::vector<bool>& opened) {
  const int n = static_cast<int>(info.shards.size());
  ParallelFor(n, [&](int r) {
    if (!opened[r]) return;
    v1::CloseSessionRequest req;
    req.set_session_id(info.session_id);
    v1::CloseSessionResponse resp;
    auto ctx = ContextWithTimeout(options_.rpc_timeout);
    AttachCapability(ctx.get(), info.capability);
    // Best effort: a lost worker has dropped the session with its memory anyway.
    (void)stubs_->Get(info.shards[r].address)->CloseSession(ctx.get(), req, &resp);
  });
}

absl::StatusOr<std::shared_ptr<const SessionInfo>> SessionManager::Use(
    const std::string& session_id, const std::string& client_id, const std::string& capability) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end() || !it->second.open) {
    if (released_.count(session_id)) {
      return absl::NotFoundError(absl::StrCat("session_id: ", session_id, " was released"));
    }
    return absl::NotFoundError(absl::StrCat("session_id: unknown session ", session_id));
  }
  Entry& e = it->second;
  RETURN_IF_ERROR(CheckSessionAccess(session_id, e.info->client_id, e.info->capability, client_id,
                                     capability));
  if (e.lost) return absl::UnavailableError(e.lost_reason);
  e.last_active = absl::Now();
  return std::shared_ptr<const SessionInfo>(e.info);
}

absl::Status SessionManager::CheckOwner(const std::string& session_id, const std::string& client_id,
                                        const std::string& capability, bool* released_already) {
  absl::MutexLock lock(&mu_);
  *released_already = false;
  auto it = sessions_.find(session_id);
  if (it != sessions_.end() && it->second.open) {
    const SessionInfo& info = *it->second.info;
    return CheckSessionAccess(session_id, info.client_id, info.capability, client_id, capability);
  }
  if (auto r = released_.find(session_id); r != released_.end()) {
    RETURN_IF_ERROR(CheckSessionAccess(session_id, r->second.client_id, r->second.capability,
                                       client_id, capability));
    *released_already = true;
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat("session_id: unknown session ", session_id));
}

void SessionManager::Tombstone(const SessionInfo& info) {
  const std::string& session_id = info.session_id;
  released_[session_id] = Released{info.client_id, info.capability};
  released_order_.push_back(session_id);
  while (released_order_.size() > kMaxTombstones) {
    released_.erase(released_order_.front());
    released_order_.pop_front();
  }
}

std::string SessionManager::Remove(const std::string& session_id) {
  std::shared_ptr<SessionInfo> info;
  bool close = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end() || !it->second.open) return "";
    info = it->second.info;
    close = !it->second.lost;  // a lost session was closed on its survivors already
    Tombstone(*info);
    sessions_.erase(it);
  }
  if (close) CloseOnWorkers(*info, std::vector<bool>(info->shards.size(), true));
  return info->lease_id;
}

void SessionManager::Touch(const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it != sessions_.end()) it->second.last_active = absl::Now();
}

std::vector<std::string> SessionManager::Expired(absl::Time now) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [id, e] : sessions_) {
    if (e.open && now - e.last_active > e.ttl) out.push_back(id);
  }
  return out;
}

void SessionManager::OnWorkerLost(const std::string& worker_id, uint64_t below_incarnation,
                                  absl::string_view reason) {
  std::vector<std::pair<std::shared_ptr<SessionInfo>, std::vector<bool>>> to_close;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, e] : sessions_) {
      if (e.lost) continue;
      std::vector<bool> survivors(e.info->shards.size(), true);
      bool hit = false;
      for (const SessionShard& s : e.info->shards) {
        if (s.worker_id == worker_id && s.incarnation < below_incarnation) {
          hit = true;
          survivors[s.rank] = false;
        }
      }
      if (!hit) continue;
      e.lost = true;
      e.lost_reason = absl::StrCat("session ", id, ": worker ", worker_id, " ", reason,
                                   "; create a new session");
      DFA_LOG(WARNING) << "session " << id << " lost: worker " << worker_id << " " << reason;
      if (e.open) to_close.emplace_back(e.info, std::move(survivors));
    }
  }
  for (auto& [info, survivors] : to_close) CloseOnWorkers(*info, survivors);
}

int SessionManager::count() {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(sessions_.size());
}

int64_t SessionManager::ReservedBytes(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  return ReservedLocked(worker_id);
}

int64_t SessionManager::TotalReservedBytes() {
  absl::MutexLock lock(&mu_);
  int64_t total = 0;
  for (const auto& [id, e] : sessions_) {
    if (e.lost) continue;
    for (const SessionShard& s : e.info->shards) total += s.bytes;
  }
  return total;
}

}  // namespace dfa
