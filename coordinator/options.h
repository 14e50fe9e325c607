// Settings of one dfa-coordinator: leases, time-to-live, limits on client requests, deadlines.
// Filled from command-line flags by main.cc, or directly by tests (short leases).
#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "coordinator/client_lease.h"
#include "core/rpc_security.h"
#include "core/spec_validation.h"

namespace dfa {

// The spec limits (max_seq_len, max_batch, max_heads, max_documents: core/spec_validation.h)
// and the coordinator's own.
struct CoordinatorLimits : SpecLimits {
  int max_sessions = 1024;  // open sessions over all clients
  // Concurrent WatchJob streams over all clients and per client_id (RESOURCE_EXHAUSTED beyond).
  int max_watch_streams = 4096;
  int max_watch_streams_per_client = 256;
  // Threads serving synchronous rpcs at once (RESOURCE_EXHAUSTED beyond).
  int max_rpc_threads = 512;
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
  // Non-empty: client RPCs must carry metadata "authorization: Bearer <token>".
  std::string auth_token;
  // Non-empty: worker RPCs (RegisterWorker, Heartbeat) must carry "authorization: Bearer
  // <worker_token>", and a client RPC carrying it is refused (it is no client credential).
  // Must differ from auth_token. Empty: registration is open (docs/security.md).
  std::string worker_token;
  // How long RegisterWorker waits for a worker's address (and a live holder of its id) to
  // answer the reachability check (coordinator/worker_admission.h).
  absl::Duration register_check_timeout = absl::Seconds(1);
  // TLS files (--tls_cert/--tls_key/--tls_ca, optional --tls_server_name): when set, the server
  // requires client certificates signed by the CA (mTLS) and calls to workers use TLS with this
  // certificate. Empty: insecure. Its auth_token is unused (workers check no token).
  RpcSecurityOptions security;
  CoordinatorLimits limits;
  // Client leases (Coordinator.HoldLease): beat interval, timeout, grace, limits
  // (--client_lease_*_ms, --max_client_leases, --max_sessions_per_lease).
  ClientLeaseOptions client_lease;
};

}  // namespace dfa
