// `dfa submit`: one forward (+ backward) job on random data against a running cluster.
#include <cstdio>

#include "client/cli/commands.h"
#include "client/cli/interrupt.h"
#include "client/cli/training_run.h"

namespace dfa::cli {
namespace {

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
  Interrupts::Install("dfa submit", Interrupts::Mode::kCleanUpAndExit);
  return RunTrainingJob(c.get(), run);
}

}  // namespace

CommandInfo SubmitCommandInfo() {
  return {"dfa",
          "dfa submit",
          "--coordinator HOST:PORT [flags]",
          "Runs a forward (+ backward) job on random data against a running cluster and prints\n"
          "its throughput and each worker's idle fraction; --verify compares the results with\n"
          "single-device attention. Ctrl-C cancels the job, releases the session and exits 130.",
          {{"Cluster",
            {CoordinatorFlag("the coordinator (required)"),
             {"path", "auto|grpc|shm", "data path to the workers (default auto: shm on this host)"},
             {"retries", "N", "re-runs on the remaining workers after a lost worker (default 1)"},
             {"forward-only", "", "no backward job"},
             {"verify", "", "compare O, LSE (dQ, dK, dV) with single-device attention"}}},
           JobFlagGroup(4096, "workers to spread over (default 0: all live workers)"),
           SecurityFlagGroup()},
          "Sizes take K, M, G: dfa submit --coordinator 127.0.0.1:7000 --seq 16K --verify"};
}

int RunSubmitCommand(int argc, char** argv) {
  return RunCommand(SubmitCommandInfo(), argc, argv, 0, Submit);
}

}  // namespace dfa::cli
