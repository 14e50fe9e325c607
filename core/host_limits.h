// What this process may use of its host: the memory and CPU limits of its cgroup (v1 or v2,
// the lowest on its cgroup path, as a container or a Kubernetes pod sets them) and its CPU
// affinity. std::thread::hardware_concurrency() counts the host's cores, not these: a pod with
// `cpu: "4"` on a 64-core node that starts 64 busy threads is throttled by the kernel for the
// rest of each CFS period (up to 100 ms), every thread of the process with it.
#pragma once

#include <cstdint>
#include <string>

namespace dfa {

// The lowest memory limit in bytes on this process' cgroup path; 0: none.
int64_t CgroupMemoryLimit();

// The lowest CPU limit on this process' cgroup path, in CPUs (quota / period, e.g. 1.5); 0:
// none.
double CgroupCpuLimit();

// The CPUs this process may keep busy: its affinity mask's count, lowered to the cgroup CPU
// limit rounded up; at least 1.
int UsableCpus();

// Parsers of the cgroup files (exposed for tests). cgroup v2 `cpu.max`: "max 100000" (no limit)
// or "QUOTA PERIOD" in microseconds; cgroup v1: `cpu.cfs_quota_us` (-1: no limit) and
// `cpu.cfs_period_us`. Each returns CPUs, 0 for no limit or text it cannot read.
double ParseCpuMax(const std::string& text);
double ParseCfsQuota(const std::string& quota_us, const std::string& period_us);

}  // namespace dfa
