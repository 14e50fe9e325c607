// `dfa demo`: a whole cluster on this host (or, with --coordinator, a running one), one verified
// forward+backward job, then stop.
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cli/commands.h"
#include "client/cli/interrupt.h"
#include "client/cli/training_run.h"
#include "client/local_cluster.h"

namespace dfa::cli {
namespace {

// Flags that only make sense when the demo starts its own cluster.
constexpr const char* kLocalOnly[] = {"threads", "backend", "bin-dir", "log-dir"};

absl::Status RunOnCluster(const client::ClientOptions& options, const TrainingRunOptions& run) {
  auto c = client::Client::Connect(options);
  if (!c.ok()) return c.status();
  return RunTrainingJob(c->get(), run);
}

absl::Status Demo(Args& args) {
  TrainingRunOptions run;
  ASSIGN_OR_RETURN(std::string coordinator, args.GetString("coordinator", ""));
  client::LocalClusterOptions cluster;
  // Without --coordinator: the local cluster's size; with it, 0: every live worker.
  ASSIGN_OR_RETURN(run.job, ParseJobFlags(args, /*default_seq=*/2048,
                                          coordinator.empty() ? cluster.workers : 0));
  if (run.job.session.num_workers > 0) cluster.workers = run.job.session.num_workers;
  ASSIGN_OR_RETURN(int64_t threads, args.GetInt("threads", cluster.threads_per_worker, 0, 1024));
  cluster.threads_per_worker = static_cast<int>(threads);
  ASSIGN_OR_RETURN(cluster.backend, args.GetString("backend", cluster.backend));
  ASSIGN_OR_RETURN(cluster.bin_dir, args.GetString("bin-dir", ""));
  ASSIGN_OR_RETURN(cluster.log_dir, args.GetString("log-dir", ""));
  ASSIGN_OR_RETURN(bool no_verify, args.GetBool("no-verify", false));
  ASSIGN_OR_RETURN(std::string path, args.GetString("path", "auto"));
  ASSIGN_OR_RETURN(run.path, ParseTransferPath(path));
  ASSIGN_OR_RETURN(cluster.security, ParseSecurityFlags(args));
  RETURN_IF_ERROR(args.CheckNoUnknown());
  run.verify = !no_verify;

  if (!coordinator.empty()) {
    for (const char* flag : kLocalOnly) {
      if (args.Has(flag)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--", flag, " applies to the cluster the demo starts, not with --coordinator"));
      }
    }
    client::ClientOptions co;
    co.coordinator = coordinator;
    co.security = cluster.security;
    Interrupts::Install("dfa demo", Interrupts::Mode::kCleanUpAndExit);
    std::printf("dfa demo: against the cluster at %s\n", coordinator.c_str());
    return RunOnCluster(co, run);
  }

  // A Ctrl-C (SIGTERM, SIGHUP, or the output's reader gone: SIGPIPE) while the cluster
  // starts is acted on once it has (a half-started one cannot be stopped from here); the
  // daemons die with this process however it dies (client/child_process.h).
  Interrupts::Install("dfa demo", Interrupts::Mode::kFlagOnly);
  std::printf(
      "dfa demo: starting 1 coordinator and %d %s worker(s) (%d thread(s) each) on "
      "127.0.0.1\n",
      cluster.workers, cluster.backend.c_str(), cluster.threads_per_worker);
  const absl::Time t0 = absl::Now();
  ASSIGN_OR_RETURN(std::unique_ptr<client::LocalCluster> local,
                   client::LocalCluster::Start(cluster));
  // On an interrupt, after the job's session is given back: stop the daemons (their own
  // process group does not see the terminal's Ctrl-C).
  const int stop_on_interrupt =
      Interrupts::AddCleanup("stopping the local cluster", [&local] { (void)local->Stop(); });
  Interrupts::Install("dfa demo", Interrupts::Mode::kCleanUpAndExit);
  Interrupts::CleanUpAndExitIfRequested();
  std::printf("  coordinator %s; workers", local->coordinator_address().c_str());
  for (const auto& w : local->workers()) std::printf(" %s", w.address.c_str());
  std::printf("; ready in %.2f s; logs in %s\n", absl::ToDoubleSeconds(absl::Now() - t0),
              local->log_dir().c_str());
  if (cluster.security.tls() || !cluster.security.auth_token.empty()) {
    std::printf("  transport: %s%s\n", cluster.security.tls() ? "mTLS" : "insecure",
                cluster.security.auth_token.empty() ? "" : ", client token required");
  }

  run.job.session.num_workers = cluster.workers;
  const absl::Status job_status = RunOnCluster(local->client_options(), run);
  Interrupts::BlockIfExiting();
  Interrupts::RemoveCleanup(stop_on_interrupt);
  const absl::Time s0 = absl::Now();
  absl::Status stop_status = local->Stop();
  std::printf("stopped %d processes in %.2f s%s\n", cluster.workers + 1,
              absl::ToDoubleSeconds(absl::Now() - s0), stop_status.ok() ? " (clean)" : "");
  RETURN_IF_ERROR(job_status);
  if (!stop_status.ok()) {
    return absl::InternalError(
        absl::StrCat("a daemon did not stop cleanly: ", stop_status.message()));
  }
  return absl::OkStatus();
}

}  // namespace

CommandInfo DemoCommandInfo() {
  client::LocalClusterOptions defaults;
  return {
      "dfa",
      "dfa demo",
      "[flags]",
      "Starts a coordinator and N workers as processes on loopback (or uses the running cluster\n"
      "at --coordinator), runs a causal forward+backward job on random data, verifies it\n"
      "against single-device attention, prints throughput and each worker's idle fraction, and\n"
      "stops what it started. Exit status 0 only if all of it worked; Ctrl-C cancels the job,\n"
      "releases the session, stops the daemons and exits 130 (SIGTERM, SIGHUP likewise, and a\n"
      "closed output: `dfa demo | head -1` exits 141). The daemons never outlive dfa.",
      {{"Cluster",
        {CoordinatorFlag("run against this running cluster instead of starting one"),
         {"threads", "T",
          absl::StrCat("threads per worker (default ", defaults.threads_per_worker,
                       "; 0: the worker's default)")},
         {"backend", "cpu|cuda|cudnn|auto",
          absl::StrCat("workers' backend (default ", defaults.backend,
                       "; GPU backends: one worker per GPU)")},
         {"bin-dir", "DIR", "where dfa-coordinator and dfa-worker are (default: next to dfa)"},
         {"log-dir", "DIR", "daemon logs (default: a fresh /tmp/dfa-cluster-*)"},
         {"path", "auto|grpc|shm", "data path to the workers (default auto)"},
         {"no-verify", "", "skip the comparison with single-device attention"}}},
       JobFlagGroup(2048, absl::StrCat("workers to start (default ", defaults.workers,
                                       "); with --coordinator: to use (default all)")),
       SecurityFlagGroup()},
      "schedule heads: each worker all rows of a range of the kv heads, no worker traffic."};
}

int RunDemoCommand(int argc, char** argv) {
  return RunCommand(DemoCommandInfo(), argc, argv, 0, [](Args& args) {
    absl::Status s = Demo(args);
    if (s.ok()) {
      std::printf("dfa demo: PASS\n");
    } else if (s.code() != absl::StatusCode::kInvalidArgument) {
      std::fflush(stdout);
      std::fprintf(stderr, "dfa demo: FAILED\n");
    }
    return s;
  });
}

}  // namespace dfa::cli
