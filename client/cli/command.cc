#include "client/cli/command.h"

#include <cstdio>
#include <new>

#include "absl/strings/str_cat.h"
#include "client/cli/interrupt.h"
#include "core/version.h"

namespace dfa::cli {
namespace {

constexpr size_t kFlagColumn = 30;

void AppendFlag(const std::string& spelled, const std::string& help, std::string* out) {
  std::string left = absl::StrCat("  ", spelled);
  if (left.size() + 2 > kFlagColumn) {
    absl::StrAppend(out, left, "\n", std::string(kFlagColumn, ' '), help, "\n");
  } else {
    left.resize(kFlagColumn, ' ');
    absl::StrAppend(out, left, help, "\n");
  }
}

}  // namespace

std::string FormatHelp(const CommandInfo& info) {
  std::string out =
      absl::StrCat("usage: ", info.name, info.synopsis.empty() ? "" : " ", info.synopsis, "\n");
  if (!info.description.empty()) absl::StrAppend(&out, "\n", info.description, "\n");
  for (const FlagGroup& g : info.groups) {
    absl::StrAppend(&out, "\n", g.title, ":\n");
    for (const FlagInfo& f : g.flags) {
      AppendFlag(absl::StrCat("--", f.name, f.value.empty() ? "" : " ", f.value), f.help, &out);
    }
  }
  absl::StrAppend(&out, "\nGeneral:\n");
  AppendFlag("-h, --help", "print this help and exit", &out);
  AppendFlag("--version", "print the version and exit", &out);
  if (!info.footer.empty()) absl::StrAppend(&out, "\n", info.footer, "\n");
  return out;
}

std::vector<std::string> FlagNames(const CommandInfo& info) {
  std::vector<std::string> names;
  for (const FlagGroup& g : info.groups) {
    for (const FlagInfo& f : g.flags) names.push_back(f.name);
  }
  names.push_back("help");
  names.push_back("version");
  return names;
}

int ReportFailure(const CommandInfo& info, const absl::Status& s) {
  std::fflush(stdout);
  if (s.code() == absl::StatusCode::kInvalidArgument) {
    std::fprintf(stderr, "%s: %s\n(%s --help lists its flags)\n", info.name.c_str(),
                 std::string(s.message()).c_str(), info.name.c_str());
    return kExitUsage;
  }
  std::fprintf(stderr, "%s: %s\n", info.name.c_str(), s.ToString().c_str());
  return kExitFailure;
}

int RunCommand(const CommandInfo& info, const std::vector<std::string>& words,
               const std::function<absl::Status(Args&)>& fn) {
  absl::StatusOr<Args> args = Args::Parse(words);
  if (!args.ok()) return ReportFailure(info, args.status());
  // --help and --version win over anything else on the line (even unknown flags).
  if (args->Has("help")) {
    std::fputs(FormatHelp(info).c_str(), stdout);
    return kExitOk;
  }
  if (args->Has("version")) {
    std::printf("%s\n", VersionString(info.program).c_str());
    return kExitOk;
  }
  if (absl::Status s = args->CheckKnown(FlagNames(info)); !s.ok()) return ReportFailure(info, s);
  absl::Status s;
  try {
    s = fn(*args);
  } catch (const std::bad_alloc&) {
    s = absl::ResourceExhaustedError(
        "out of memory: this host could not allocate what the command needs (use smaller "
        "--batch, --seq, --heads or --head-dim)");
  }
  // After Ctrl-C the main thread's own result (a cancelled job, a closed session) is not the
  // story: the watcher is cleaning up and exits with 128 + the signal.
  Interrupts::BlockIfExiting();
  return s.ok() ? kExitOk : ReportFailure(info, s);
}

int RunCommand(const CommandInfo& info, int argc, char** argv, int first,
               const std::function<absl::Status(Args&)>& fn) {
  std::vector<std::string> words;
  for (int i = first; i < argc; ++i) words.emplace_back(argv[i]);
  return RunCommand(info, words, fn);
}

}  // namespace dfa::cli
