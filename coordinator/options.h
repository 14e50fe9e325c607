// Settings of one dfa-coordinator: leases, time-to-live, limits on client requests, deadlines.
// Filled from command-line flags by main.cc, or directly by tests (short leases).
#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "core/rpc_security.h"
#include "core/spec_validation.h"

namespace dfa {

// The spec limits (max_seq_len, max_batch, max_heads: core/spec_validation.h) and the
// coordinator's own.
struct CoordinatorLimits : SpecLimits {
  int max_sessions = 1024;  // open sessions over all clients
  int max_client_id_len = 256;
  int max_ttl_seconds = 7 * 24 * 3600;
};

struct CoordinatorOptions {
  // gRPC listen address, host:port; port 0 picks a free port (CoordinatorServer::address()).
  std::string listen = "0.0.0.0:7070";
  // Prometheus /metrics port: -1 disabled, 0 a free port, otherwise that port.
  int metrics_port = -1;
  // A worker is dropped after one lease without a heartbeat; workers heartbeat at lease/3.
  absl::Duration lease = absl::Seconds(3);
  // Default session time-to-live after its last activity (request ttl_seconds overrides).
  absl::Duration session_ttl = absl::Minutes(10);
  // Deadline of control calls to workers (OpenSession, CloseSession, CancelJob).
  absl::Duration rpc_timeout = absl::Seconds(10);
  // Deadline of one worker's RunJob call.
  absl::Duration job_timeout = absl::Hours(1);
  // How often leases and time-to-live are checked.
  absl::Duration tick = absl::Milliseconds(100);
  // Finished jobs kept for GetJob/WatchJob (oldest finished forgotten first).
  int max_retained_jobs = 10000;
  // Non-empty: client RPCs must carry metadata "authorization: Bearer <token>". Worker RPCs
  // (RegisterWorker, Heartbeat) are cluster-internal and not checked.
  std::string auth_token;
  // TLS files (--tls_cert/--tls_key/--tls_ca, optional --tls_server_name): when set, the server
  // requires client certificates signed by the CA (mTLS) and calls to workers use TLS with this
  // certificate. Empty: insecure. Its auth_token is unused (workers check no token).
  RpcSecurityOptions security;
  CoordinatorLimits limits;
};

}  // namespace dfa
