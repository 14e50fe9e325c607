// `dfa submit`: one job against a running cluster; `dfa status`; `dfa workers`.
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "client/cli/commands.h"
#include "client/cli/training_run.h"

namespace dfa::cli {
namespace {

constexpr char kSubmitUsage[] =
    "usage: dfa submit --coordinator HOST:PORT [--workers N] [--seq S] [--heads H] [--kv-heads HK]\n"
    "                  [--head-dim D] [--dtype bf16|f16|f32] [--causal|--full] [--schedule NAME]\n"
    "                  [--batch B] [--seed N] [--forward-only] [--verify] [--path auto|grpc|shm]\n"
    "                  [--retries N]\n"
    "Runs a forward (+ backward) job on random data against a running cluster and prints its\n"
    "throughput and idle fractions; --verify compares with single-device attention.\n";
constexpr char kStatusUsage[] =
    "usage: dfa status --coordinator HOST:PORT [--job JOB_ID]\n"
    "Prints the cluster summary, or one job's state.\n";
constexpr char kWorkersUsage[] =
    "usage: dfa workers --coordinator HOST:PORT\nLists the registered workers.\n";

int Fail(const char* cmd, const absl::Status& s, const char* usage) {
  std::fflush(stdout);
  std::fprintf(stderr, "dfa %s: %s\n", cmd, s.ToString().c_str());
  if (s.code() == absl::StatusCode::kInvalidArgument && usage) std::fprintf(stderr, "%s", usage);
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

absl::StatusOr<std::unique_ptr<client::Client>> ConnectFromArgs(Args& args) {
  ASSIGN_OR_RETURN(std::string addr, args.GetString("coordinator", ""));
  if (addr.empty()) return absl::InvalidArgumentError("--coordinator HOST:PORT is required");
  client::ClientOptions o;
  o.coordinator = addr;
  ASSIGN_OR_RETURN(o.security, ParseSecurityFlags(args));
  return client::Client::Connect(o);
}

absl::Status Submit(Args& args) {
  ASSIGN_OR_RETURN(auto c, ConnectFromArgs(args));
  TrainingRunOptions run;
  ASSIGN_OR_RETURN(run.job, ParseJobFlags(args, 4096, 0));
  ASSIGN_OR_RETURN(bool forward_only, args.GetBool("forward-only", false));
  ASSIGN_OR_RETURN(run.verify, args.GetBool("verify", false));
  ASSIGN_OR_RETURN(std::string path, args.GetString("path", "auto"));
  ASSIGN_OR_RETURN(run.path, ParseTransferPath(path));
  ASSIGN_OR_RETURN(int64_t retries, args.GetInt("retries", 1, 0, 100));
  RETURN_IF_ERROR(args.CheckNoUnknown());
  run.backward = !forward_only;
  run.max_retries = static_cast<int>(retries);
  return RunTrainingJob(c.get(), run);
}

const char* StateName(v1::JobState s) {
  switch (s) {
    case v1::JOB_QUEUED: return "queued";
    case v1::JOB_RUNNING: return "running";
    case v1::JOB_SUCCEEDED: return "succeeded";
    case v1::JOB_FAILED: return "failed";
    case v1::JOB_CANCELLED: return "cancelled";
    default: return "unknown";
  }
}

absl::Status Status(Args& args) {
  ASSIGN_OR_RETURN(auto c, ConnectFromArgs(args));
  ASSIGN_OR_RETURN(std::string job_id, args.GetString("job", ""));
  RETURN_IF_ERROR(args.CheckNoUnknown());
  if (!job_id.empty()) {
    ASSIGN_OR_RETURN(v1::Job job, c->GetJob(job_id));
    std::printf("job %s (session %s): %s, %s, %d/%d steps\n", job.job_id().c_str(),
                job.session_id().c_str(), job.kind() == v1::JOB_BACKWARD ? "backward" : "forward",
                StateName(job.state()), job.steps_done(), job.steps_total());
    if (job.state() == v1::JOB_FAILED) {
      std::printf("  error %d: %s\n", job.error_code(), job.error_message().c_str());
    }
    if (job.state() == v1::JOB_SUCCEEDED) PrintJobReport("job", job);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(v1::ClusterStatus s, c->GetStatus());
  std::printf("coordinator %s\n", c->options().coordinator.c_str());
  std::printf("  live workers   %d\n  sessions       %d\n  jobs running   %d\n  jobs queued    %d\n"
              "  memory         %.1f / %.1f MiB\n",
              s.live_workers(), s.sessions(), s.jobs_running(), s.jobs_queued(),
              s.memory_used_bytes() / 1048576.0, s.memory_limit_bytes() / 1048576.0);
  return absl::OkStatus();
}

absl::Status Workers(Args& args) {
  ASSIGN_OR_RETURN(auto c, ConnectFromArgs(args));
  RETURN_IF_ERROR(args.CheckNoUnknown());
  ASSIGN_OR_RETURN(v1::ListWorkersResponse list, c->ListWorkers());
  std::printf("%-16s %-22s %-12s %-6s %-10s %8s %20s %10s\n", "WORKER", "ADDRESS", "HOST", "BACKEND",
              "DEVICE", "SPEED", "MEMORY USED/LIMIT MiB", "LAST SEEN");
  for (const auto& w : list.workers()) {
    std::printf("%-16s %-22s %-12s %-6s %-10s %8.2f %9.1f/%-10.1f %8.2fs%s\n", w.worker_id().c_str(),
                w.address().c_str(), w.host().c_str(), w.backend().c_str(), w.device().c_str(),
                w.speed(), w.memory_used_bytes() / 1048576.0, w.memory_limit_bytes() / 1048576.0,
                w.last_seen_seconds(), w.alive() ? "" : "  (lost)");
  }
  std::printf("%d worker(s)\n", list.workers_size());
  return absl::OkStatus();
}

template <typename Fn>
int RunCommand(const char* name, const char* usage, int argc, char** argv, Fn fn) {
  auto args = Args::Parse(argc, argv, 0);
  if (!args.ok()) return Fail(name, args.status(), usage);
  if (args->Has("help")) {
    std::printf("%s%s", usage, kSecurityUsage);
    return 0;
  }
  absl::Status s = fn(*args);
  return s.ok() ? 0 : Fail(name, s, usage);
}

}  // namespace

int RunSubmitCommand(int argc, char** argv) {
  return RunCommand("submit", kSubmitUsage, argc, argv, Submit);
}
int RunStatusCommand(int argc, char** argv) {
  return RunCommand("status", kStatusUsage, argc, argv, Status);
}
int RunWorkersCommand(int argc, char** argv) {
  return RunCommand("workers", kWorkersUsage, argc, argv, Workers);
}

}  // namespace dfa::cli
