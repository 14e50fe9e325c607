#include "coordinator/client_groups.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/log.h"
#include "core/random_id.h"

namespace dfa {
namespace {

constexpr size_t kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
constexpr int kMinInitTimeoutMs = 100;
constexpr int kMaxInitTimeoutMs = 600000;
constexpr int kDefaultInitTimeoutMs = 60000;

}  // namespace

absl::Status ValidateJoinClientGroupRequest(const v1::JoinClientGroupRequest& req) {
  if (req.session_id().empty()) return absl::InvalidArgumentError("session_id must be set");
  if (req.nccl_unique_id().size() != kUniqueIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nccl_unique_id has ", req.nccl_unique_id().size(),
        " bytes; an NCCL unique id (ncclGetUniqueId) has 128"));
  }
  const int init = req.init_timeout_ms() == 0 ? kDefaultInitTimeoutMs : req.init_timeout_ms();
  if (init < kMinInitTimeoutMs || init > kMaxInitTimeoutMs) {
    return absl::InvalidArgumentError(absl::StrCat("init_timeout_ms = ", req.init_timeout_ms(),
                                                   " must be in [", kMinInitTimeoutMs, ", ",
                                                   kMaxInitTimeoutMs, "] (0: default ",
                                                   kDefaultInitTimeoutMs, ")"));
  }
  if (req.client_device() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("client_device = ", req.client_device(), " must be >= 0"));
  }
  return absl::OkStatus();
}

void ClientGroupBroker::DropExpiredLocked(absl::Time now) {
  for (auto it = groups_.begin(); it != groups_.end();) {
    it = it->second.expires <= now ? groups_.erase(it) : std::next(it);
  }
}

int ClientGroupBroker::count(absl::Time now) {
  absl::MutexLock lock(&mu_);
  DropExpiredLocked(now);
  return static_cast<int>(groups_.size());
}

absl::StatusOr<v1::JoinClientGroupResponse> ClientGroupBroker::Join(
    const SessionInfo& session, const v1::JoinClientGroupRequest& req, const JoinWorker& join) {
  RETURN_IF_ERROR(ValidateJoinClientGroupRequest(req));
  if (session.transport != "nccl") {
    return absl::FailedPreconditionError(absl::StrCat(
        "session_id = ", session.session_id, ": its workers exchange data over '",
        session.transport, "', not NCCL (cpu workers): the NCCL client path needs cuda or "
        "cudnn workers; use Upload/Download"));
  }
  if (session.shards.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("session_id = ", session.session_id, " has no workers"));
  }
  const absl::Time now = absl::Now();
  const int init_ms = req.init_timeout_ms() == 0 ? kDefaultInitTimeoutMs : req.init_timeout_ms();
  v1::JoinClientGroupResponse resp;
  resp.set_group_id(RandomId("g-"));
  resp.set_group_secret(NewCapability());
  const int n = static_cast<int>(session.shards.size());
  resp.set_client_rank(n);
  resp.set_size(n + 1);
  resp.set_init_timeout_ms(init_ms);
  resp.set_expires_unix_ms(absl::ToUnixMillis(now + options_.ttl));
  Record record{session.client_id, {}, now + options_.ttl};
  for (const SessionShard& s : session.shards) {
    v1::ClientGroupMember* m = resp.add_workers();
    m->set_rank(s.rank);
    m->set_worker_id(s.worker_id);
    m->set_address(s.address);
    m->set_host(s.host);
    record.worker_ids.push_back(s.worker_id);
  }
  {
    absl::MutexLock lock(&mu_);
    DropExpiredLocked(now);
    int mine = 0;
    for (const auto& [id, r] : groups_) mine += r.client_id == session.client_id ? 1 : 0;
    if (mine >= options_.max_groups_per_client) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "client '", session.client_id, "' already holds ", mine,
          " client groups (the most one client may; reuse one for sessions on the same workers)"));
    }
    if (static_cast<int>(groups_.size()) >= options_.max_groups) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the coordinator already brokers ", groups_.size(), " client groups"));
    }
    groups_.emplace(resp.group_id(), record);
  }
  for (const SessionShard& s : session.shards) {
    v1::WorkerJoinClientGroupRequest w;
    w.set_group_id(resp.group_id());
    w.set_session_id(session.session_id);
    w.set_client_id(session.client_id);
    w.set_rank(s.rank);
    w.set_size(n + 1);
    w.set_nccl_unique_id(req.nccl_unique_id());
    w.set_init_timeout_ms(init_ms);
    w.set_group_secret(resp.group_secret());
    w.set_expires_unix_ms(resp.expires_unix_ms());
    absl::Status st = join(s, w);
    if (!st.ok()) {
      absl::MutexLock lock(&mu_);
      groups_.erase(resp.group_id());
      return absl::Status(st.code(), absl::StrCat("worker ", s.worker_id, " (rank ", s.rank, ", ",
                                                  s.address, ") did not join client group ",
                                                  resp.group_id(), ": ", st.message()));
    }
  }
  DFA_LOG(INFO) << "client group " << resp.group_id() << " for client "
                << (session.client_id.empty() ? "(unnamed)" : session.client_id) << ": " << n
                << " workers of session " << session.session_id << " + the client (rank " << n
                << ", device " << req.client_device() << ")";
  return resp;
}

}  // namespace dfa
