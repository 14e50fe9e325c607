#include "coordinator/worker_registry.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace dfa {
namespace {

absl::Status ValidateRegistration(const v1::RegisterWorkerRequest& r) {
  if (r.worker_id().empty() || r.worker_id().size() > 256) {
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
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<uint64_t> WorkerRegistry::Register(const v1::RegisterWorkerRequest& request,
                                                  absl::Time now, bool* replaced) {
  RETURN_IF_ERROR(ValidateRegistration(request));
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = workers_.try_emplace(request.worker_id());
  *replaced = !inserted;
  RegisteredWorker& w = it->second;
  w.info = request;
  if (w.info.speed() == 0.0) w.info.set_speed(1.0);
  w.registered_at = now;
  w.last_seen = now;
  w.reported_used_bytes = 0;
  w.incarnation = next_incarnation_++;
  return w.incarnation;
}

absl::Status WorkerRegistry::Heartbeat(const v1::HeartbeatRequest& request, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(request.worker_id());
  if (it == workers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("worker_id: ", request.worker_id(), " is not registered; register again"));
  }
  it->second.last_seen = now;
  it->second.reported_used_bytes = request.memory_used_bytes();
  return absl::OkStatus();
}

std::vector<std::string> WorkerRegistry::ExpireLeases(absl::Time now) {
  std::vector<std::string> dropped;
  absl::MutexLock lock(&mu_);
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (now - it->second.last_seen > lease_) {
      dropped.push_back(it->first);
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
  return dropped;
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

}  // namespace dfa
