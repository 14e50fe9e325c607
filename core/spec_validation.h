// An AttentionSpec sent by a client: its checks, with the limits of whoever checks, and what it
// stands for (the per-token shape, the softmax scale). Every error is INVALID_ARGUMENT worded
// "spec.<field>: <what>, got <value>" ("spec.head_dim: must be >= 1, got 0"); the Python client
// (client/python/dfa/spec.py) words its own checks the same, without the "spec." prefix.
#pragma once

#include <cstdint>
#include <limits>

#include "absl/strings/string_view.h"
#include "core/mask.h"
#include "core/shape.h"
#include "core/status.h"
#include "dfa/v1/attention.pb.h"

namespace dfa {

// Upper limits on a spec. The coordinator sets them from its flags of the same names
// (--max_seq_len, --max_batch, --max_heads, --max_documents; max_head_dim is the kernels'); a
// worker passes its own; a client passes kNoSpecLimits and leaves the limits to the daemons.
struct SpecLimits {
  int64_t max_seq_len = int64_t{1} << 22;  // tokens per session
  int max_batch = 1024;
  int max_heads = 1024;              // q_heads and kv_heads
  int max_head_dim = kMaxHeadDim;    // core/shape.h: the largest any backend computes
  // Documents of doc_offsets, all entries together (the offsets a spec carries, less one per
  // entry).
  int64_t max_documents = int64_t{1} << 20;
};

// No upper limits: only what is wrong with any spec (sizes < 1, heads not divisible, unknown
// dtype, bad scale).
inline constexpr SpecLimits kNoSpecLimits{std::numeric_limits<int64_t>::max(),
                                          std::numeric_limits<int>::max(),
                                          std::numeric_limits<int>::max(),
                                          std::numeric_limits<int>::max(),
                                          std::numeric_limits<int64_t>::max()};

// The one check of a spec, in this order: batch, q_heads, kv_heads (each >= 1 and within the
// limits), q_heads a multiple of kv_heads, head_dim, seq_len, dtype (F32, BF16 or F16),
// softmax_scale (finite, >= 0), then the mask: window_left / window_right (absent or >= -1),
// doc_offsets (0, 1 or batch entries, each {0, ..., seq_len} strictly increasing, at most
// max_documents documents in all; "spec.doc_offsets[1][3]: must be greater than
// doc_offsets[1][2] = 80, got 70"), and a masked spec's seq_len within int32 positions (the
// kernels' interval arrays). Backend-independent; see ValidateSpecForPlacement.
absl::Status ValidateSpec(const v1::AttentionSpec& spec, const SpecLimits& limits);

// Constraints of a backend once workers are chosen: "cuda" takes head_dim 64 or 128;
// seq_len must be at least the number of workers.
absl::Status ValidateSpecForPlacement(const v1::AttentionSpec& spec, absl::string_view backend,
                                      int num_workers);

// The schedule names the planner accepts; empty means "balanced".
absl::Status ValidateSchedule(absl::string_view schedule);

// The per-token shape of a spec (all heads; a head-split worker cuts it with LocalShape,
// core/planner/plan.h). The spec is validated first: DType shares the proto enum's values.
AttentionShape ShapeOf(const v1::AttentionSpec& spec);

// The mask of a (validated) spec: causal, the window (absent: -1) and the documents.
MaskSpec MaskSpecOf(const v1::AttentionSpec& spec);
// The other way: sets the spec's doc_offsets and window fields from `mask` (its causal is not
// copied; a window side of -1 is left absent). Replaces what the spec had.
void SetSpecMask(const MaskSpec& mask, v1::AttentionSpec* spec);

// FLOPs of the whole forward of a (validated) spec, 4·B·Hq·D per visible pair under its mask
// (causal halves the square; documents and windows count only the pairs they let through). A
// backward costs 2.5 times this.
double SpecForwardFlops(const v1::AttentionSpec& spec);

// Softmax scale the workers use: spec.softmax_scale, or 1/sqrt(head_dim) when it is 0.
float EffectiveScale(const v1::AttentionSpec& spec);

}  // namespace dfa
