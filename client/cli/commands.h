// The `dfa` subcommands. Each takes the words after its name, prints to stdout (errors to
// stderr) and returns the process exit status: 0 success, 1 failure, 2 bad usage, 128 + the
// signal when interrupted (130: Ctrl-C). Each command's flag table (its --help) is its
// *CommandInfo().
#pragma once

#include "client/cli/command.h"

namespace dfa::cli {

int RunDemoCommand(int argc, char** argv);
int RunSubmitCommand(int argc, char** argv);
int RunStatusCommand(int argc, char** argv);
int RunWorkersCommand(int argc, char** argv);
int RunBenchCommand(int argc, char** argv);
int RunClusterCommand(int argc, char** argv);

CommandInfo DemoCommandInfo();
CommandInfo SubmitCommandInfo();
CommandInfo StatusCommandInfo();
CommandInfo WorkersCommandInfo();
CommandInfo BenchCommandInfo();
CommandInfo ClusterCommandInfo();

}  // namespace dfa::cli
