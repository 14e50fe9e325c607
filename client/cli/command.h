// What every `dfa` command (and dfa-plan, dfa-plan-sweep) shares around its own work: a table of
// its flags, from which --help is printed and against which unknown flags are refused with a
// "did you mean", --version, and the mapping of the command's result to an exit status.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "client/cli/args.h"

namespace dfa::cli {

struct FlagInfo {
  std::string name;   // without dashes: "seq", "kv-heads"
  std::string value;  // the value's placeholder ("S", "HOST:PORT"); empty for a boolean flag
  std::string help;   // one line; defaults in it
};

struct FlagGroup {
  std::string title;  // "Job", "Security", ...
  std::vector<FlagInfo> flags;
};

struct CommandInfo {
  std::string program;      // for --version: "dfa", "dfa-plan"
  std::string name;         // as typed: "dfa submit", "dfa-plan"
  std::string synopsis;     // after the name on the usage line
  std::string description;  // a paragraph (may hold newlines)
  std::vector<FlagGroup> groups;
  std::string footer;  // examples, printed last (may be empty)
};

// Exit statuses of the commands.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// The help text: usage line, description, each group's flags, then -h/--help and --version.
std::string FormatHelp(const CommandInfo& info);
// Every flag name of the table, plus help and version.
std::vector<std::string> FlagNames(const CommandInfo& info);

// Runs one command on `words` (the words after its name): --help or -h prints FormatHelp on
// stdout (exit 0), --version prints VersionString(program) (exit 0); a flag not in the table is
// refused naming the closest one (exit 2); otherwise `fn` runs and its status becomes the exit
// status: OK 0, INVALID_ARGUMENT 2 (the message and a pointer to --help on stderr), anything else
// 1 ("<name>: <status>" on stderr). std::bad_alloc from `fn` is reported as out of memory, exit 1.
int RunCommand(const CommandInfo& info, const std::vector<std::string>& words,
               const std::function<absl::Status(Args&)>& fn);
int RunCommand(const CommandInfo& info, int argc, char** argv, int first,
               const std::function<absl::Status(Args&)>& fn);

// Prints "<name>: <message>" for `s` on stderr (flushing stdout first) and returns its exit
// status as RunCommand maps it.
int ReportFailure(const CommandInfo& info, const absl::Status& s);

}  // namespace dfa::cli
