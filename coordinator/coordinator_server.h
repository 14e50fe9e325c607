// A running coordinator: the gRPC server (Coordinator service + standard health service), the
// Prometheus endpoint and the background thread that expires leases and sessions.
// Used by main.cc and by tests (in-process, on a loopback port).
//
// Thread safety: Start, Shutdown and the accessors are called from one owning thread.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/options.h"
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
  // Stops accepting calls, cancels running jobs, ends streams, joins the background thread.
  // Idempotent.
  void Shutdown();

 private:
  const CoordinatorOptions options_;
  CoordinatorMetrics metrics_;
  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  int metrics_port_ = -1;
  absl::Notification stop_;
  std::thread ticker_;
  bool started_ = false;
  bool stopped_ = false;
};

}  // namespace dfa
