#include "client/cli/args.h"

#include <algorithm>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dfa::cli {

absl::StatusOr<int64_t> ParseCount(const std::string& flag, const std::string& value) {
  if (value.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, " needs a value"));
  std::string digits = value;
  int shift = 0;
  switch (absl::ascii_toupper(static_cast<unsigned char>(digits.back()))) {
    case 'K':
      shift = 10;
      break;
    case 'M':
      shift = 20;
      break;
    case 'G':
      shift = 30;
      break;
    case 'T':
      shift = 40;
      break;
    default:
      break;
  }
  if (shift > 0) digits.pop_back();
  uint64_t x = 0;
  const bool all_digits = !digits.empty() && std::all_of(digits.begin(), digits.end(), [](char c) {
    return absl::ascii_isdigit(static_cast<unsigned char>(c));
  });
  if (!all_digits || !absl::SimpleAtoi(digits, &x)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": '", value,
                     "' is not an integer (a count, optionally with K, M, G or T: 16K)"));
  }
  constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (x > (kMax >> shift)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", value, "' is too large"));
  }
  return static_cast<int64_t>(x << shift);
}

absl::StatusOr<int64_t> ParseInteger(const std::string& flag, const std::string& value) {
  if (!value.empty() && value[0] == '-') {
    ASSIGN_OR_RETURN(int64_t x, ParseCount(flag, value.substr(1)));
    return -x;
  }
  return ParseCount(flag, value);
}

int EditDistance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<int>> d(n + 1, std::vector<int>(m + 1, 0));
  for (size_t i = 0; i <= n; ++i) d[i][0] = static_cast<int>(i);
  for (size_t j = 0; j <= m; ++j) d[0][j] = static_cast<int>(j);
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

std::string ClosestMatch(const std::string& word, const std::vector<std::string>& candidates) {
  const int limit = std::max<int>(1, static_cast<int>(word.size()) / 3);
  std::string best;
  int best_d = limit + 1;
  for (const std::string& c : candidates) {
    const int d = EditDistance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  if (!best.empty()) return best;
  std::string prefix_of;
  int prefixes = 0;
  for (const std::string& c : candidates) {
    if (word.size() >= 2 && c.size() > word.size() && c.compare(0, word.size(), word) == 0) {
      ++prefixes;
      prefix_of = c;
    }
  }
  return prefixes == 1 ? prefix_of : "";
}

std::string Args::Normalize(const std::string& name) {
  std::string n = name;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

absl::StatusOr<Args> Args::Parse(int argc, char** argv, int first) {
  std::vector<std::string> words;
  for (int i = first; i < argc; ++i) words.emplace_back(argv[i]);
  return Parse(words);
}

absl::StatusOr<Args> Args::Parse(const std::vector<std::string>& words) {
  Args a;
  for (size_t i = 0; i < words.size(); ++i) {
    std::string w = words[i];
    if (w == "--") {
      a.rest_.assign(words.begin() + static_cast<long>(i) + 1, words.end());
      break;
    }
    if (w == "-h") w = "--help";
    if (w.size() < 3 || w[0] != '-' || w[1] != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", w, "' (flags look like --name value)"));
    }
    std::string name = w.substr(2), value;
    const size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (i + 1 < words.size() && words[i + 1].rfind("--", 0) != 0 && words[i + 1] != "-h") {
      value = words[++i];
    }
    const std::string key = Normalize(name);
    if (a.values_.count(key)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " given twice"));
    }
    a.values_[key] = value;
    a.spelled_[key] = name;
    a.order_.push_back(key);
  }
  return a;
}

bool Args::Has(const std::string& name) {
  known_.insert(Normalize(name));
  return values_.count(Normalize(name)) > 0;
}

absl::StatusOr<std::string> Args::GetString(const std::string& name, const std::string& def) {
  if (!Has(name)) return def;
  const std::string& v = values_.at(Normalize(name));
  if (v.empty()) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
  return v;
}

absl::StatusOr<int64_t> Args::GetInt(const std::string& name, int64_t def, int64_t min,
                                     int64_t max) {
  if (!Has(name)) return def;
  ASSIGN_OR_RETURN(int64_t x, ParseInteger(name, values_.at(Normalize(name))));
  if (x < min || x > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be in [", min, ", ", max, "], got ", x));
  }
  return x;
}

absl::StatusOr<double> Args::GetDouble(const std::string& name, double def, double min,
                                       double max) {
  if (!Has(name)) return def;
  const std::string& v = values_.at(Normalize(name));
  if (v.empty()) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
  double x = 0;
  if (!absl::SimpleAtod(v, &x)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": '", v, "' is not a number"));
  }
  if (!(x >= min && x <= max)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be in [", min, ", ", max, "], got ", x));
  }
  return x;
}

absl::StatusOr<bool> Args::GetBool(const std::string& name, bool def) {
  if (!Has(name)) return def;
  const std::string v = absl::AsciiStrToLower(values_.at(Normalize(name)));
  if (v.empty() || v == "true" || v == "1" || v == "yes") return true;
  if (v == "false" || v == "0" || v == "no") return false;
  return absl::InvalidArgumentError(
      absl::StrCat("--", name, ": '", v, "' is not a boolean (true/false)"));
}

absl::Status Args::CheckKnown(const std::vector<std::string>& known) const {
  std::vector<std::string> names;
  for (const std::string& k : known) names.push_back(Normalize(k));
  std::vector<std::string> errors;
  for (const std::string& key : order_) {
    if (std::find(names.begin(), names.end(), key) != names.end()) continue;
    std::string e = absl::StrCat("unknown flag --", spelled_.at(key));
    const std::string close = ClosestMatch(key, names);
    if (!close.empty()) {
      // Suggest it as spelled in the table (dashes).
      const std::string& shown =
          known[static_cast<size_t>(std::find(names.begin(), names.end(), close) - names.begin())];
      absl::StrAppend(&e, " (did you mean --", shown, "?)");
    }
    errors.push_back(std::move(e));
  }
  if (errors.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(errors, "; "));
}

absl::Status Args::CheckNoUnknown() const {
  std::vector<std::string> unknown;
  for (const std::string& key : order_) {
    if (!known_.count(key)) unknown.push_back(absl::StrCat("--", spelled_.at(key)));
  }
  if (unknown.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      unknown.size() == 1 ? "unknown flag " : "unknown flags ", absl::StrJoin(unknown, " ")));
}

}  // namespace dfa::cli
