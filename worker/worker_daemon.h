// The dfa-worker daemon as a library (worker/main.cc only parses flags and waits for a signal):
// the Worker gRPC service with the standard health service, registration with the coordinator,
// and the metrics port (/metrics, /healthz, /readyz: core/observability/metrics_http_server.h).
// Ready (/readyz 200; gRPC health "dfa.v1.Worker" and "" SERVING) when standalone (no
// coordinator configured) or registered with the coordinator within the lease of its latest
// answer; NOT_SERVING while the coordinator is unreachable and once shutting down.
//
// Threads: Start returns once the server listens; Shutdown (idempotent, any thread) stops
// registration, cancels running jobs, stops the server within a grace period, frees every
// session, and stops the metrics endpoint.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "core/status.h"
#include "core/planner/worker_memory.h"
#include "core/rpc_security.h"
#include "worker/session_admission.h"
#include "worker/stream_limits.h"

namespace dfa {

struct WorkerOptions {
  std::string listen = "127.0.0.1:0";  // host:port; port 0 picks a free one
  std::string advertise;               // address others use; default: derived from listen
  std::string coordinator;             // empty: run without registering (tests)
  std::string backend = "cpu";         // cpu | cuda | auto
  int threads = 0;                     // cpu backend threads per session (0: usable CPUs)
  int cuda_device = 0;
  int64_t memory_limit_bytes = 0;      // 0: DefaultMemoryLimit(workers_per_host), memory_budget.h
  int workers_per_host = 1;            // workers sharing this host's memory (the default above)
  // GPU workers: the device memory pool's size (--device_memory_limit), so that a worker shares
  // its GPU with another process (a training job): bytes ("40G") or a fraction of the device's
  // total memory ("0.5"); ParseDeviceMemoryLimit. Empty: memory_limit_bytes when set, else all
  // free device memory but 8 GiB.
  std::string device_memory_limit;
  int metrics_port = -1;               // -1: no metrics endpoint; 0: pick a free port
  std::string worker_id;               // default: worker-<host>-<port>
  double speed = 1.0;
  absl::Duration step_timeout = absl::Seconds(120);
  // Key rows per chunk of a chunked backward (--step_tokens; core/planner/worker_memory.h).
  int64_t step_tokens = kDefaultStepTokens;
  absl::Duration shutdown_grace = absl::Seconds(1);  // in-flight RPCs, after jobs are cancelled
  // TLS files (--tls_cert/--tls_key/--tls_ca, --tls_server_name). Set: the server requires
  // client certificates signed by the CA (mTLS) and the registrar's channel to the coordinator
  // uses TLS with this certificate. Empty: insecure. See docs/security.md.
  RpcSecurityOptions security;
  // Sessions open at once and their file descriptors (--max_sessions; session_admission.h).
  SessionAdmissionOptions admission;
  // Upload/Download streams: at once, per client, idle time (--max_data_streams,
  // --max_data_streams_per_client, --stream_idle_timeout_s; stream_limits.h).
  StreamLimitOptions streams;
  // Threads for synchronous rpcs (--max_rpc_threads); more calls at once: RESOURCE_EXHAUSTED.
  int max_rpc_threads = 512;
  // Sent as "authorization: Bearer <worker_token>" with RegisterWorker and Heartbeat (what
  // dfa-coordinator --worker_token checks). Empty: none.
  std::string worker_token;
};

class WorkerDaemon {
 public:
  // INVALID_ARGUMENT naming the option; UNAVAILABLE when the backend cannot run here or the
  // address cannot be bound.
  static absl::StatusOr<std::unique_ptr<WorkerDaemon>> Start(const WorkerOptions& options);
  ~WorkerDaemon();

  void Shutdown();
  // Blocks until Shutdown has completed.
  void Wait();

  const std::string& worker_id() const;
  // This process's random boot id (RegisterWorkerRequest.boot_id), new at every start.
  const std::string& boot_id() const;
  // The bound gRPC address (host:port, with the real port) and the advertised one.
  const std::string& address() const;
  const std::string& advertised_address() const;
  int metrics_port() const;  // 0 when there is no metrics endpoint
  int64_t memory_limit_bytes() const;

  class Impl;

 private:
  explicit WorkerDaemon(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Parses "123", "64K", "512M", "8G", "1T" (powers of 1024; "KiB"/"MB" spellings accepted).
absl::StatusOr<int64_t> ParseBytes(const std::string& text);

// --device_memory_limit: a number in (0, 1] is a fraction of the device's total memory
// (*fraction set, *bytes 0); anything else is a size for ParseBytes ("40G"; *bytes set).
// INVALID_ARGUMENT naming device_memory_limit otherwise.
absl::Status ParseDeviceMemoryLimit(const std::string& text, int64_t* bytes, double* fraction);

}  // namespace dfa
