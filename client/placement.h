// Checks of a session's placement as the coordinator answered it (CreateSessionResponse.shards)
// before the client moves any data by it.
//
// A shard holds rows (ShardPlacement.owned) of a range of the heads (ShardPlacement.q_heads /
// kv_heads; unset = all heads, as older coordinators answer). The shards together must hold
// every (token, kv head) of the sequence exactly once, and each shard's query heads must be the
// query groups of its kv heads, so scatter and gather by (rows, heads) cover every element of
// every tensor exactly once. Pure functions, thread-safe.
#pragma once

#include "dfa/v1/coordinator.pb.h"
#include "core/status.h"

namespace dfa::client {

// OK, or INVALID_ARGUMENT naming the shard (shards[i].owned[j], shards[i].kv_heads,
// shards[i].q_heads) and the token / heads held twice or by nobody.
absl::Status ValidatePlacement(const v1::CreateSessionResponse& info,
                               const v1::AttentionSpec& spec);

}  // namespace dfa::client
