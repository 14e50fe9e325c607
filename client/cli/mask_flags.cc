#include "client/cli/mask_flags.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace dfa::cli {

absl::StatusOr<MaskSpec> ParseMaskFlags(Args& args, int64_t seq, bool causal) {
  MaskSpec mask;
  mask.causal = causal;
  ASSIGN_OR_RETURN(std::string docs, args.GetString("doc-lengths", ""));
  ASSIGN_OR_RETURN(std::string window, args.GetString("window", ""));
  if (args.Has("doc-lengths")) {
    std::vector<int64_t> offsets{0};
    int index = 0;
    for (absl::string_view part : absl::StrSplit(docs, ',')) {
      auto n = ParseCount("doc-lengths", std::string(part));
      if (!n.ok() || *n < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--doc-lengths: length ", index, " ('", std::string(part),
            "') is not a count >= 1 (lengths L1,L2,... summing to --seq, K/M units)"));
      }
      if (*n > seq || offsets.back() > seq - *n) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--doc-lengths: the lengths up to length ", index, " sum past --seq = ", seq));
      }
      offsets.push_back(offsets.back() + *n);
      ++index;
    }
    if (offsets.back() != seq) {
      return absl::InvalidArgumentError(absl::StrCat("--doc-lengths: the lengths sum to ",
                                                     offsets.back(), ", --seq is ", seq));
    }
    mask.doc_offsets = {std::move(offsets)};
  }
  if (args.Has("window")) {
    const std::vector<std::string> parts = absl::StrSplit(window, ',');
    if (parts.empty() || parts.size() > 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("--window: '", window, "' is not LEFT or LEFT,RIGHT"));
    }
    int64_t side[2] = {-1, 0};
    for (size_t i = 0; i < parts.size(); ++i) {
      const char* name = i == 0 ? "LEFT" : "RIGHT";
      auto v = ParseInteger("window", parts[i]);
      if (!v.ok() || *v < -1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--window: ", name, " = '", parts[i], "' is not a count >= 0 or -1 (unbounded)"));
      }
      side[i] = *v;
    }
    mask.window_left = side[0];
    mask.window_right = side[1];
  }
  return mask;
}

std::vector<FlagInfo> MaskFlagInfos() {
  return {{"doc-lengths", "L1,L2,...",
           "packed documents: token counts summing to --seq (attention inside each only)"},
          {"window", "LEFT[,RIGHT]",
           "sliding window: LEFT tokens before each query, RIGHT after (default 0); "
           "-1: unbounded"}};
}

std::string DescribeMask(const MaskSpec& mask) {
  std::string out;
  size_t docs = 0;
  for (const auto& row : mask.doc_offsets) docs = std::max(docs, row.size() - 1);
  if (docs > 1) absl::StrAppend(&out, " docs=", docs);
  if (mask.window_left >= 0 || (!mask.causal && mask.window_right >= 0)) {
    absl::StrAppend(&out, " window=", mask.window_left, ",", mask.causal ? 0 : mask.window_right);
  }
  return out;
}

}  // namespace dfa::cli
