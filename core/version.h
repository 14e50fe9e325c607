// What a program says about itself: the project's version (project(dfa VERSION ...) in the root
// CMakeLists.txt) and the build type it was compiled as (CMAKE_BUILD_TYPE), both provided by
// CMake when core/version.cc is compiled, and the help/version set-up of the daemons' command
// lines (absl flags).
#pragma once

#include <string>
#include <string_view>

namespace dfa {

// "0.1.0".
std::string_view ProjectVersion();
// "Release", "Debug", "RelWithDebInfo", ... (CMAKE_BUILD_TYPE; "unknown" when none was set).
std::string_view BuildType();
// "<program> <version> (<build type> build)", e.g. "dfa-worker 0.1.0 (Release build)": what
// --version prints.
std::string VersionString(std::string_view program);

// For a program's main(), before absl::ParseCommandLine: --help, --helpshort and -h list the
// flags defined in the source file whose path ends with `flags_file` (e.g. "worker/main.cc"),
// under `usage`; --helpfull lists every flag of the binary, absl's included; --version prints
// VersionString(program). Rewrites a "-h" argument (before any "--") to "--help" in place.
void InitProgramFlags(std::string_view program, std::string_view usage,
                      std::string_view flags_file, int argc, char** argv);

}  // namespace dfa
