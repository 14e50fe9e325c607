#include "core/host_limits.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace dfa {
namespace {

std::string ReadFirstLine(const std::string& path) {
  std::ifstream f(path);
  std::string text;
  if (!f || !std::getline(f, text)) return "";
  return text;
}

// A memory limit file's value in bytes; 0 for "max", unreadable or absurd values (no limit).
int64_t ParseMemoryLimit(const std::string& text) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &v) || v <= 0) return 0;
  return v >= (int64_t{1} << 60) ? 0 : v;  // v1 reports "unlimited" as a huge number
}

// Calls `visit(dir, v2)` for this process' cgroup directory of `v1_controller` (v1) or its
// unified one (v2), and every parent up to the root (a container's namespace may show its own
// cgroup as "/").
void ForEachCgroupDir(const std::string& v1_controller,
                      const std::function<void(const std::string&, bool)>& visit) {
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  while (std::getline(f, line)) {
    // v2: "0::/path"; v1: "N:cpu,cpuacct:/path" (controllers comma-separated).
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    const bool v2 = line.substr(0, a) == "0" && controllers.empty();
    bool v1 = false;
    for (absl::string_view c : absl::StrSplit(controllers, ',')) v1 = v1 || c == v1_controller;
    if (!v2 && !v1) continue;
    const std::string root = v2 ? "/sys/fs/cgroup" : absl::StrCat("/sys/fs/cgroup/", controllers);
    while (true) {
      visit(root + (path == "/" ? "" : path), v2);
      if (path.empty() || path == "/") break;
      const size_t slash = path.rfind('/');
      path = slash == 0 ? "/" : path.substr(0, slash);
    }
  }
}

// The lowest positive value, 0 if none.
void KeepLowest(double v, double* best) {
  if (v > 0 && (*best == 0 || v < *best)) *best = v;
}

}  // namespace

double ParseCpuMax(const std::string& text) {
  const std::vector<std::string> parts =
      absl::StrSplit(absl::StripAsciiWhitespace(text), ' ', absl::SkipEmpty());
  if (parts.size() != 2 || parts[0] == "max") return 0;
  int64_t quota = 0, period = 0;
  if (!absl::SimpleAtoi(parts[0], &quota) || !absl::SimpleAtoi(parts[1], &period)) return 0;
  if (quota <= 0 || period <= 0) return 0;
  return static_cast<double>(quota) / static_cast<double>(period);
}

double ParseCfsQuota(const std::string& quota_us, const std::string& period_us) {
  int64_t quota = 0, period = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(quota_us), &quota) ||
      !absl::SimpleAtoi(absl::StripAsciiWhitespace(period_us), &period)) {
    return 0;
  }
  if (quota <= 0 || period <= 0) return 0;  // -1: no limit
  return static_cast<double>(quota) / static_cast<double>(period);
}

int64_t CgroupMemoryLimit() {
  double best = 0;
  ForEachCgroupDir("memory", [&best](const std::string& dir, bool v2) {
    KeepLowest(static_cast<double>(ParseMemoryLimit(
                   ReadFirstLine(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes")))),
               &best);
  });
  return static_cast<int64_t>(best);
}

double CgroupCpuLimit() {
  double best = 0;
  ForEachCgroupDir("cpu", [&best](const std::string& dir, bool v2) {
    KeepLowest(v2 ? ParseCpuMax(ReadFirstLine(dir + "/cpu.max"))
                  : ParseCfsQuota(ReadFirstLine(dir + "/cpu.cfs_quota_us"),
                                  ReadFirstLine(dir + "/cpu.cfs_period_us")),
               &best);
  });
  return best;
}

int UsableCpus() {
  int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) cpus = n;
  }
  const double limit = CgroupCpuLimit();
  if (limit > 0) cpus = std::min(cpus, static_cast<int>(std::ceil(limit - 1e-9)));
  return std::max(1, cpus);
}

}  // namespace dfa
