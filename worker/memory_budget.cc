#include "worker/memory_budget.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace dfa {
namespace {

// A limit file's value in bytes; 0 for "max", unreadable or absurd values (no limit).
int64_t ReadLimitFile(const std::string& path) {
  std::ifstream f(path);
  std::string text;
  if (!f || !std::getline(f, text)) return 0;
  int64_t v = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &v) || v <= 0) return 0;
  return v >= (int64_t{1} << 60) ? 0 : v;  // v1 reports "unlimited" as a huge number
}

// The lowest memory limit on this process' cgroup path (0: none).
int64_t CgroupMemoryLimit() {
  int64_t best = 0;
  auto consider = [&best](int64_t v) {
    if (v > 0 && (best == 0 || v < best)) best = v;
  };
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  while (std::getline(f, line)) {
    // v2: "0::/path"; v1: "N:memory:/path" (or with other controllers listed).
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    const bool v2 = line.substr(0, a) == "0" && controllers.empty();
    const bool v1 = controllers.find("memory") != std::string::npos;
    if (!v2 && !v1) continue;
    const std::string root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
    const std::string file = v2 ? "/memory.max" : "/memory.limit_in_bytes";
    // The cgroup and its parents (a container's namespace may show it as "/").
    while (true) {
      consider(ReadLimitFile(root + (path == "/" ? "" : path) + file));
      if (path.empty() || path == "/") break;
      const size_t slash = path.rfind('/');
      path = slash == 0 ? "/" : path.substr(0, slash);
    }
  }
  return best;
}

}  // namespace

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
