#include "core/observability/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "core/version.h"
#include "prometheus/gauge.h"

namespace dfa {
namespace {

// The fields of /proc/self/stat after the command name (which may hold spaces and ')'):
// index 0 is field 3 (state) of proc(5).
std::vector<std::string> StatFields() {
  std::ifstream f("/proc/self/stat");
  std::string line;
  if (!std::getline(f, line)) return {};
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return {};
  std::istringstream rest(line.substr(close + 1));
  std::vector<std::string> fields;
  for (std::string field; rest >> field;) fields.push_back(field);
  return fields;
}

// Field `n` (1-based, as proc(5) numbers them) of /proc/self/stat.
std::optional<double> StatField(const std::vector<std::string>& fields, size_t n) {
  if (n < 3 || n - 3 >= fields.size()) return std::nullopt;
  try {
    return std::stod(fields[n - 3]);
  } catch (...) {
    return std::nullopt;
  }
}

// Seconds since the epoch at which the host booted ("btime" of /proc/stat).
std::optional<double> BootTime() {
  std::ifstream f("/proc/stat");
  for (std::string key; f >> key;) {
    if (key == "btime") {
      double t = 0;
      if (f >> t) return t;
      return std::nullopt;
    }
    f.ignore(1 << 20, '\n');
  }
  return std::nullopt;
}

std::optional<double> OpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return std::nullopt;
  double n = 0;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n - 1;  // the descriptor opendir holds
}

void Add(std::vector<prometheus::MetricFamily>* out, const char* name, const char* help,
         prometheus::MetricType type, std::optional<double> value) {
  if (!value) return;
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = *value;
  } else {
    metric.gauge.value = *value;
  }
  family.metric.push_back(metric);
  out->push_back(std::move(family));
}

}  // namespace

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  using prometheus::MetricType;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  const std::vector<std::string> stat = StatFields();
  std::optional<double> cpu, start, rss, vsize;
  // utime (14) + stime (15) and starttime (22) in clock ticks; vsize (23) in bytes; rss (24)
  // in pages.
  if (auto u = StatField(stat, 14), s = StatField(stat, 15); u && s && ticks > 0) {
    cpu = (*u + *s) / ticks;
  }
  if (auto st = StatField(stat, 22), boot = BootTime(); st && boot && ticks > 0) {
    start = *boot + *st / ticks;
  }
  vsize = StatField(stat, 23);
  if (auto pages = StatField(stat, 24); pages && page > 0) rss = *pages * page;
  std::optional<double> max_fds;
  if (rlimit lim{}; getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
    max_fds = static_cast<double>(lim.rlim_cur);
  }

  std::vector<prometheus::MetricFamily> out;
  Add(&out, "process_cpu_seconds_total", "Total user and system CPU time spent in seconds",
      MetricType::Counter, cpu);
  Add(&out, "process_resident_memory_bytes", "Resident memory size in bytes", MetricType::Gauge,
      rss);
  Add(&out, "process_virtual_memory_bytes", "Virtual memory size in bytes", MetricType::Gauge,
      vsize);
  Add(&out, "process_open_fds", "Number of open file descriptors", MetricType::Gauge, OpenFds());
  Add(&out, "process_max_fds", "Maximum number of open file descriptors", MetricType::Gauge,
      max_fds);
  Add(&out, "process_start_time_seconds", "Start time of the process since unix epoch in seconds",
      MetricType::Gauge, start);
  return out;
}

void AddBuildInfo(prometheus::Registry& registry) {
  prometheus::BuildGauge()
      .Name("dfa_build_info")
      .Help("Always 1; the labels name the version and build type of this program")
      .Register(registry)
      .Add({{"version", std::string(ProjectVersion())}, {"build_type", std::string(BuildType())}})
      .Set(1);
}

}  // namespace dfa
