// The `dfa` subcommands. Each takes the words after its name, prints to stdout (errors to
// stderr) and returns the process exit code: 0 success, 1 failure, 2 bad usage.
#pragma once

namespace dfa::cli {

int RunDemoCommand(int argc, char** argv);
int RunSubmitCommand(int argc, char** argv);
int RunStatusCommand(int argc, char** argv);
int RunWorkersCommand(int argc, char** argv);
int RunBenchCommand(int argc, char** argv);

}  // namespace dfa::cli
