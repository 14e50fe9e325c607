// Reads a daemon's Prometheus /metrics over plain HTTP (tests only) and sums samples.
#pragma once

#include <map>
#include <string>

#include "core/status.h"

namespace dfa::testing {

// GET http://127.0.0.1:<port>/metrics; the body (text exposition format).
absl::StatusOr<std::string> ScrapeMetrics(int port);

// Sum of the samples of `name` (exact metric name, e.g. "dfa_worker_client_bytes_total") whose
// labels include every pair of `labels`. 0 when none match.
double SumMetric(const std::string& body, const std::string& name,
                 const std::map<std::string, std::string>& labels = {});

}  // namespace dfa::testing
