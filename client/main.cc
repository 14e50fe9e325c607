// The `dfa` command: dispatches to one subcommand (client/cli/*_command.cc).
#include <cstdio>
#include <cstring>
#include <string>

#include "client/cli/commands.h"
#if DFA_HAVE_PLAN_CLI
#include "client/plan_cli/plan_command.h"
#endif

namespace {

constexpr char kUsage[] =
    "usage: dfa <command> [flags]   (dfa <command> --help for its flags)\n"
    "  demo      start a local cluster, run a verified causal forward+backward job, stop\n"
    "  submit    run a job against a running cluster (--coordinator HOST:PORT) [--verify]\n"
    "  status    cluster summary, or one job (--job ID)\n"
    "  workers   list the registered workers\n"
    "  bench     data-plane rates and attention throughput vs the single-process kernel\n"
    "  plan      print, check and simulate schedules (the planner)\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "help")) {
    std::printf("%s", kUsage);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  // Subcommands see the words after their name.
  int sub_argc = argc - 2;
  char** sub_argv = argv + 2;
  if (cmd == "demo") return dfa::cli::RunDemoCommand(sub_argc, sub_argv);
  if (cmd == "submit") return dfa::cli::RunSubmitCommand(sub_argc, sub_argv);
  if (cmd == "status") return dfa::cli::RunStatusCommand(sub_argc, sub_argv);
  if (cmd == "workers") return dfa::cli::RunWorkersCommand(sub_argc, sub_argv);
  if (cmd == "bench") return dfa::cli::RunBenchCommand(sub_argc, sub_argv);
  if (cmd == "plan") {
#if DFA_HAVE_PLAN_CLI
    // The plan command takes argv as `dfa plan ...` minus the program name.
    return dfa::RunPlanCommand(argc - 1, argv + 1);
#else
    std::fprintf(stderr, "dfa plan: not built in this tree yet\n");
    return 1;
#endif
  }
  std::fprintf(stderr, "dfa: unknown command '%s'\n%s", cmd.c_str(), kUsage);
  return 2;
}
