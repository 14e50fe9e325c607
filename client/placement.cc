#include "client/placement.h"

#include <algorithm>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/shard_io.h"

namespace dfa::client {
namespace {

std::string Range(int64_t b, int64_t e) { return absl::StrCat("[", b, ", ", e, ")"); }

// A shard's kv heads, resolved (unset = all), after checking both of its head ranges.
absl::StatusOr<HeadSlice> CheckedKvHeads(const v1::ShardPlacement& shard, int i,
                                         const v1::AttentionSpec& spec) {
  const int kv = spec.kv_heads(), group = spec.q_heads() / spec.kv_heads();
  HeadSlice h = ShardHeads(shard, v1::TENSOR_K);
  if (h.empty()) h = HeadSlice{0, kv};
  if (shard.kv_heads().end() != 0 && (h.begin < 0 || h.end > kv || h.begin >= h.end)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CreateSession: shards[", i,
                     "].kv_heads = ", Range(shard.kv_heads().begin(), shard.kv_heads().end()),
                     " is empty or outside [0, spec.kv_heads = ", kv, ")"));
  }
  if (shard.q_heads().end() != 0 &&
      (shard.q_heads().begin() != h.begin * group || shard.q_heads().end() != h.end * group)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CreateSession: shards[", i,
        "].q_heads = ", Range(shard.q_heads().begin(), shard.q_heads().end()),
        " are not the query heads ", Range(int64_t{h.begin} * group, int64_t{h.end} * group),
        " of its kv_heads ", Range(h.begin, h.end), " (", group, " query heads per kv head)"));
  }
  return h;
}

}  // namespace

absl::Status ValidatePlacement(const v1::CreateSessionResponse& info,
                               const v1::AttentionSpec& spec) {
  if (info.shards_size() == 0) {
    return absl::InvalidArgumentError("CreateSession: no shards in the placement");
  }
  if (spec.kv_heads() < 1 || spec.q_heads() % spec.kv_heads() != 0) {
    return absl::InvalidArgumentError("spec: q_heads must be a positive multiple of kv_heads");
  }
  const int64_t seq_len = spec.seq_len();
  std::vector<HeadSlice> heads;
  std::set<int> cuts;  // kv head boundaries of all shards
  for (int i = 0; i < info.shards_size(); ++i) {
    const v1::ShardPlacement& shard = info.shards(i);
    const std::vector<v1::RowRange> owned(shard.owned().begin(), shard.owned().end());
    if (absl::Status s = ValidateOwned(owned, seq_len); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("CreateSession: shards[", i, "].", s.message()));
    }
    ASSIGN_OR_RETURN(const HeadSlice h, CheckedKvHeads(shard, i, spec));
    heads.push_back(h);
    cuts.insert(h.begin);
    cuts.insert(h.end);
  }
  cuts.insert(0);
  cuts.insert(spec.kv_heads());
  // Every elementary head interval between two cuts must be held, row by row, exactly once.
  const std::vector<int> bounds(cuts.begin(), cuts.end());
  for (size_t j = 0; j + 1 < bounds.size(); ++j) {
    const int hb = bounds[j], he = bounds[j + 1];
    struct Piece {
      int64_t begin, end;
      int shard;
    };
    std::vector<Piece> pieces;
    for (int i = 0; i < info.shards_size(); ++i) {
      if (heads[static_cast<size_t>(i)].begin > hb || heads[static_cast<size_t>(i)].end < he) {
        continue;
      }
      for (const v1::RowRange& r : info.shards(i).owned())
        pieces.push_back({r.begin(), r.end(), i});
    }
    std::stable_sort(pieces.begin(), pieces.end(),
                     [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
    int64_t next = 0;
    int prev_shard = -1;
    for (const Piece& p : pieces) {
      if (p.begin > next) {
        return absl::InvalidArgumentError(absl::StrCat("CreateSession: no shard holds token ", next,
                                                       " of kv heads ", Range(hb, he)));
      }
      if (p.begin < next) {
        return absl::InvalidArgumentError(
            absl::StrCat("CreateSession: shards[", p.shard, "] and shards[", prev_shard,
                         "] both hold token ", p.begin, " of kv heads ", Range(hb, he)));
      }
      next = p.end;
      prev_shard = p.shard;
    }
    if (next != seq_len) {
      return absl::InvalidArgumentError(absl::StrCat("CreateSession: no shard holds token ", next,
                                                     " of kv heads ", Range(hb, he), " (of ",
                                                     seq_len, " tokens)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace dfa::client
