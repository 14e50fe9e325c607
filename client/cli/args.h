// Command-line arguments of a `dfa` subcommand: "--name value", "--name=value" and bare
// "--flag" (boolean). Dashes and underscores in names are equivalent (--kv-heads == --kv_heads).
// Every getter records the name as known; CheckNoUnknown() then rejects anything else, so a
// typo is an error naming the flag, never silently ignored. Values out of range are
// INVALID_ARGUMENT naming the flag.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"

namespace dfa::cli {

class Args {
 public:
  // Parses argv[first..argc). Positional (non "--") words are INVALID_ARGUMENT.
  static absl::StatusOr<Args> Parse(int argc, char** argv, int first);
  static absl::StatusOr<Args> Parse(const std::vector<std::string>& words);

  bool Has(const std::string& name);
  absl::StatusOr<std::string> GetString(const std::string& name, const std::string& def);
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t def, int64_t min, int64_t max);
  absl::StatusOr<double> GetDouble(const std::string& name, double def, double min, double max);
  // "--flag", "--flag=true|false|1|0|yes|no".
  absl::StatusOr<bool> GetBool(const std::string& name, bool def);
  // Rejects flags no getter asked about.
  absl::Status CheckNoUnknown() const;

 private:
  static std::string Normalize(const std::string& name);
  std::map<std::string, std::string> values_;  // normalized name -> value ("" for bare flags)
  std::map<std::string, std::string> spelled_;  // normalized name -> as typed
  std::set<std::string> known_;
};

}  // namespace dfa::cli
