// The coordinator's Prometheus metrics (names and labels: docs/metrics.md). The registry always
// exists; Serve() exposes it on /metrics when a port is configured.
// Thread safety: all methods may be called from any thread (prometheus-cpp is thread-safe).
#pragma once

#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "dfa/v1/coordinator.pb.h"
#include "core/status.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace dfa {

class CoordinatorMetrics {
 public:
  CoordinatorMetrics();
  ~CoordinatorMetrics();  // StopServing()

  // port 0 picks a free port. Returns the bound port. UNAVAILABLE when it cannot bind.
  absl::StatusOr<int> Serve(int port);
  // Stops the HTTP endpoint (promptly). Idempotent.
  void StopServing();

  void JobFinished(v1::JobKind kind, v1::JobState state, double latency_seconds, double flops);
  // A succeeded job's wall time (RunJob calls out to replies back) not spent inside its slowest
  // worker: the control plane's share of the job (RPC legs, bookkeeping).
  void JobOverhead(v1::JobKind kind, double seconds);
  void SetQueueDepth(int jobs);
  void SetSessions(int sessions);
  void SetMemoryReserved(int64_t bytes);
  void SetLiveWorkers(int workers);
  // An RPC answered with a non-OK status.
  void GrpcError(absl::string_view method, int code);

  prometheus::Registry& registry() { return *registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
  prometheus::Family<prometheus::Histogram>& latency_;
  prometheus::Family<prometheus::Histogram>& overhead_;
  prometheus::Family<prometheus::Counter>& jobs_;
  prometheus::Family<prometheus::Counter>& flops_;
  prometheus::Gauge& queue_depth_;
  prometheus::Gauge& sessions_;
  prometheus::Gauge& memory_reserved_;
  prometheus::Gauge& live_workers_;
  prometheus::Family<prometheus::Counter>& grpc_errors_;
};

// "forward" / "backward"; "succeeded" / "failed" / "cancelled" (label values).
std::string JobKindLabel(v1::JobKind kind);
std::string JobStateLabel(v1::JobState state);

}  // namespace dfa
