#include "client/cli/json_writer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace dfa::cli {

std::string JsonQuote(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += ch;
        }
    }
  }
  out += "\"";
  return out;
}

std::string JsonArray(const std::vector<std::string>& values) {
  return absl::StrCat("[", absl::StrJoin(values, ","), "]");
}

JsonObject& JsonObject::Add(const std::string& key, const std::string& encoded) {
  if (!body_.empty()) body_ += ",";
  absl::StrAppend(&body_, JsonQuote(key), ":", encoded);
  return *this;
}

JsonObject& JsonObject::Str(const std::string& key, const std::string& value) {
  return Add(key, JsonQuote(value));
}
JsonObject& JsonObject::Int(const std::string& key, int64_t value) {
  return Add(key, absl::StrCat(value));
}
JsonObject& JsonObject::Num(const std::string& key, double value) {
  return Add(key, std::isfinite(value) ? absl::StrFormat("%.9g", value) : std::string("null"));
}
JsonObject& JsonObject::Bool(const std::string& key, bool value) {
  return Add(key, value ? "true" : "false");
}
JsonObject& JsonObject::Raw(const std::string& key, const std::string& json) {
  return Add(key, json);
}

}  // namespace dfa::cli
