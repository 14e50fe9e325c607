#include "core/version.h"

#include <cstring>

#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

// Set by core/CMakeLists.txt on this file.
#ifndef DFA_PROJECT_VERSION
#error "DFA_PROJECT_VERSION must be defined by the build (core/CMakeLists.txt)"
#endif
#ifndef DFA_BUILD_TYPE
#error "DFA_BUILD_TYPE must be defined by the build (core/CMakeLists.txt)"
#endif

namespace dfa {

std::string_view ProjectVersion() { return DFA_PROJECT_VERSION; }

std::string_view BuildType() {
  constexpr std::string_view kType = DFA_BUILD_TYPE;
  return kType.empty() ? std::string_view("unknown") : kType;
}

std::string VersionString(std::string_view program) {
  std::string s(program);
  s.append(" ").append(ProjectVersion()).append(" (").append(BuildType()).append(" build)");
  return s;
}

void InitProgramFlags(std::string_view program, std::string_view usage,
                      std::string_view flags_file, int argc, char** argv) {
  absl::SetProgramUsageMessage(absl::string_view(usage.data(), usage.size()));
  absl::FlagsUsageConfig config;
  // Flag files are named by __FILE__ (absolute in most builds): match a whole path suffix.
  auto own = [file = std::string(flags_file)](absl::string_view path) {
    return path == file || absl::EndsWith(path, absl::StrCat("/", file));
  };
  config.contains_help_flags = own;
  config.contains_helpshort_flags = own;
  config.version_string = [name = std::string(program)] {
    return VersionString(name) + "\n";
  };
  absl::SetFlagsUsageConfig(config);
  static char kHelp[] = "--help";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) break;
    if (std::strcmp(argv[i], "-h") == 0) argv[i] = kHelp;
  }
}

}  // namespace dfa
