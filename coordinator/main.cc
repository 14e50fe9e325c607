// dfa-coordinator: the cluster's coordinator daemon. See coordinator_server.h and
// docs/coordinator.md. Stops cleanly on SIGTERM or SIGINT.
#include <pthread.h>

#include <csignal>
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/coordinator_server.h"
#include "core/log.h"
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
ABSL_FLAG(int64_t, max_documents, int64_t{1} << 20,
          "most packed documents a session's spec may hold (spec.doc_offsets, all batch rows "
          "together)");
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
ABSL_FLAG(std::string, auth_token_file, "",
          "file holding the client token (instead of --auth_token, which shows in ps)");
ABSL_FLAG(std::string, worker_token, "",
          "if set, RegisterWorker/Heartbeat must carry 'authorization: Bearer <worker token>' "
          "(dfa-worker --worker_token); must differ from --auth_token");
ABSL_FLAG(std::string, worker_token_file, "",
          "file holding the worker token (instead of --worker_token, which shows in ps)");
ABSL_FLAG(int, client_lease_beat_ms, 1000,
          "client leases: clients beat this often on their HoldLease stream");
ABSL_FLAG(int, client_lease_timeout_ms, 5000,
          "client leases: a lease without a beat for this long is lost");
ABSL_FLAG(int, client_lease_grace_ms, 5000,
          "client leases: a lost lease (stream broken, or no beat) waits this long for its "
          "client to re-attach, then its sessions are released");
ABSL_FLAG(int, max_client_leases, 4096, "client leases held at once (more: RESOURCE_EXHAUSTED)");
ABSL_FLAG(int, max_sessions_per_lease, 1024,
          "sessions one client lease may hold (more: RESOURCE_EXHAUSTED)");
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
ABSL_FLAG(std::string, log_level, "info",
          "lowest level of the operator log on stderr: info, warning or error");

namespace {

// The token of `flag` or of its file flag `file_flag` (one of them, or neither: ""); false with
// the reason on stderr when both are given or the file cannot be used.
bool TokenFromFlags(const std::string& value, const std::string& file, const char* flag,
                    std::string* token) {
  *token = value;
  if (file.empty()) return true;
  if (!value.empty()) {
    std::fprintf(stderr, "dfa-coordinator: --%s and --%s_file: give one\n", flag, flag);
    return false;
  }
  absl::StatusOr<std::string> read = dfa::ReadTokenFile(file, absl::StrCat("--", flag, "_file"));
  if (!read.ok()) {
    std::fprintf(stderr, "dfa-coordinator: %s\n", read.status().ToString().c_str());
    return false;
  }
  *token = *read;
  return true;
}

// "on (mTLS with client certificates, client token, worker token)" or "off (...)".
std::string SecureMode(const dfa::CoordinatorOptions& o) {
  std::string parts;
  auto add = [&parts](const char* p) { absl::StrAppend(&parts, parts.empty() ? "" : ", ", p); };
  if (o.security.tls()) add("mTLS with client certificates");
  if (!o.auth_token.empty()) add("client token");
  if (!o.worker_token.empty()) add("worker token");
  if (parts.empty()) return "off (insecure transport, no token)";
  return absl::StrCat(o.security.tls() ? "on" : "off", " (", parts, ")");
}

}  // namespace

