#include "client/cli/args.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dfa::cli {

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
    const std::string& w = words[i];
    if (w.size() < 3 || w[0] != '-' || w[1] != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", w, "' (flags look like --name value)"));
    }
    std::string name = w.substr(2), value;
    const size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (i + 1 < words.size() && words[i + 1].rfind("--", 0) != 0) {
      value = words[++i];
    }
    const std::string key = Normalize(name);
    if (a.values_.count(key)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " given twice"));
    }
    a.values_[key] = value;
    a.spelled_[key] = name;
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
  std::string v = values_.at(Normalize(name));
  // Accept K/M suffixes for sizes: 16K = 16384, 1M = 1048576.
  int64_t mult = 1;
  if (!v.empty() && (v.back() == 'K' || v.back() == 'k')) mult = 1024, v.pop_back();
  else if (!v.empty() && (v.back() == 'M' || v.back() == 'm')) mult = 1024 * 1024, v.pop_back();
  int64_t x = 0;
  if (!absl::SimpleAtoi(v, &x)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": '", values_.at(Normalize(name)), "' is not an integer"));
  }
  x *= mult;
  if (x < min || x > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be in [", min, ", ", max, "], got ", x));
  }
  return x;
}

absl::StatusOr<double> Args::GetDouble(const std::string& name, double def, double min,
                                       double max) {
  if (!Has(name)) return def;
  double x = 0;
  if (!absl::SimpleAtod(values_.at(Normalize(name)), &x)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": '", values_.at(Normalize(name)),
                                                   "' is not a number"));
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

absl::Status Args::CheckNoUnknown() const {
  std::vector<std::string> unknown;
  for (const auto& [key, value] : values_) {
    if (!known_.count(key)) unknown.push_back(absl::StrCat("--", spelled_.at(key)));
  }
  if (unknown.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("unknown flag(s): ", absl::StrJoin(unknown, " ")));
}

}  // namespace dfa::cli
