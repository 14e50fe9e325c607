// Command-line arguments of the `dfa` commands, `dfa-plan` and `dfa-plan-sweep`: "--name value",
// "--name=value" and bare "--flag" (boolean); "-h" is "--help"; words after a lone "--" are kept
// as they are (rest()). Dashes and underscores in names are equivalent (--kv-heads ==
// --kv_heads).
//
// Every integer flag takes the size units K, M, G, T (binary: 16K = 16384, 1M = 1048576;
// either case), parsed by ParseCount, the one parser of counts and sizes of every command.
//
// Unknown flags: CheckKnown(names) before anything else rejects a flag not in the command's
// table, naming it and the closest known flag ("unknown flag --coordinatr (did you mean
// --coordinator?)"), so a typo never turns into a misleading later error; every getter also
// records the name as known and CheckNoUnknown() rejects the rest. Values out of range are
// INVALID_ARGUMENT naming the flag.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"

namespace dfa::cli {

// "16K" -> 16384, "2M" -> 2097152, "1G", "1T", "123": a non-negative count with an optional
// binary unit suffix. INVALID_ARGUMENT naming `flag` when it is not one or overflows int64.
absl::StatusOr<int64_t> ParseCount(const std::string& flag, const std::string& value);
// "-3", "0", "16K": ParseCount with an optional leading minus sign.
absl::StatusOr<int64_t> ParseInteger(const std::string& flag, const std::string& value);

// Optimal-string-alignment distance (insertions, deletions, substitutions, adjacent
// transpositions), for "did you mean".
int EditDistance(const std::string& a, const std::string& b);
// The candidate closest to `word` when it is close enough to be a likely typo (edit distance at
// most max(1, |word| / 3), or `word` is a prefix of exactly one candidate); "" otherwise.
std::string ClosestMatch(const std::string& word, const std::vector<std::string>& candidates);

class Args {
 public:
  // Parses argv[first..argc). Positional (non "--") words are INVALID_ARGUMENT.
  static absl::StatusOr<Args> Parse(int argc, char** argv, int first);
  static absl::StatusOr<Args> Parse(const std::vector<std::string>& words);

  bool Has(const std::string& name);
  absl::StatusOr<std::string> GetString(const std::string& name, const std::string& def);
  // An integer (ParseCount units) in [min, max].
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t def, int64_t min, int64_t max);
  absl::StatusOr<double> GetDouble(const std::string& name, double def, double min, double max);
  // "--flag", "--flag=true|false|1|0|yes|no".
  absl::StatusOr<bool> GetBool(const std::string& name, bool def);
  // Rejects any flag not among `known` (names without dashes), naming the closest known one.
  absl::Status CheckKnown(const std::vector<std::string>& known) const;
  // Rejects flags no getter asked about.
  absl::Status CheckNoUnknown() const;
  // The words after "--" (empty when there is none).
  const std::vector<std::string>& rest() const { return rest_; }

  static std::string Normalize(const std::string& name);

 private:
  std::map<std::string, std::string> values_;   // normalized name -> value ("" for bare flags)
  std::map<std::string, std::string> spelled_;  // normalized name -> as typed
  std::vector<std::string> order_;              // normalized names in the order given
  std::set<std::string> known_;
  std::vector<std::string> rest_;
};

}  // namespace dfa::cli
