#include "coordinator/worker_registry.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace dfa {
namespace {

constexpr size_t kMaxIdLength = 256;
constexpr size_t kMaxBootIdLength = 128;
constexpr size_t kMaxDeviceUuidLength = 64;

}  // namespace

absl::Status ValidateRegistration(const v1::RegisterWorkerRequest& r) {
  if (r.worker_id().empty() || r.worker_id().size() > kMaxIdLength) {
    return absl::InvalidArgumentError("worker_id: must be 1 to 256 characters");
  }
  if (r.address().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("address: empty for worker ", r.worker_id()));
  }
  if (r.backend() != "cpu" && r.backend() != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("backend: must be \"cpu\" or \"cuda\", got \"", r.backend(), "\""));
  }
  if (r.memory_limit_bytes() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory_limit_bytes: must be >= 0, got ", r.memory_limit_bytes()));
  }
  if (!(r.speed() >= 0.0) || !std::isfinite(r.speed())) {
    return absl::InvalidArgumentError(
        absl::StrCat("speed: must be finite and >= 0 (0: nominal), got ", r.speed()));
  }
  if (r.boot_id().size() > kMaxBootIdLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("boot_id: longer than ", kMaxBootIdLength, " characters"));
  }
  if (r.device_uuid().size() > kMaxDeviceUuidLength ||
      !std::all_of(r.device_uuid().begin(), r.device_uuid().end(),
                   [](char c) { return c > ' ' && c <= '~'; })) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device_uuid: must be at most ", kMaxDeviceUuidLength, " printable characters"));
  }
  if (!r.device_uuid().empty() && r.backend() != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat(
        "device_uuid: set for a ", r.backend(), " worker (only cuda workers name a GPU)"));
  }
  return absl::OkStatus();
}

absl::Status IdHeldError(const RegisteredWorker& holder, absl::Duration lease) {
  return absl::AlreadyExistsError(absl::StrCat(
      "worker_id: ", holder.info.worker_id(), " is held by a live worker at ",
      holder.info.address(),
      "; a second worker cannot take its id (give it another --worker_id, or stop the first: "
      "its id is free once its lease of ",
      absl::FormatDuration(lease), " runs out)"));
}

absl::StatusOr<uint64_t> WorkerRegistry::Register(const v1::RegisterWorkerRequest& request,
                                                  absl::Time now, uint64_t replaces,
                                                  bool* replaced) {
  RETURN_IF_ERROR(ValidateRegistration(request));
  *replaced = false;
  absl::MutexLock lock(&mu_);
  // The stall clock starts with the first registration: a coordinator stopped before its
  // first lease check must not drop its workers when it resumes.
  if (last_expiry_check_ == absl::InfinitePast()) last_expiry_check_ = now;
  auto [it, inserted] = workers_.try_emplace(request.worker_id());
  RegisteredWorker& w = it->second;
  bool renew = false;
  if (!inserted && LiveLocked(w, now)) {
    renew = !request.boot_id().empty() && request.boot_id() == w.info.boot_id() &&
            request.address() == w.info.address();
    if (!renew && (replaces == 0 || replaces != w.incarnation)) return IdHeldError(w, lease_);
  }
  *replaced = !inserted && !renew;
  w.info = request;
  if (w.info.speed() == 0.0) w.info.set_speed(1.0);
  w.last_seen = now;
  if (!renew) {
    w.registered_at = now;
    w.reported_used_bytes = 0;
    w.incarnation = next_incarnation_++;
  }
  return w.incarnation;
}

absl::Status WorkerRegistry::Heartbeat(const v1::HeartbeatRequest& request, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(request.worker_id());
  if (it == workers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("worker_id: ", request.worker_id(), " is not registered; register again"));
  }
  const std::string& boot = it->second.info.boot_id();
  if (!request.boot_id().empty() && !boot.empty() && request.boot_id() != boot) {
    return absl::NotFoundError(absl::StrCat("worker_id: ", request.worker_id(),
                                            " is registered by another process (at ",
                                            it->second.info.address(), "); register again"));
  }
  it->second.last_seen = now;
  it->second.reported_used_bytes = request.memory_used_bytes();
  return absl::OkStatus();
}

std::vector<std::string> WorkerRegistry::ExpireLeases(absl::Time now) {
  std::vector<std::string> dropped;
  absl::MutexLock lock(&mu_);
  const bool stalled = StalledLocked(now);
  last_expiry_check_ = now;
  if (stalled) {
    ++stalls_;
    for (auto& [id, w] : workers_) w.last_seen = std::max(w.last_seen, now);
    return dropped;
  }
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (!LiveLocked(it->second, now)) {
      dropped.push_back(it->first);
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
  return dropped;
}

bool WorkerRegistry::StalledLocked(absl::Time now) const {
  return last_expiry_check_ != absl::InfinitePast() && now - last_expiry_check_ > stall_after_;
}

bool WorkerRegistry::LiveLocked(const RegisteredWorker& w, absl::Time now) const {
  return now - w.last_seen <= lease_ || StalledLocked(now);
}

bool WorkerRegistry::Live(const RegisteredWorker& w, absl::Time now) const {
  absl::MutexLock lock(&mu_);
  return LiveLocked(w, now);
}

std::optional<RegisteredWorker> WorkerRegistry::Get(const std::string& worker_id) const {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return std::nullopt;
  return it->second;
}

std::vector<RegisteredWorker> WorkerRegistry::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<RegisteredWorker> out;
  out.reserve(workers_.size());
  for (const auto& [id, w] : workers_) out.push_back(w);
  return out;
}

int WorkerRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(workers_.size());
}

int WorkerRegistry::stalls() const {
  absl::MutexLock lock(&mu_);
  return stalls_;
}

}  // namespace dfa
