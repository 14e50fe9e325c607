// Document lengths for packed sequences: the long-tailed mixes long-context training packs into
// one sequence, for the planner's masked targets, `dfa-plan-sweep` and tests (docs/planner.md,
// "Masked plans"). Deterministic on every platform (own generator, no <random> distributions).
#pragma once

#include <cstdint>
#include <vector>

namespace dfa {

// Lengths summing to seq_len: each floor(xm / u^(1/alpha)) with u uniform in (0, 1] (Pareto
// with shape alpha and scale xm), capped at `cap`, drawn in order from a splitmix64 stream of
// `seed` until the sequence is full; the last one is cut to what is left. Empty for seq_len < 1;
// alpha > 0, 1 <= xm <= cap expected (clamped otherwise).
std::vector<int64_t> ParetoDocumentLengths(int64_t seq_len, double alpha, double xm, int64_t cap,
                                           uint64_t seed);

// flash-attn cu_seqlens of the lengths: {0, l0, l0 + l1, ..., sum}.
std::vector<int64_t> DocOffsetsOf(const std::vector<int64_t>& lengths);

}  // namespace dfa
