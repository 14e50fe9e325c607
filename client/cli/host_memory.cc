#include "client/cli/host_memory.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/host_tensor.h"
#include "core/dtype.h"

namespace dfa::cli {
namespace {

// The first line of `path` as a number; -1 when absent or not a number ("max").
int64_t ReadNumber(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  int64_t x = -1;
  if (!std::getline(f, line) || !absl::SimpleAtoi(line, &x)) return -1;
  return x;
}

int64_t MemAvailable() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (f >> key >> kib) {
    std::getline(f, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

double ElemBytes(const v1::AttentionSpec& spec) {
  auto dt = client::FromProtoDType(spec.dtype());
  return dt.ok() ? static_cast<double>(DTypeSize(*dt)) : 4.0;
}

}  // namespace

double TensorBytes(const v1::AttentionSpec& spec, bool q_heads, double elem_bytes) {
  return static_cast<double>(spec.batch()) * static_cast<double>(spec.seq_len()) *
         (q_heads ? spec.q_heads() : spec.kv_heads()) * spec.head_dim() * elem_bytes;
}

double RowStatBytes(const v1::AttentionSpec& spec) {
  return static_cast<double>(spec.batch()) * spec.q_heads() * static_cast<double>(spec.seq_len()) *
         4.0;
}

double TrainingRunBytes(const v1::AttentionSpec& spec, bool backward, bool verify) {
  const double e = ElemBytes(spec);
  const double q = TensorBytes(spec, true, e), kv = TensorBytes(spec, false, e);
  const double stat = RowStatBytes(spec);
  double bytes = q + 2 * kv + q + stat;   // Q, K, V; O, LSE
  if (backward) bytes += q + q + 2 * kv;  // dO; dQ, dK, dV
  if (verify) {
    bytes += TensorBytes(spec, true, 4) + stat;  // reference O, LSE
    if (backward) bytes += stat + TensorBytes(spec, true, 4) + 2 * TensorBytes(spec, false, 4);
  }
  return bytes;
}

int64_t AvailableHostBytes() {
  int64_t avail = MemAvailable();
  auto lower = [&avail](int64_t limit, int64_t used) {
    if (limit <= 0 || used < 0 || limit >= (int64_t{1} << 60)) return;
    const int64_t left = std::max<int64_t>(0, limit - used);
    avail = avail < 0 ? left : std::min(avail, left);
  };
  lower(ReadNumber("/sys/fs/cgroup/memory.max"), ReadNumber("/sys/fs/cgroup/memory.current"));
  lower(ReadNumber("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
        ReadNumber("/sys/fs/cgroup/memory/memory.usage_in_bytes"));
  return avail;
}

std::string FormatBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) bytes /= 1024, ++u;
  return u == 0 ? absl::StrFormat("%.0f B", bytes) : absl::StrFormat("%.2f %s", bytes, units[u]);
}

absl::Status CheckHostMemory(const std::string& what, double bytes, const std::string& detail,
                             const std::string& advice) {
  const int64_t avail = AvailableHostBytes();
  if (avail < 0 || bytes <= static_cast<double>(avail)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, " would hold ", FormatBytes(bytes), " of host memory (", detail, "), more than the ",
      FormatBytes(static_cast<double>(avail)), " this host has available; ", advice));
}

absl::Status CheckTrainingRunMemory(const v1::AttentionSpec& spec, bool backward, bool verify) {
  const double e = ElemBytes(spec);
  const double q = TensorBytes(spec, true, e), kv = TensorBytes(spec, false, e);
  const double inputs = q + 2 * kv + (backward ? q : 0);
  const double total = TrainingRunBytes(spec, backward, verify);
  const double outputs = TrainingRunBytes(spec, backward, false) - inputs;
  std::string detail =
      absl::StrCat(backward ? "Q, K, V, dO " : "Q, K, V ", FormatBytes(inputs),
                   backward ? "; O, LSE, dQ, dK, dV " : "; O, LSE ", FormatBytes(outputs));
  if (verify) {
    absl::StrAppend(&detail, "; the fp32 reference of --verify ",
                    FormatBytes(total - inputs - outputs));
  }
  auto dt = client::FromProtoDType(spec.dtype());
  const std::string flags =
      absl::StrCat("--batch ", spec.batch(), " --seq ", spec.seq_len(), " --heads ", spec.q_heads(),
                   " --kv-heads ", spec.kv_heads(), " --head-dim ", spec.head_dim(), " --dtype ",
                   dt.ok() ? std::string(DTypeName(*dt)) : "?");
  return CheckHostMemory(flags, total, detail,
                         "use a smaller --seq, --batch, --heads or --head-dim");
}

}  // namespace dfa::cli
