// The `dfa` command: dispatches to one subcommand (client/cli/*_command.cc).
#include <cstdio>
#include <string>
#include <vector>

#include "client/cli/args.h"
#include "client/cli/commands.h"
#include "core/version.h"
#if DFA_HAVE_PLAN_CLI
#include "client/plan_cli/plan_command.h"
#endif

namespace {

constexpr char kUsage[] =
    "usage: dfa <command> [flags]   (dfa <command> --help lists its flags)\n"
    "\n"
    "Commands:\n"
    "  demo      start a local cluster (or use --coordinator), run a verified causal\n"
    "            forward+backward job, stop\n"
    "  submit    run a job against a running cluster (--coordinator HOST:PORT) [--verify]\n"
    "  status    cluster summary, or one job (--job ID) [--json]\n"
    "  workers   list the registered workers [--json]\n"
    "  bench     data-plane rates and attention throughput vs the single-process kernel\n"
    "  cluster   start a coordinator and N workers on loopback and keep them up until Ctrl-C\n"
    "  plan      print, check and simulate schedules (the planner) [--json]\n"
    "\n"
    "General:\n"
    "  -h, --help    print this help and exit\n"
    "  --version     print the version and exit\n"
    "\n"
    "Sizes take K, M, G, T (binary): --seq 16K. Docs: docs/client.md.\n";

const std::vector<std::string> kCommands = {"demo",  "submit",  "status", "workers",
                                            "bench", "cluster", "plan"};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (cmd == "--version" || cmd == "version") {
    std::printf("%s\n", dfa::VersionString("dfa").c_str());
    return 0;
  }
  // Subcommands see the words after their name.
  int sub_argc = argc - 2;
  char** sub_argv = argv + 2;
  if (cmd == "demo") return dfa::cli::RunDemoCommand(sub_argc, sub_argv);
  if (cmd == "submit") return dfa::cli::RunSubmitCommand(sub_argc, sub_argv);
  if (cmd == "status") return dfa::cli::RunStatusCommand(sub_argc, sub_argv);
  if (cmd == "workers") return dfa::cli::RunWorkersCommand(sub_argc, sub_argv);
  if (cmd == "bench") return dfa::cli::RunBenchCommand(sub_argc, sub_argv);
  if (cmd == "cluster") return dfa::cli::RunClusterCommand(sub_argc, sub_argv);
  if (cmd == "plan") {
#if DFA_HAVE_PLAN_CLI
    // The plan command takes argv as `dfa plan ...` minus the program name.
    return dfa::RunPlanCommand(argc - 1, argv + 1, "dfa plan", "dfa");
#else
    std::fprintf(stderr, "dfa plan: not built in this tree\n");
    return 1;
#endif
  }
  std::string hint;
  const std::string close =
      dfa::cli::ClosestMatch(cmd.rfind("--", 0) == 0 ? cmd.substr(2) : cmd, kCommands);
  if (!close.empty()) hint = " (did you mean '" + close + "'?)";
  std::fprintf(stderr, "dfa: unknown command '%s'%s\n\n%s", cmd.c_str(), hint.c_str(), kUsage);
  return 2;
}
