// `dfa cluster`: a coordinator and N workers on loopback that stay up until Ctrl-C: the one
// local-cluster launcher (LocalCluster) that deploy/local/cluster.sh runs too.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/cli/commands.h"
#include "client/cli/interrupt.h"
#include "client/cli/job_flags.h"
#include "client/local_cluster.h"

namespace dfa::cli {
namespace {

std::string MetricsUrl(int port) { return absl::StrCat("http://127.0.0.1:", port, "/metrics"); }

// The addresses in shell syntax (KEY=value lines), written whole (temporary file + rename).
absl::Status WriteEnvFile(const std::string& path, client::LocalCluster& c) {
  std::vector<std::string> workers, metrics, pids;
  pids.push_back(absl::StrCat(c.coordinator_process()->pid()));
  for (size_t i = 0; i < c.workers().size(); ++i) {
    workers.push_back(c.workers()[i].address);
    metrics.push_back(MetricsUrl(c.workers()[i].metrics_port));
    pids.push_back(absl::StrCat(c.worker_process(static_cast<int>(i))->pid()));
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << "DFA_RUN_DIR=" << c.log_dir() << "\n"
      << "DFA_COORDINATOR=" << c.coordinator_address() << "\n"
      << "DFA_COORDINATOR_METRICS=" << MetricsUrl(c.coordinator().metrics_port) << "\n"
      << "DFA_WORKERS=\"" << absl::StrJoin(workers, " ") << "\"\n"
      << "DFA_WORKER_METRICS=\"" << absl::StrJoin(metrics, " ") << "\"\n"
      << "DFA_PIDS=\"" << absl::StrJoin(pids, " ") << "\"\n";
    if (!f.good())
      return absl::InvalidArgumentError(absl::StrCat("--env-file: cannot write ", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--env-file: cannot rename ", tmp, " to ", path, ": ", ec.message()));
  }
  return absl::OkStatus();
}

// The first daemon that is no longer running ("" when all are).
std::string ExitedDaemon(client::LocalCluster& c, std::string* log_tail) {
  if (!c.coordinator_process()->Running()) {
    *log_tail = c.coordinator_process()->LogTail(15);
    return "dfa-coordinator";
  }
  for (size_t i = 0; i < c.workers().size(); ++i) {
    client::ChildProcess* p = c.worker_process(static_cast<int>(i));
    if (!p->Running()) {
      *log_tail = p->LogTail(15);
      return p->name();
    }
  }
  return "";
}

absl::Status Cluster(Args& args) {
  client::LocalClusterOptions o;
  ASSIGN_OR_RETURN(int64_t workers, args.GetInt("workers", o.workers, 1, 1024));
  ASSIGN_OR_RETURN(int64_t threads, args.GetInt("threads", o.threads_per_worker, 0, 1024));
  ASSIGN_OR_RETURN(o.backend, args.GetString("backend", o.backend));
  ASSIGN_OR_RETURN(o.memory_limit_bytes,
                   args.GetInt("memory-limit", o.memory_limit_bytes, 0, INT64_MAX));
  ASSIGN_OR_RETURN(o.bin_dir, args.GetString("bin-dir", ""));
  ASSIGN_OR_RETURN(o.log_dir, args.GetString("log-dir", ""));
  ASSIGN_OR_RETURN(std::string env_file, args.GetString("env-file", ""));
  ASSIGN_OR_RETURN(
      double start_timeout,
      args.GetDouble("start-timeout", absl::ToDoubleSeconds(o.start_timeout), 1, 3600));
  ASSIGN_OR_RETURN(o.security, ParseSecurityFlags(args));
  RETURN_IF_ERROR(args.CheckNoUnknown());
  o.workers = static_cast<int>(workers);
  o.threads_per_worker = static_cast<int>(threads);
  o.start_timeout = absl::Seconds(start_timeout);
  o.worker_args = args.rest();

  // Flag only: a Ctrl-C during the start is seen once it is done, and the cluster stopped.
  Interrupts::Install("dfa cluster", Interrupts::Mode::kFlagOnly);
  ASSIGN_OR_RETURN(std::unique_ptr<client::LocalCluster> c, client::LocalCluster::Start(o));
  if (env_file.empty()) env_file = absl::StrCat(c->log_dir(), "/cluster.env");
  if (absl::Status s = WriteEnvFile(env_file, *c); !s.ok()) {
    (void)c->Stop();
    return s;
  }
  std::printf("coordinator  %s   metrics %s\n", c->coordinator_address().c_str(),
              MetricsUrl(c->coordinator().metrics_port).c_str());
  for (size_t i = 0; i < c->workers().size(); ++i) {
    std::printf("worker-%zu     %s   metrics %s\n", i, c->workers()[i].address.c_str(),
                MetricsUrl(c->workers()[i].metrics_port).c_str());
  }
  const std::string threads_each =
      o.threads_per_worker > 0 ? absl::StrCat(o.threads_per_worker) : "the default number of";
  std::printf("%d %s worker(s), %s thread(s) each; logs in %s; addresses in %s\n", o.workers,
              o.backend.c_str(), threads_each.c_str(), c->log_dir().c_str(), env_file.c_str());
  std::printf("try: dfa demo --coordinator %s   (Ctrl-C stops the cluster)\n",
              c->coordinator_address().c_str());
  std::fflush(stdout);

  std::string log_tail;
  std::string exited;
  while (!Interrupts::WaitFor(absl::Milliseconds(200))) {
    exited = ExitedDaemon(*c, &log_tail);
    if (!exited.empty()) break;
  }
  if (!exited.empty()) {
    (void)c->Stop();
    return absl::UnavailableError(
        absl::StrCat(exited, " exited; stopped the cluster. Log tail:\n", log_tail));
  }
  const absl::Time t0 = absl::Now();
  const absl::Status stop = c->Stop();
  std::printf("stopped %d processes in %.2f s%s\n", o.workers + 1,
              absl::ToDoubleSeconds(absl::Now() - t0), stop.ok() ? " (clean)" : "");
  return stop;
}

}  // namespace

CommandInfo ClusterCommandInfo() {
  client::LocalClusterOptions d;
  return {
      "dfa",
      "dfa cluster",
      "[--workers N] [--threads T] [--backend B] [flags] [-- dfa-worker flags]",
      "Starts a coordinator and N workers as processes on free loopback ports, waits until the\n"
      "coordinator lists them all alive, prints their addresses and metrics URLs, writes them\n"
      "to an env file (shell syntax: DFA_COORDINATOR, DFA_WORKERS, DFA_COORDINATOR_METRICS,\n"
      "DFA_WORKER_METRICS, DFA_RUN_DIR, DFA_PIDS) and stays up. Ctrl-C (SIGTERM, SIGHUP, or\n"
      "stdout's reader gone) stops every daemon and exits 0; when a daemon exits on its own the\n"
      "others are stopped and the exit status is 1. The daemons die with dfa (even SIGKILL). Words after -- go to every dfa-worker. The same launcher (and defaults)\n"
      "as dfa demo, dfa bench, deploy/local/cluster.sh and Python's dfa.LocalCluster.",
      {{"Cluster",
        {{"workers", "N", absl::StrCat("workers to start (default ", d.workers, ")")},
         {"threads", "T",
          absl::StrCat("threads per worker (default ", d.threads_per_worker,
                       "; 0: the worker's default)")},
         {"backend", "cpu|cuda|cudnn|auto",
          absl::StrCat("workers' backend (default ", d.backend, "; GPU: one worker per GPU)")},
         {"memory-limit", "BYTES", "per worker, e.g. 8G (default 0: the worker's default)"},
         {"bin-dir", "DIR", "where dfa-coordinator and dfa-worker are (default: next to dfa)"},
         {"log-dir", "DIR", "logs and the env file (default: a fresh /tmp/dfa-cluster-*)"},
         {"env-file", "FILE", "where to write the addresses (default LOG_DIR/cluster.env)"},
         {"start-timeout", "SECONDS",
          absl::StrCat("how long to wait for the daemons (default ",
                       absl::ToDoubleSeconds(d.start_timeout), ")")}}},
       SecurityFlagGroup()},
      "Then: dfa status --coordinator \"$DFA_COORDINATOR\" --json"};
}

int RunClusterCommand(int argc, char** argv) {
  return RunCommand(ClusterCommandInfo(), argc, argv, 0, Cluster);
}

}  // namespace dfa::cli
