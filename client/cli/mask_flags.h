// The mask flags of `dfa demo`, `dfa submit`, `dfa bench` and `dfa plan` (docs/client.md):
//   --doc-lengths L1,L2,...  packed documents: token counts summing to --seq (K/M units as
//                            every count), the same documents in every batch row
//   --window LEFT[,RIGHT]    sliding window: a query sees LEFT tokens before it and RIGHT after
//                            (RIGHT defaults to 0; -1 on a side: unbounded)
#pragma once

#include <cstdint>
#include <vector>

#include "client/cli/args.h"
#include "client/cli/command.h"
#include "core/mask.h"
#include "core/status.h"

namespace dfa::cli {

// The mask of the flags over `seq` tokens, `causal` as the command's --causal / --full say.
// INVALID_ARGUMENT naming the flag: a length < 1 or not a count, lengths not summing to seq,
// more than one or two window values, a window side < -1.
absl::StatusOr<MaskSpec> ParseMaskFlags(Args& args, int64_t seq, bool causal);
std::vector<FlagInfo> MaskFlagInfos();
// " docs=3 window=128,0" for a masked spec, "" for a dense one.
std::string DescribeMask(const MaskSpec& mask);

}  // namespace dfa::cli
