// A small JSON writer for the `--json` outputs of the `dfa` commands: one object per document,
// keys in the order added, strings escaped per RFC 8259, numbers that JSON can carry (a
// non-finite double is written as null).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dfa::cli {

// "\"text\"" with ", \\ and control characters escaped.
std::string JsonQuote(const std::string& s);
// "[a,b,...]" of already-encoded values.
std::string JsonArray(const std::vector<std::string>& values);

class JsonObject {
 public:
  JsonObject& Str(const std::string& key, const std::string& value);
  JsonObject& Int(const std::string& key, int64_t value);
  JsonObject& Num(const std::string& key, double value);
  JsonObject& Bool(const std::string& key, bool value);
  // An already-encoded value (an array or object).
  JsonObject& Raw(const std::string& key, const std::string& json);
  std::string str() const { return "{" + body_ + "}"; }

 private:
  JsonObject& Add(const std::string& key, const std::string& encoded);
  std::string body_;
};

}  // namespace dfa::cli
