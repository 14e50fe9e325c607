// `dfa demo`: a whole cluster on this host, one verified forward+backward job, then stop.
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cli/commands.h"
#include "client/cli/training_run.h"
#include "client/local_cluster.h"

namespace dfa::cli {
namespace {

constexpr char kUsage[] =
    "usage: dfa demo [--workers N] [--seq S] [--heads H] [--kv-heads HK] [--head-dim D]\n"
    "                [--dtype bf16|f16|f32] [--causal|--full]\n"
    "                [--schedule balanced|ring|distflash|zigzag|heads]\n"
    "                (heads: each worker all rows of a range of the kv heads, no worker traffic)\n"
    "                [--threads T] [--backend cpu|cuda|auto] [--batch B] [--seed N] [--no-verify]\n"
    "                [--bin-dir DIR] [--log-dir DIR] [--path auto|grpc|shm]\n"
    "Starts a coordinator and N workers as processes on loopback, runs a causal forward+backward\n"
    "job on random data, verifies it against single-device attention, prints throughput and each\n"
    "worker's idle fraction, and stops everything. Exit status 0 only if all of it worked.\n";

absl::Status Demo(Args& args) {
  TrainingRunOptions run;
  ASSIGN_OR_RETURN(run.job, ParseJobFlags(args, /*default_seq=*/2048, /*default_workers=*/2));
  client::LocalClusterOptions cluster;
  cluster.workers = run.job.session.num_workers > 0 ? run.job.session.num_workers : 2;
  ASSIGN_OR_RETURN(int64_t threads, args.GetInt("threads", 1, 0, 1024));
  cluster.threads_per_worker = static_cast<int>(threads);
  ASSIGN_OR_RETURN(cluster.backend, args.GetString("backend", "cpu"));
  ASSIGN_OR_RETURN(cluster.bin_dir, args.GetString("bin-dir", ""));
  ASSIGN_OR_RETURN(cluster.log_dir, args.GetString("log-dir", ""));
  ASSIGN_OR_RETURN(bool no_verify, args.GetBool("no-verify", false));
  ASSIGN_OR_RETURN(std::string path, args.GetString("path", "auto"));
  ASSIGN_OR_RETURN(run.path, ParseTransferPath(path));
  ASSIGN_OR_RETURN(cluster.security, ParseSecurityFlags(args));
  RETURN_IF_ERROR(args.CheckNoUnknown());
  run.verify = !no_verify;

  std::printf("dfa demo: starting 1 coordinator and %d %s worker(s) (%d thread(s) each) on "
              "127.0.0.1\n", cluster.workers, cluster.backend.c_str(), cluster.threads_per_worker);
  const absl::Time t0 = absl::Now();
  ASSIGN_OR_RETURN(std::unique_ptr<client::LocalCluster> local, client::LocalCluster::Start(cluster));
  std::printf("  coordinator %s; workers", local->coordinator_address().c_str());
  for (const auto& w : local->workers()) std::printf(" %s", w.address.c_str());
  std::printf("; ready in %.2f s; logs in %s\n", absl::ToDoubleSeconds(absl::Now() - t0),
              local->log_dir().c_str());
  if (cluster.security.tls() || !cluster.security.auth_token.empty()) {
    std::printf("  transport: %s%s\n", cluster.security.tls() ? "mTLS" : "insecure",
                cluster.security.auth_token.empty() ? "" : ", client token required");
  }

  absl::Status job_status;
  {
    auto c = client::Client::Connect(local->client_options());
    job_status = c.ok() ? RunTrainingJob(c->get(), run) : c.status();
  }
  const absl::Time s0 = absl::Now();
  absl::Status stop_status = local->Stop();
  std::printf("stopped %d processes in %.2f s%s\n", cluster.workers + 1,
              absl::ToDoubleSeconds(absl::Now() - s0), stop_status.ok() ? " (clean)" : "");
  RETURN_IF_ERROR(job_status);
  if (!stop_status.ok()) {
    return absl::InternalError(absl::StrCat("a daemon did not stop cleanly: ", stop_status.message()));
  }
  return absl::OkStatus();
}

}  // namespace

int RunDemoCommand(int argc, char** argv) {
  auto args = Args::Parse(argc, argv, 0);
  if (!args.ok()) {
    std::fprintf(stderr, "dfa demo: %s\n%s", std::string(args.status().message()).c_str(), kUsage);
    return 2;
  }
  if (args->Has("help")) {
    std::printf("%s%s", kUsage, kSecurityUsage);
    return 0;
  }
  absl::Status s = Demo(*args);
  if (!s.ok()) {
    std::fflush(stdout);
    std::fprintf(stderr, "dfa demo: FAILED: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("dfa demo: PASS\n");
  return 0;
}

}  // namespace dfa::cli
