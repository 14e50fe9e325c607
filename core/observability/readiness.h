// A daemon's readiness, the one notion behind its HTTP /readyz (metrics_http_server.h) and the
// status its standard gRPC health service reports for its service names.
//
// A ReadinessCheck returns "" when the daemon can serve, otherwise one line saying why not
// ("no live worker", "not registered with the coordinator at ..."). It is called from HTTP and
// health threads, so it must be thread-safe and quick (no RPCs).
//
// GrpcHealthMirror keeps gRPC's health service in step with a check: each of `services` (e.g.
// "dfa.v1.Worker" and "", the whole server) is SERVING while the check passes and NOT_SERVING
// otherwise, re-evaluated every `period` on its own thread (and once in the constructor, so the
// status is right from the start). Only the named services are touched: a daemon may serve
// other names with statuses of their own.
// Threads: construct and Stop from the owning thread; Stop (idempotent, also the destructor)
// joins the thread and leaves every service NOT_SERVING.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "grpcpp/health_check_service_interface.h"

namespace dfa {

using ReadinessCheck = std::function<std::string()>;

class GrpcHealthMirror {
 public:
  GrpcHealthMirror(grpc::HealthCheckServiceInterface* health, std::vector<std::string> services,
                   ReadinessCheck ready, absl::Duration period = absl::Milliseconds(100));
  ~GrpcHealthMirror();

  GrpcHealthMirror(const GrpcHealthMirror&) = delete;
  GrpcHealthMirror& operator=(const GrpcHealthMirror&) = delete;

  void Stop();

 private:
  void Set(bool serving);

  grpc::HealthCheckServiceInterface* const health_;
  const std::vector<std::string> services_;
  const ReadinessCheck ready_;
  const absl::Duration period_;
  int serving_ = -1;  // last status set: -1 none yet, 0 NOT_SERVING, 1 SERVING (mirror thread)
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dfa
