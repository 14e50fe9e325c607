// A running coordinator: the gRPC server (Coordinator service + standard health service), the
// Prometheus endpoint (/metrics, /healthz, /readyz) and the background thread that expires
// leases and sessions. Ready (/readyz 200; gRPC health "dfa.v1.Coordinator" and "" SERVING)
// while at least one worker holds a valid lease; NOT_SERVING before and once stopping.
// Used by main.cc and by tests (in-process, on a loopback port).
//
// Thread safety: Start, Shutdown and the accessors are called from one owning thread.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "coordinator/coordinator_metrics.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/options.h"
#include "core/observability/readiness.h"
#include "grpcpp/server.h"
#include "core/status.h"

namespace dfa {

class CoordinatorServer {
 public:
  explicit CoordinatorServer(const CoordinatorOptions& options);
  ~CoordinatorServer();  // Shutdown()

  // INVALID_ARGUMENT for bad options (naming the flag), UNAVAILABLE when a port cannot be bound.
  absl::Status Start();
  // "host:port" actually bound (the port is resolved when --listen asked for port 0).
  const std::string& address() const { return address_; }
  int metrics_port() const { return metrics_port_; }
  // "" when the coordinator can serve (a live worker), otherwise why not (what /readyz says).
  std::string NotReadyReason() const;
  // Stops accepting calls, cancels running jobs, ends streams, joins the background thread.
  // Idempotent.
  void Shutdown();

 private:
  const CoordinatorOptions options_;
  CoordinatorMetrics metrics_;
  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<grpc::Server> server_;
  // The service while it serves (readiness checks read it from HTTP and health threads).
  std::atomic<const CoordinatorService*> serving_{nullptr};
  std::unique_ptr<GrpcHealthMirror> health_;
  std::string address_;
  int metrics_port_ = -1;
  // The ticker's stop signal. A std::condition_variable on the steady clock: the ticker's
  // period must hold (the registry tells a stall of the coordinator from its gaps).
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread ticker_;
  bool started_ = false;
  bool stopped_ = false;
};

}  // namespace dfa
