// The coordinator's Prometheus metrics (names and labels: docs/metrics.md). The registry always
// exists; Serve() exposes it on /metrics when a port is configured, beside /healthz and /readyz
// (core/observability/metrics_http_server.h).
// Thread safety: all methods may be called from any thread (prometheus-cpp is thread-safe).
#pragma once

#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "core/observability/metrics_http_server.h"
#include "core/status.h"
#include "dfa/v1/coordinator.pb.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace dfa {

class CoordinatorMetrics {
 public:
  CoordinatorMetrics();
  ~CoordinatorMetrics();  // StopServing()

  // port 0 picks a free port. Returns the bound port. UNAVAILABLE when it cannot bind.
  // `ready` answers /readyz ("" when ready, else why not); it runs until StopServing returns.
  absl::StatusOr<int> Serve(int port, ReadinessCheck ready = {});
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
  // Client leases held now, and sessions released because their client's lease was lost.
  void SetClientLeases(int leases);
  void LeaseSessionsReclaimed(int sessions);
  // An RPC answered with status `code` (a grpc::StatusCode): counted in
  // dfa_coordinator_requests_total{rpc, code} and, when not OK, in dfa_grpc_errors_total.
  void RpcAnswered(absl::string_view method, int code);
  // An RPC answered with a non-OK status (dfa_grpc_errors_total only).
  void GrpcError(absl::string_view method, int code);

  prometheus::Registry& registry() { return *registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  MetricsHttpServer http_;
  prometheus::Family<prometheus::Histogram>& latency_;
  prometheus::Family<prometheus::Histogram>& overhead_;
  prometheus::Family<prometheus::Counter>& jobs_;
  prometheus::Family<prometheus::Counter>& flops_;
  prometheus::Gauge& queue_depth_;
  prometheus::Gauge& sessions_;
  prometheus::Gauge& memory_reserved_;
  prometheus::Gauge& live_workers_;
  prometheus::Gauge& client_leases_;
  prometheus::Counter& lease_reclaimed_;
  prometheus::Family<prometheus::Counter>& grpc_errors_;
  prometheus::Family<prometheus::Counter>& requests_;
};

}  // namespace dfa
