#include "coordinator/client_lease.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/random_id.h"

namespace dfa {

absl::Status ValidateClientLeaseOptions(const ClientLeaseOptions& o) {
  if (o.beat_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--client_lease_beat_ms: must be > 0");
  }
  if (o.timeout < 2 * o.beat_interval) {
    return absl::InvalidArgumentError(
        absl::StrCat("--client_lease_timeout_ms: must be at least twice --client_lease_beat_ms (",
                     absl::ToInt64Milliseconds(o.beat_interval), "), got ",
                     absl::ToInt64Milliseconds(o.timeout)));
  }
  if (o.grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--client_lease_grace_ms: must be >= 0");
  }
  if (o.max_leases < 1) return absl::InvalidArgumentError("--max_client_leases: must be >= 1");
  if (o.max_sessions_per_lease < 1) {
    return absl::InvalidArgumentError("--max_sessions_per_lease: must be >= 1");
  }
  return absl::OkStatus();
}

absl::StatusOr<ClientLeases::Lease*> ClientLeases::Find(const std::string& lease_id,
                                                        const std::string& secret) {
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "lease_id: unknown or expired client lease ", lease_id.substr(0, 64),
        " (its sessions were released, or the coordinator restarted); open a new lease"));
  }
  if (secret.empty() || !ConstantTimeEquals(it->second.secret, secret)) {
    return absl::PermissionDeniedError(
        absl::StrCat("lease_secret: missing or wrong secret for client lease ", lease_id));
  }
  return &it->second;
}

absl::StatusOr<ClientLeases::Attachment> ClientLeases::Attach(const std::string& lease_id,
                                                              const std::string& secret,
                                                              const std::string& client_id,
                                                              absl::Time now) {
  absl::MutexLock lock(&mu_);
  Attachment a;
  if (lease_id.empty() && secret.empty()) {
    if (static_cast<int>(leases_.size()) >= options_.max_leases) {
      return absl::ResourceExhaustedError(
          absl::StrCat("HoldLease: the coordinator holds its limit of ", options_.max_leases,
                       " client leases (--max_client_leases)"));
    }
    a.lease_id = RandomId("l-");
    a.secret = NewCapability();
    Lease& l = leases_[a.lease_id];
    l.secret = a.secret;
    l.client_id = client_id;
    l.stream = a.stream = next_stream_++;
    l.last_beat = now;
    return a;
  }
  if (lease_id.empty()) {
    return absl::InvalidArgumentError("lease_id: empty, but lease_secret is set");
  }
  ASSIGN_OR_RETURN(Lease * l, Find(lease_id, secret));
  l->stream = a.stream = next_stream_++;
  l->lost = false;
  l->last_beat = now;
  a.lease_id = lease_id;
  a.sessions = static_cast<int>(l->sessions.size());
  return a;
}

absl::StatusOr<int> ClientLeases::Beat(const std::string& lease_id, uint64_t stream,
                                       absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) {
    return absl::NotFoundError(
        absl::StrCat("lease_id: client lease ", lease_id, " expired; open a new lease"));
  }
  Lease& l = it->second;
  if (l.stream != stream) {
    return absl::AbortedError(
        absl::StrCat("lease_id: client lease ", lease_id, " was taken over by another stream"));
  }
  l.lost = false;
  l.last_beat = now;
  return static_cast<int>(l.sessions.size());
}

void ClientLeases::Detach(const std::string& lease_id, uint64_t stream, bool clean,
                          absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || it->second.stream != stream) return;
  if (clean) {
    leases_.erase(it);
    return;
  }
  if (it->second.lost) return;
  it->second.lost = true;
  it->second.lost_at = now;
  it->second.lost_why = "its stream ended without a close";
}

absl::Status ClientLeases::CheckCanAdd(const std::string& lease_id, const std::string& secret) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Lease * l, Find(lease_id, secret));
  if (static_cast<int>(l->sessions.size()) >= options_.max_sessions_per_lease) {
    return absl::ResourceExhaustedError(
        absl::StrCat("lease_id: client lease ", lease_id, " holds its limit of ",
                     options_.max_sessions_per_lease, " sessions (--max_sessions_per_lease)"));
  }
  return absl::OkStatus();
}

absl::Status ClientLeases::AddSession(const std::string& lease_id, const std::string& secret,
                                      const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Lease * l, Find(lease_id, secret));
  if (static_cast<int>(l->sessions.size()) >= options_.max_sessions_per_lease) {
    return absl::ResourceExhaustedError(
        absl::StrCat("lease_id: client lease ", lease_id, " holds its limit of ",
                     options_.max_sessions_per_lease, " sessions (--max_sessions_per_lease)"));
  }
  l->sessions.insert(session_id);
  return absl::OkStatus();
}

void ClientLeases::ForgetSession(const std::string& lease_id, const std::string& session_id) {
  if (lease_id.empty()) return;
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  if (it != leases_.end()) it->second.sessions.erase(session_id);
}

std::vector<ClientLeases::Expired> ClientLeases::Expire(absl::Time now) {
  absl::MutexLock lock(&mu_);
  std::vector<Expired> out;
  // A gap longer than a beat interval since the last check: the coordinator itself did not run
  // (stopped, starved), so missing beats and a grace that ran out meanwhile say nothing about the
  // clients. Every lease's clock restarts now instead (as the worker registry does).
  const bool stalled = last_expire_ != absl::InfinitePast() && now - last_expire_ > stall_after_;
  last_expire_ = now;
  if (stalled) {
    ++stalls_;
    for (auto& [id, l] : leases_) {
      l.last_beat = std::max(l.last_beat, now);
      if (l.lost) l.lost_at = std::max(l.lost_at, now);
    }
    return out;
  }
  for (auto it = leases_.begin(); it != leases_.end();) {
    Lease& l = it->second;
    if (!l.lost && now - l.last_beat > options_.timeout) {
      l.lost = true;
      l.lost_at = l.last_beat + options_.timeout;
      l.lost_why = absl::StrCat("no beat for ", absl::FormatDuration(options_.timeout));
    }
    if (l.lost && now - l.lost_at >= options_.grace) {
      Expired e;
      e.lease_id = it->first;
      e.client_id = l.client_id;
      e.why = l.lost_why;
      e.session_ids.assign(l.sessions.begin(), l.sessions.end());
      out.push_back(std::move(e));
      it = leases_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

int ClientLeases::stalls() {
  absl::MutexLock lock(&mu_);
  return stalls_;
}

int ClientLeases::count() {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(leases_.size());
}

int ClientLeases::sessions(const std::string& lease_id) {
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  return it == leases_.end() ? 0 : static_cast<int>(it->second.sessions.size());
}

}  // namespace dfa
