// `dfa status` (the cluster summary, or one job) and `dfa workers`, as text or --json.
#include <cstdio>

#include "client/cli/commands.h"
#include "client/cli/json_writer.h"
#include "client/cli/training_run.h"
#include "core/job_labels.h"

namespace dfa::cli {
namespace {

std::string JobJson(const v1::Job& job) {
  std::vector<std::string> workers;
  for (const auto& w : job.workers()) {
    workers.push_back(JsonObject()
                          .Int("rank", w.rank())
                          .Num("busy_seconds", w.busy_seconds())
                          .Num("idle_seconds", w.idle_seconds())
                          .Int("bytes_sent", w.bytes_sent())
                          .Int("bytes_received", w.bytes_received())
                          .Int("kernel_launches", w.kernel_launches())
                          .str());
  }
  return JsonObject()
      .Str("job_id", job.job_id())
      .Str("session_id", job.session_id())
      .Str("kind", v1::JobKind_Name(job.kind()))
      .Str("state", v1::JobState_Name(job.state()))
      .Int("steps_done", job.steps_done())
      .Int("steps_total", job.steps_total())
      .Int("error_code", job.error_code())
      .Str("error_message", job.error_message())
      .Num("wall_seconds", job.wall_seconds())
      .Num("flops", job.flops())
      .Raw("workers", JsonArray(workers))
      .str();
}

absl::Status Status(Args& args) {
  ASSIGN_OR_RETURN(auto c, ConnectFromArgs(args));
  ASSIGN_OR_RETURN(std::string job_id, args.GetString("job", ""));
  ASSIGN_OR_RETURN(bool json, args.GetBool("json", false));
  RETURN_IF_ERROR(args.CheckNoUnknown());
  if (!job_id.empty()) {
    ASSIGN_OR_RETURN(v1::Job job, c->GetJob(job_id));
    if (json) {
      std::printf("%s\n", JobJson(job).c_str());
      return absl::OkStatus();
    }
    std::printf("job %s (session %s): %s, %s, %d/%d steps\n", job.job_id().c_str(),
                job.session_id().c_str(), job.kind() == v1::JOB_BACKWARD ? "backward" : "forward",
                JobStateLabel(job.state()).c_str(), job.steps_done(), job.steps_total());
    if (job.state() == v1::JOB_FAILED) {
      std::printf("  error %d: %s\n", job.error_code(), job.error_message().c_str());
    }
    if (job.state() == v1::JOB_SUCCEEDED) PrintJobReport("job", job);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(v1::ClusterStatus s, c->GetStatus());
  if (json) {
    std::printf("%s\n", JsonObject()
                            .Str("coordinator", c->options().coordinator)
                            .Int("live_workers", s.live_workers())
                            .Int("sessions", s.sessions())
                            .Int("jobs_running", s.jobs_running())
                            .Int("jobs_queued", s.jobs_queued())
                            .Int("client_leases", s.client_leases())
                            .Int("memory_used_bytes", s.memory_used_bytes())
                            .Int("memory_limit_bytes", s.memory_limit_bytes())
                            .str()
                            .c_str());
    return absl::OkStatus();
  }
  std::printf("coordinator %s\n", c->options().coordinator.c_str());
  std::printf(
      "  live workers   %d\n  sessions       %d\n  jobs running   %d\n  jobs queued    %d\n"
      "  client leases  %d\n  memory         %.1f / %.1f MiB\n",
      s.live_workers(), s.sessions(), s.jobs_running(), s.jobs_queued(), s.client_leases(),
      s.memory_used_bytes() / 1048576.0, s.memory_limit_bytes() / 1048576.0);
  return absl::OkStatus();
}

absl::Status Workers(Args& args) {
  ASSIGN_OR_RETURN(auto c, ConnectFromArgs(args));
  ASSIGN_OR_RETURN(bool json, args.GetBool("json", false));
  RETURN_IF_ERROR(args.CheckNoUnknown());
  ASSIGN_OR_RETURN(v1::ListWorkersResponse list, c->ListWorkers());
  if (json) {
    std::vector<std::string> workers;
    for (const auto& w : list.workers()) {
      workers.push_back(JsonObject()
                            .Str("worker_id", w.worker_id())
                            .Str("address", w.address())
                            .Str("host", w.host())
                            .Str("backend", w.backend())
                            .Str("device", w.device())
                            .Int("memory_limit_bytes", w.memory_limit_bytes())
                            .Int("memory_used_bytes", w.memory_used_bytes())
                            .Num("speed", w.speed())
                            .Num("last_seen_seconds", w.last_seen_seconds())
                            .Bool("alive", w.alive())
                            .Int("incarnation", static_cast<int64_t>(w.incarnation()))
                            .str());
    }
    std::printf("%s\n", JsonObject()
                            .Str("coordinator", c->options().coordinator)
                            .Raw("workers", JsonArray(workers))
                            .str()
                            .c_str());
    return absl::OkStatus();
  }
  std::printf("%-16s %-22s %-12s %-6s %-10s %8s %20s %10s\n", "WORKER", "ADDRESS", "HOST",
              "BACKEND", "DEVICE", "SPEED", "MEMORY USED/LIMIT MiB", "LAST SEEN");
  for (const auto& w : list.workers()) {
    std::printf("%-16s %-22s %-12s %-6s %-10s %8.2f %9.1f/%-10.1f %8.2fs%s\n",
                w.worker_id().c_str(), w.address().c_str(), w.host().c_str(), w.backend().c_str(),
                w.device().c_str(), w.speed(), w.memory_used_bytes() / 1048576.0,
                w.memory_limit_bytes() / 1048576.0, w.last_seen_seconds(),
                w.alive() ? "" : "  (lost)");
  }
  std::printf("%d worker(s)\n", list.workers_size());
  return absl::OkStatus();
}

}  // namespace

CommandInfo StatusCommandInfo() {
  return {"dfa",
          "dfa status",
          "--coordinator HOST:PORT [--job JOB_ID] [--json]",
          "Prints the cluster summary (live workers, sessions, jobs, memory), or one job's state.\n"
          "A job is visible to the client that submitted it (its session's capability).",
          {{"Status",
            {CoordinatorFlag("the coordinator (required)"),
             {"job", "JOB_ID", "one job instead of the summary"},
             {"json", "", "one JSON document on stdout (keys: docs/client.md)"}}},
           SecurityFlagGroup()},
          ""};
}

CommandInfo WorkersCommandInfo() {
  return {"dfa",
          "dfa workers",
          "--coordinator HOST:PORT [--json]",
          "Lists the workers registered with the coordinator: address, host, backend, device,\n"
          "speed, memory used and limit, seconds since the last heartbeat, lost or alive.",
          {{"Workers",
            {CoordinatorFlag("the coordinator (required)"),
             {"json", "", "one JSON document on stdout (keys: docs/client.md)"}}},
           SecurityFlagGroup()},
          ""};
}

int RunStatusCommand(int argc, char** argv) {
  return RunCommand(StatusCommandInfo(), argc, argv, 0, Status);
}
int RunWorkersCommand(int argc, char** argv) {
  return RunCommand(WorkersCommandInfo(), argc, argv, 0, Workers);
}

}  // namespace dfa::cli
