// One daemon's HTTP endpoint on its metrics port (prometheus-cpp's Exposer, which runs civetweb):
//   /metrics  Prometheus' text format: the daemon's registry, the process metrics and
//             dfa_build_info (process_metrics.h)
//   /healthz  200 "ok" while the process serves HTTP (a liveness probe)
//   /readyz   200 "ready" when the daemon's ReadinessCheck (readiness.h) passes, otherwise 503
//             with its one-line reason (a readiness probe)
// /healthz and /readyz answer GET and HEAD; they are served before the Exposer's handlers see
// the request (civetweb's begin_request callback), on the same port.
//
// Threads: Start and Stop from the owning thread. The check runs on civetweb's threads, until
// Stop returns. Stop is prompt (civetweb's listener is woken instead of waiting out its poll).
#pragma once

#include <memory>
#include <string>

#include "core/observability/readiness.h"
#include "core/status.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"

namespace dfa {

class MetricsHttpServer {
 public:
  MetricsHttpServer();
  ~MetricsHttpServer();  // Stop()

  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // Serves at `bind_address` ("host:port"; port 0 picks a free port) and returns the bound port.
  // UNAVAILABLE naming the address when it cannot bind; FAILED_PRECONDITION when serving already.
  absl::StatusOr<int> Start(const std::string& bind_address,
                            std::shared_ptr<prometheus::Registry> registry, ReadinessCheck ready);
  // Idempotent.
  void Stop();
  int port() const { return port_; }

  // What /readyz answers now: {200, "ready"} or {503, "not ready: <reason>"}.
  struct Answer {
    int status;
    std::string body;
  };
  Answer Readyz() const;

 private:
  std::shared_ptr<prometheus::Registry> common_;  // dfa_build_info
  std::shared_ptr<prometheus::Collectable> process_;
  std::shared_ptr<prometheus::Registry> registry_;
  ReadinessCheck ready_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace dfa
