#include "worker/memory_budget.h"

#include <unistd.h>

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/host_limits.h"

namespace dfa {

int64_t UsableMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  int64_t bytes = pages > 0 && page > 0 ? int64_t{pages} * page : int64_t{8} << 30;
  const int64_t cgroup = CgroupMemoryLimit();
  if (cgroup > 0) bytes = std::min(bytes, cgroup);
  return bytes;
}

int64_t DefaultMemoryLimit(int workers_per_host) {
  return UsableMemoryBytes() / 10 * 8 / std::max(1, workers_per_host);
}

absl::Status MemoryBudget::Reserve(int64_t bytes) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("bytes to reserve must be >= 0, got ", bytes));
  }
  std::lock_guard<std::mutex> l(mu_);
  if (limit_ > 0 && bytes > limit_ - used_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session needs ", bytes, " bytes but the worker has ", limit_ - used_,
                     " of its memory_limit_bytes = ", limit_, " free (", used_, " in use)"));
  }
  used_ += bytes;
  return absl::OkStatus();
}

void MemoryBudget::Release(int64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  used_ -= bytes;
  if (used_ < 0) used_ = 0;
}

int64_t MemoryBudget::used() const {
  std::lock_guard<std::mutex> l(mu_);
  return used_;
}

}  // namespace dfa
