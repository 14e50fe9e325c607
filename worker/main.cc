// dfa-worker: the worker daemon. Flags in, WorkerDaemon (worker_daemon.h) runs, SIGTERM/SIGINT
// stop it cleanly. Prints "dfa-worker <id> listening on <addr>" on stdout once it serves; the
// operator log (core/log.h: start, registration, stop) goes to stderr.
#include <sys/resource.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/log.h"
#include "core/version.h"
#include "core/planner/worker_memory.h"
#include "worker/worker_daemon.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "gRPC listen address host:port (port 0: any free)");
ABSL_FLAG(std::string, advertise, "", "address the coordinator and clients use (default: listen)");
ABSL_FLAG(std::string, coordinator, "", "coordinator address host:port (empty: standalone)");
ABSL_FLAG(std::string, backend, "cpu",
          "attention backend: cpu, cuda (our kernels), cudnn (cuDNN fused attention) or auto");
ABSL_FLAG(int, threads, 0,
          "cpu backend threads per session (0: the CPUs this process may use: its affinity, "
          "lowered to its cgroup CPU limit)");
ABSL_FLAG(int, device, 0, "cuda device ordinal");
ABSL_FLAG(int64_t, memory_limit_bytes, 0,
          "session memory limit in bytes (0: 80% of RAM or the cgroup limit, whichever is "
          "lower, divided by --workers_per_host)");
ABSL_FLAG(std::string, memory_limit, "", "session memory limit with a unit, e.g. 8G, 512M");
ABSL_FLAG(std::string, device_memory_limit, "",
          "cuda/cudnn workers: device memory pool size, bytes with a unit (40G) or a fraction of "
          "the device's memory (0.5), so that another process can share the GPU (default: "
          "--memory_limit, else all free device memory but 8 GiB)");
ABSL_FLAG(int, metrics_port, -1, "Prometheus /metrics port (0: any free; -1: none)");
ABSL_FLAG(std::string, worker_id, "", "stable worker name (default worker-<host>-<port>)");
ABSL_FLAG(double, speed, 1.0, "relative speed reported to the planner");
ABSL_FLAG(int, step_timeout_s, 120, "seconds a plan step may wait for its data");
ABSL_FLAG(int64_t, step_tokens, dfa::kDefaultStepTokens,
          "key rows per chunk of a chunked backward (one worker owning its keys alone: P = 1, "
          "head groups of one): its fp32 dK, dV scratch (docs/memory.md)");
ABSL_FLAG(int, workers_per_host, 1,
          "workers sharing this host's memory: the default memory limit is divided by it");
ABSL_FLAG(int, max_sessions, 256,
          "sessions open at once (more, or too few file descriptors left: RESOURCE_EXHAUSTED)");
ABSL_FLAG(int, max_data_streams, 256,
          "Upload/Download streams open at once (more: RESOURCE_EXHAUSTED)");
ABSL_FLAG(int, max_data_streams_per_client, 64,
          "Upload/Download streams open at once per client_id (more: RESOURCE_EXHAUSTED)");
ABSL_FLAG(int, max_rpc_threads, 512,
          "threads serving unary rpcs at once (more calls: RESOURCE_EXHAUSTED)");
ABSL_FLAG(int, stream_idle_timeout_s, 60,
          "an Upload/Download stream moving no message this long is cancelled (0: never)");

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate; with --tls_key and --tls_ca: mTLS on every connection");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA: callers must present a certificate it signed; the coordinator is verified "
          "against it");
ABSL_FLAG(std::string, worker_token, "",
          "token sent with RegisterWorker/Heartbeat (dfa-coordinator --worker_token)");
ABSL_FLAG(std::string, worker_token_file, "",
          "file holding the worker token (instead of --worker_token, which shows in ps)");
ABSL_FLAG(std::string, tls_server_name, "",
          "name the coordinator's certificate is checked against (default: its address' host)");
ABSL_FLAG(std::string, log_level, "info",
          "lowest level of the operator log on stderr: info, warning or error");

namespace {

sigset_t StopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

}  // namespace

