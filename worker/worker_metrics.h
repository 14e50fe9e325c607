// The worker's Prometheus metrics (names and labels as docs/metrics.md fixes them), kept in one
// prometheus::Registry that the daemon's Exposer serves on --metrics_port.
// Thread-safe (prometheus-cpp metrics are atomic; label lookups take the family's lock).
#pragma once

#include <memory>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace dfa {

class WorkerMetrics {
 public:
  explicit WorkerMetrics(std::string worker_id);

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // kind: "forward" / "backward".
  void ObserveStep(const std::string& kind, double busy_seconds, double idle_seconds);
  void AddFlops(const std::string& kind, double flops);
  // op: "forward", "backward", "merge", "delta".
  void AddLaunches(const std::string& op, double n);
  void AddTransportBytes(const std::string& transport, int peer, double sent, double received);
  // direction: "upload" / "download"; path: "grpc" / "shm".
  void AddClientBytes(const std::string& direction, const std::string& path, double bytes);
  void SetSessions(int n);
  void SetMemory(double used_bytes, double limit_bytes);
  // method: the RPC name; code: the gRPC status code's name (e.g. "NOT_FOUND").
  void CountGrpcError(const std::string& method, const std::string& code);
  // Every answered RPC, OK ones included (dfa_worker_requests_total{worker, rpc, code}).
  void CountRequest(const std::string& method, const std::string& code);

 private:
  const std::string worker_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Histogram>& busy_;
  prometheus::Family<prometheus::Histogram>& idle_;
  prometheus::Family<prometheus::Counter>& flops_;
  prometheus::Family<prometheus::Counter>& launches_;
  prometheus::Family<prometheus::Counter>& sent_;
  prometheus::Family<prometheus::Counter>& received_;
  prometheus::Family<prometheus::Counter>& client_bytes_;
  prometheus::Gauge& sessions_;
  prometheus::Gauge& memory_used_;
  prometheus::Gauge& memory_limit_;
  prometheus::Family<prometheus::Counter>& grpc_errors_;
  prometheus::Family<prometheus::Counter>& requests_;
};

}  // namespace dfa
