// A one-host cluster of real processes on loopback: one dfa-coordinator and N dfa-worker
// daemons, for `dfa demo`, `dfa bench` and the integration tests.
//
// Ports are chosen free (bound to port 0 and released) and passed on the command lines:
//   dfa-coordinator --listen=127.0.0.1:P --metrics_port=M [coordinator_args...]
//   dfa-worker --listen=127.0.0.1:P --advertise=127.0.0.1:P --coordinator=127.0.0.1:C
//              --worker_id=worker-I --backend=B --metrics_port=M [--threads=T]
//              [--memory_limit_bytes=L | --workers_per_host=N (cpu)] [worker_args...]
// With `security` set, every daemon also gets --tls_cert/--tls_key/--tls_ca (and
// --tls_server_name), the coordinator --auth_token, and the cluster's own readiness calls use
// the same credentials (docs/security.md).
// Readiness is observed through the protocol, not log lines: the coordinator answers GetStatus
// and lists all N workers alive. Logs go to <log_dir>/{coordinator,worker-I}.log.
//
// Binaries: `bin_dir` when set, else $DFA_BIN_DIR, else found relative to /proc/self/exe
// (build/client/dfa -> build/coordinator/dfa-coordinator, build/worker/dfa-worker; tests in
// build/tests/<dir>/ look two levels up).
// Thread safety: none (one owner). Destruction stops every process.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/child_process.h"
#include "client/client.h"
#include "core/status.h"

namespace dfa::client {

// The defaults here are the local cluster's defaults everywhere: `dfa demo`, `dfa bench`,
// `dfa cluster` (and so deploy/local/cluster.sh) and Python's dfa.LocalCluster all start from
// LocalClusterOptions{}.
struct LocalClusterOptions {
  int workers = 2;
  std::string backend = "cpu";
  int threads_per_worker = 1;      // 0: the worker's default
  int64_t memory_limit_bytes = 0;  // 0: the worker's default
  std::string bin_dir;
  std::string log_dir;             // empty: a fresh directory under $TMPDIR or /tmp
  absl::Duration start_timeout = absl::Seconds(30);
  absl::Duration stop_grace = absl::Seconds(10);
  std::vector<std::string> coordinator_args;
  std::vector<std::string> worker_args;
  // TLS files for every daemon (and this cluster's own client); auth_token: the coordinator
  // requires it from clients. Empty: insecure, no token (the demo's default).
  RpcSecurityOptions security;
};

struct DaemonEndpoint {
  std::string address;  // gRPC host:port
  int metrics_port = 0;
};

class LocalCluster {
 public:
  // Starts everything and waits until ready; on failure stops what started and returns the
  // reason with the failing daemon's log tail.
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(const LocalClusterOptions& options);
  ~LocalCluster();

  const std::string& coordinator_address() const { return coordinator_.address; }
  const DaemonEndpoint& coordinator() const { return coordinator_; }
  const std::vector<DaemonEndpoint>& workers() const { return workers_; }
  const std::string& log_dir() const { return log_dir_; }
  // Client options that reach this cluster (coordinator address and security).
  ClientOptions client_options() const;
  ChildProcess* worker_process(int i) { return worker_procs_[static_cast<size_t>(i)].get(); }
  ChildProcess* coordinator_process() { return coordinator_proc_.get(); }

  // Starts one more worker (id worker-<n>) and waits until the coordinator lists it alive.
  absl::Status AddWorker();
  // Kills the coordinator (SIGKILL: no goodbye) and starts a new one on the same address with
  // the same flags; the workers re-register with it on their next heartbeat. Returns once it
  // lists every running worker alive (fault tests: a restarted coordinator).
  absl::Status RestartCoordinator();
  // Stops all daemons (workers first). Returns the first unclean exit, if any. Idempotent.
  absl::Status Stop();

  // Where the daemon binaries are, per the rules above.
  static absl::StatusOr<std::string> FindBinary(const std::string& bin_dir,
                                                const std::string& component,
                                                const std::string& name);
  // A TCP port on 127.0.0.1 free at the time of the call.
  static absl::StatusOr<int> FreePort();

 private:
  // One attempt of Start(); Start() retries when a daemon lost its port to another process
  // between FreePort() and its bind (ports are picked, then handed to the daemon by flag).
  static absl::StatusOr<std::unique_ptr<LocalCluster>> StartOnce(const LocalClusterOptions& options);
  explicit LocalCluster(LocalClusterOptions options) : options_(std::move(options)) {}
  absl::Status StartCoordinator(int port = 0);  // 0: a free port
  absl::Status StartWorker(int index);
  absl::Status WaitForWorkers(int n, absl::Duration timeout);

  LocalClusterOptions options_;
  std::string log_dir_;
  std::string coordinator_bin_, worker_bin_;
  DaemonEndpoint coordinator_;
  std::vector<DaemonEndpoint> workers_;
  std::unique_ptr<ChildProcess> coordinator_proc_;
  std::vector<std::unique_ptr<ChildProcess>> worker_procs_;
  bool stopped_ = false;
};

}  // namespace dfa::client