int main(int argc, char** argv) {
  dfa::InitProgramFlags("dfa-coordinator",
                        "DistFlashAttn Service coordinator daemon\n"
                        "usage: dfa-coordinator [--listen=HOST:PORT] [--lease_ms=MS] ...",
                        "coordinator/main.cc", argc, argv);
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<dfa::LogLevel> level =
      dfa::ParseLogLevel(absl::GetFlag(FLAGS_log_level), "--log_level");
  if (!level.ok()) {
    std::fprintf(stderr, "dfa-coordinator: %s\n", std::string(level.status().message()).c_str());
    return 2;
  }
  dfa::SetMinLogLevel(*level);

  dfa::CoordinatorOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.lease = absl::Milliseconds(absl::GetFlag(FLAGS_lease_ms));
  options.session_ttl = absl::Seconds(absl::GetFlag(FLAGS_session_ttl_s));
  options.rpc_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_rpc_timeout_ms));
  options.job_timeout = absl::Seconds(absl::GetFlag(FLAGS_job_timeout_s));
  options.max_retained_jobs = absl::GetFlag(FLAGS_max_retained_jobs);
  if (!TokenFromFlags(absl::GetFlag(FLAGS_auth_token), absl::GetFlag(FLAGS_auth_token_file),
                      "auth_token", &options.auth_token) ||
      !TokenFromFlags(absl::GetFlag(FLAGS_worker_token), absl::GetFlag(FLAGS_worker_token_file),
                      "worker_token", &options.worker_token)) {
    return 2;
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
  options.limits.max_documents = absl::GetFlag(FLAGS_max_documents);
  if (options.limits.max_documents < 1) {
    std::fprintf(stderr, "dfa-coordinator: --max_documents: must be >= 1, got %lld\n",
                 static_cast<long long>(options.limits.max_documents));
    return 2;
  }
  options.limits.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  options.limits.max_watch_streams = absl::GetFlag(FLAGS_max_watch_streams);
  options.limits.max_watch_streams_per_client = absl::GetFlag(FLAGS_max_watch_streams_per_client);
  options.limits.max_rpc_threads = absl::GetFlag(FLAGS_max_rpc_threads);
  options.client_lease.beat_interval =
      absl::Milliseconds(absl::GetFlag(FLAGS_client_lease_beat_ms));
  options.client_lease.timeout = absl::Milliseconds(absl::GetFlag(FLAGS_client_lease_timeout_ms));
  options.client_lease.grace = absl::Milliseconds(absl::GetFlag(FLAGS_client_lease_grace_ms));
  options.client_lease.max_leases = absl::GetFlag(FLAGS_max_client_leases);
  options.client_lease.max_sessions_per_lease = absl::GetFlag(FLAGS_max_sessions_per_lease);

  // SIGTERM/SIGINT are blocked before any thread starts (threads inherit the mask) and taken
  // synchronously by sigwait below, so shutdown runs on the main thread, not in a handler.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  dfa::CoordinatorServer server(options);
  if (absl::Status s = server.Start(); !s.ok()) {
    DFA_LOG(ERROR) << "dfa-coordinator did not start: " << s;
    return 1;
  }
  DFA_LOG(INFO) << dfa::VersionString("dfa-coordinator") << " started: gRPC on "
                << server.address() << ", metrics "
                << (server.metrics_port() >= 0 ? absl::StrCat("on port ", server.metrics_port())
                                               : std::string("off"))
                << ", secure mode " << SecureMode(options) << ", lease "
                << absl::GetFlag(FLAGS_lease_ms) << " ms, session ttl "
                << absl::GetFlag(FLAGS_session_ttl_s) << " s";
  if (!options.auth_token.empty() && options.worker_token.empty()) {
    DFA_LOG(WARNING) << "--auth_token without --worker_token: any process that reaches this "
                        "port can register as a worker and receive clients' tensors";
  }
  // The ready lines on stdout are what launchers and scripts wait for; the log is on stderr.
  std::printf("dfa-coordinator listening on %s\n", server.address().c_str());
  if (server.metrics_port() >= 0) {
    std::printf("dfa-coordinator metrics on port %d\n", server.metrics_port());
  }
  std::fflush(stdout);
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  DFA_LOG(INFO) << "dfa-coordinator stopping (signal " << signal_number << ")";
  const absl::Time stop_start = absl::Now();
  server.Shutdown();
  DFA_LOG(INFO) << "dfa-coordinator stopped in " << absl::Trunc(absl::Now() - stop_start,
                                                                absl::Milliseconds(1));
  return 0;
}