int main(int argc, char** argv) {
  dfa::InitProgramFlags("dfa-worker",
                        "DistFlashAttn Service worker daemon\n"
                        "usage: dfa-worker --coordinator=HOST:PORT [--listen=HOST:PORT] ...",
                        "worker/main.cc", argc, argv);
  absl::ParseCommandLine(argc, argv);
  auto level = dfa::ParseLogLevel(absl::GetFlag(FLAGS_log_level), "--log_level");
  if (!level.ok()) {
    std::cerr << "dfa-worker: " << level.status().message() << std::endl;
    return 2;
  }
  dfa::SetMinLogLevel(*level);
  // Block the stop signals in every thread; one thread waits for them synchronously.
  sigset_t stop = StopSignals();
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  // Sessions cost file descriptors (UCX): take what the hard limit allows. Admission refuses
  // sessions before the soft limit runs out (worker/session_admission.h).
  if (rlimit r{}; getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }

  dfa::WorkerOptions o;
  o.listen = absl::GetFlag(FLAGS_listen);
  o.advertise = absl::GetFlag(FLAGS_advertise);
  o.coordinator = absl::GetFlag(FLAGS_coordinator);
  o.backend = absl::GetFlag(FLAGS_backend);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.cuda_device = absl::GetFlag(FLAGS_device);
  o.memory_limit_bytes = absl::GetFlag(FLAGS_memory_limit_bytes);
  if (!absl::GetFlag(FLAGS_memory_limit).empty()) {
    auto bytes = dfa::ParseBytes(absl::GetFlag(FLAGS_memory_limit));
    if (!bytes.ok()) {
      std::cerr << "dfa-worker: " << bytes.status().message() << std::endl;
      return 2;
    }
    o.memory_limit_bytes = *bytes;
  }
  o.device_memory_limit = absl::GetFlag(FLAGS_device_memory_limit);
  o.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  o.worker_id = absl::GetFlag(FLAGS_worker_id);
  o.speed = absl::GetFlag(FLAGS_speed);
  o.step_timeout = absl::Seconds(absl::GetFlag(FLAGS_step_timeout_s));
  o.step_tokens = absl::GetFlag(FLAGS_step_tokens);
  o.workers_per_host = absl::GetFlag(FLAGS_workers_per_host);
  o.admission.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  o.streams.max_streams = absl::GetFlag(FLAGS_max_data_streams);
  o.streams.max_streams_per_client = absl::GetFlag(FLAGS_max_data_streams_per_client);
  o.streams.idle_timeout = absl::Seconds(absl::GetFlag(FLAGS_stream_idle_timeout_s));
  o.max_rpc_threads = absl::GetFlag(FLAGS_max_rpc_threads);
  o.security.cert_file = absl::GetFlag(FLAGS_tls_cert);
  o.security.key_file = absl::GetFlag(FLAGS_tls_key);
  o.security.ca_file = absl::GetFlag(FLAGS_tls_ca);
  o.security.server_name = absl::GetFlag(FLAGS_tls_server_name);
  o.worker_token = absl::GetFlag(FLAGS_worker_token);
  if (const std::string file = absl::GetFlag(FLAGS_worker_token_file); !file.empty()) {
    if (!o.worker_token.empty()) {
      std::cerr << "dfa-worker: --worker_token and --worker_token_file: give one" << std::endl;
      return 2;
    }
    auto token = dfa::ReadTokenFile(file, "--worker_token_file");
    if (!token.ok()) {
      std::cerr << "dfa-worker: " << token.status() << std::endl;
      return 2;
    }
    o.worker_token = *token;
  }

  auto daemon = dfa::WorkerDaemon::Start(o);
  if (!daemon.ok()) {
    DFA_LOG(ERROR) << "dfa-worker did not start: " << daemon.status();
    return daemon.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  const bool tls = o.security.tls();
  DFA_LOG(INFO) << dfa::VersionString("dfa-worker") << " " << (*daemon)->worker_id()
                << " started: gRPC on " << (*daemon)->address() << " (advertised "
                << (*daemon)->advertised_address() << "), metrics "
                << ((*daemon)->metrics_port() > 0
                        ? absl::StrCat("on port ", (*daemon)->metrics_port())
                        : std::string("off"))
                << ", backend " << o.backend << ", memory limit "
                << (*daemon)->memory_limit_bytes() << " bytes, coordinator "
                << (o.coordinator.empty() ? std::string("none (standalone)") : o.coordinator)
                << ", secure mode " << (tls ? "on (mTLS" : "off (insecure transport")
                << (o.worker_token.empty() ? "" : ", worker token") << ")";
  std::cout << "dfa-worker " << (*daemon)->worker_id() << " listening on "
            << (*daemon)->address();
  if ((*daemon)->metrics_port() > 0) std::cout << " metrics on :" << (*daemon)->metrics_port();
  std::cout << std::endl;

  int sig = 0;
  sigwait(&stop, &sig);
  const std::string id = (*daemon)->worker_id();
  DFA_LOG(INFO) << "dfa-worker " << id << " stopping (signal " << sig << ")";
  const absl::Time stop_start = absl::Now();
  (*daemon)->Shutdown();
  daemon->reset();
  DFA_LOG(INFO) << "dfa-worker " << id << " stopped in "
                << absl::Trunc(absl::Now() - stop_start, absl::Milliseconds(1));
  // Everything the daemon owned is released above. Skip the libraries' static teardown
  // (1-1.8 s after a job on a 2-core VM), so SIGTERM -> exit stays well under 1 s.
  std::cout.flush();
  std::_Exit(0);
}
