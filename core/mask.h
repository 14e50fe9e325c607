// The attention mask and what it lets through: which (query, key) pairs of a unit are visible,
// and the FLOPs that the visible pairs cost. Positions are global token positions.
#pragma once

#include <cstdint>

namespace dfa {

// kFull: every query sees every key. kCausal: query position i sees key position j iff j <= i.
enum class MaskKind : int { kFull = 0, kCausal = 1 };

// Number of (query, key) pairs visible under the mask for the unit
// "queries [q_row0, q_row0 + m) attend to keys [kv_row0, kv_row0 + n)".
int64_t VisiblePairs(int64_t q_row0, int64_t m, int64_t kv_row0, int64_t n, MaskKind mask);

// FLOPs of the unit's forward, counting only visible pairs: 4 * B * H * pairs * D (a causal
// square counts exactly half of the full one). A backward costs 2.5 times its forward.
double ForwardFlops(int batch, int q_heads, int head_dim, int64_t q_row0, int64_t m,
                    int64_t kv_row0, int64_t n, MaskKind mask);

}  // namespace dfa
