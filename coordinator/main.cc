// dfa-coordinator: the cluster's coordinator daemon. See coordinator_server.h and
// docs/coordinator.md. Stops cleanly on SIGTERM or SIGINT.
#include <pthread.h>

#include <csignal>
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "coordinator/coordinator_server.h"
#include "core/version.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:7070", "gRPC listen address host:port (port 0: any)");
ABSL_FLAG(int, metrics_port, -1, "Prometheus /metrics port (-1 off, 0 any free port)");
ABSL_FLAG(int, lease_ms, 3000, "worker lease: dropped after this long without a heartbeat");
ABSL_FLAG(int, session_ttl_s, 600, "default session time-to-live after its last activity");
ABSL_FLAG(int, rpc_timeout_ms, 10000, "deadline of control calls to workers");
ABSL_FLAG(int, job_timeout_s, 3600, "deadline of one worker's part of a job");
ABSL_FLAG(int64_t, max_seq_len, int64_t{1} << 22, "largest seq_len a session may have");
ABSL_FLAG(int, max_batch, 1024, "largest batch a session may have");
ABSL_FLAG(int, max_heads, 1024, "largest q_heads / kv_heads a session may have");
ABSL_FLAG(int, max_sessions, 1024, "open sessions the coordinator holds at most");
ABSL_FLAG(int, max_retained_jobs, 10000, "finished jobs kept for GetJob/WatchJob");
ABSL_FLAG(int, max_watch_streams, 4096,
          "WatchJob streams open at once over all clients (more: RESOURCE_EXHAUSTED)");
ABSL_FLAG(int, max_rpc_threads, 512,
          "threads serving unary rpcs at once (more calls: RESOURCE_EXHAUSTED)");
ABSL_FLAG(int, max_watch_streams_per_client, 256,
          "WatchJob streams open at once per client_id (more: RESOURCE_EXHAUSTED)");
ABSL_FLAG(std::string, auth_token, "",
          "if set, client RPCs must carry metadata 'authorization: Bearer <token>'");
ABSL_FLAG(std::string, worker_token, "",
          "if set, RegisterWorker/Heartbeat must carry 'authorization: Bearer <worker token>' "
          "(dfa-worker --worker_token); must differ from --auth_token");
ABSL_FLAG(std::string, worker_token_file, "",
          "file holding the worker token (instead of --worker_token, which shows in ps)");
ABSL_FLAG(int, register_check_timeout_ms, 1000,
          "how long RegisterWorker waits for the worker's address to answer its check");

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate; with --tls_key and --tls_ca: mTLS on every connection");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA: clients and workers must present a certificate it signed; workers are "
          "verified against it");
ABSL_FLAG(std::string, tls_server_name, "",
          "name workers' certificates are checked against (default: the host of their address)");

int main(int argc, char** argv) {
  dfa::InitProgramFlags("dfa-coordinator",
                        "DistFlashAttn Service coordinator daemon\n"
                        "usage: dfa-coordinator [--listen=HOST:PORT] [--lease_ms=MS] ...",
                        "coordinator/main.cc", argc, argv);
  absl::ParseCommandLine(argc, argv);

  dfa::CoordinatorOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.lease = absl::Milliseconds(absl::GetFlag(FLAGS_lease_ms));
  options.session_ttl = absl::Seconds(absl::GetFlag(FLAGS_session_ttl_s));
  options.rpc_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_rpc_timeout_ms));
  options.job_timeout = absl::Seconds(absl::GetFlag(FLAGS_job_timeout_s));
  options.max_retained_jobs = absl::GetFlag(FLAGS_max_retained_jobs);
  options.auth_token = absl::GetFlag(FLAGS_auth_token);
  options.worker_token = absl::GetFlag(FLAGS_worker_token);
  if (const std::string file = absl::GetFlag(FLAGS_worker_token_file); !file.empty()) {
    if (!options.worker_token.empty()) {
      std::fprintf(stderr, "dfa-coordinator: --worker_token and --worker_token_file: give one\n");
      return 1;
    }
    absl::StatusOr<std::string> token = dfa::ReadTokenFile(file, "--worker_token_file");
    if (!token.ok()) {
      std::fprintf(stderr, "dfa-coordinator: %s\n", token.status().ToString().c_str());
      return 1;
    }
    options.worker_token = *token;
  }
  options.register_check_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_register_check_timeout_ms));
  options.security.cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.security.key_file = absl::GetFlag(FLAGS_tls_key);
  options.security.ca_file = absl::GetFlag(FLAGS_tls_ca);
  options.security.server_name = absl::GetFlag(FLAGS_tls_server_name);
  options.limits.max_seq_len = absl::GetFlag(FLAGS_max_seq_len);
  options.limits.max_batch = absl::GetFlag(FLAGS_max_batch);
  options.limits.max_heads = absl::GetFlag(FLAGS_max_heads);
  options.limits.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  options.limits.max_watch_streams = absl::GetFlag(FLAGS_max_watch_streams);
  options.limits.max_watch_streams_per_client = absl::GetFlag(FLAGS_max_watch_streams_per_client);
  options.limits.max_rpc_threads = absl::GetFlag(FLAGS_max_rpc_threads);

  // SIGTERM/SIGINT are blocked before any thread starts (threads inherit the mask) and taken
  // synchronously by sigwait below, so shutdown runs on the main thread, not in a handler.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  dfa::CoordinatorServer server(options);
  if (absl::Status s = server.Start(); !s.ok()) {
    std::fprintf(stderr, "dfa-coordinator: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("dfa-coordinator listening on %s\n", server.address().c_str());
  std::printf("dfa-coordinator transport: %s%s%s\n",
              options.security.tls() ? "mTLS (client certificates required)" : "insecure",
              options.auth_token.empty() ? "" : ", client token required",
              options.worker_token.empty() ? "" : ", worker token required to register");
  if (!options.auth_token.empty() && options.worker_token.empty()) {
    std::printf("dfa-coordinator: warning: --auth_token without --worker_token: any process "
                "that reaches this port can register as a worker and receive clients' tensors\n");
  }
  if (server.metrics_port() >= 0) {
    std::printf("dfa-coordinator metrics on port %d\n", server.metrics_port());
  }
  std::fflush(stdout);
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  std::printf("dfa-coordinator: stopping\n");
  std::fflush(stdout);
  server.Shutdown();
  return 0;
}
