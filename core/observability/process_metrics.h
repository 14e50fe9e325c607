// What every daemon exports besides its own metrics: the process metrics in Prometheus' standard
// names (the ones the Go and Python clients export; prometheus-cpp has no process collector),
// read from /proc/self at each scrape, and dfa_build_info. Names: docs/metrics.md.
// Thread safety: Collect() may run on any thread (it only reads /proc and getrlimit).
#pragma once

#include <memory>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

namespace dfa {

// process_cpu_seconds_total (counter), process_resident_memory_bytes,
// process_virtual_memory_bytes, process_open_fds, process_max_fds, process_start_time_seconds
// (gauges). A value it cannot read (no /proc) is left out rather than reported as 0.
class ProcessCollector : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

// Adds the gauge dfa_build_info{version, build_type} = 1 (core/version.h) to `registry`.
void AddBuildInfo(prometheus::Registry& registry);

}  // namespace dfa
