#include "core/spec_validation.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace dfa {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("spec.", field, ": ", what));
}

// `value` in [1, max]; the message names the limit (a coordinator flag of the same name).
absl::Status CheckSize(absl::string_view field, int64_t value, int64_t max,
                       absl::string_view limit) {
  if (value < 1) return Bad(field, absl::StrCat("must be >= 1, got ", value));
  if (value > max) return Bad(field, absl::StrCat("must be <= ", max, " (", limit, "), got ", value));
  return absl::OkStatus();
}

// The mask fields, after the shape: counts first (before anything reads the offsets), then
// ValidateMask's checks with the "spec." prefix.
absl::Status ValidateSpecMask(const v1::AttentionSpec& spec, const SpecLimits& limits) {
  if (spec.has_window_left() && spec.window_left() < -1) {
    return Bad("window_left",
               absl::StrCat("must be >= 0 (or -1: unbounded), got ", spec.window_left()));
  }
  if (spec.has_window_right() && spec.window_right() < -1) {
    return Bad("window_right",
               absl::StrCat("must be >= 0 (or -1: unbounded), got ", spec.window_right()));
  }
  const int rows = spec.doc_offsets_size();
  if (rows > 1 && rows != spec.batch()) {
    return Bad("doc_offsets",
               absl::StrCat("must have 0, 1 or batch (", spec.batch(), ") entries, got ", rows));
  }
  int64_t docs = 0;
  for (int b = 0; b < rows; ++b) {
    docs += std::max(0, spec.doc_offsets(b).offsets_size() - 1);
  }
  if (docs > limits.max_documents) {
    return Bad("doc_offsets", absl::StrCat("must hold <= ", limits.max_documents,
                                           " documents in all (max_documents), got ", docs));
  }
  const MaskSpec mask = MaskSpecOf(spec);
  if (absl::Status s = ValidateMask(mask, spec.batch(), spec.seq_len()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.", s.message()));
  }
  if (!mask.IsDense() && spec.seq_len() > std::numeric_limits<int32_t>::max()) {
    return Bad("seq_len", absl::StrCat("must be <= ", std::numeric_limits<int32_t>::max(),
                                       " with doc_offsets or a window, got ", spec.seq_len()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateSpec(const v1::AttentionSpec& spec, const SpecLimits& limits) {
  RETURN_IF_ERROR(CheckSize("batch", spec.batch(), limits.max_batch, "max_batch"));
  RETURN_IF_ERROR(CheckSize("q_heads", spec.q_heads(), limits.max_heads, "max_heads"));
  RETURN_IF_ERROR(CheckSize("kv_heads", spec.kv_heads(), limits.max_heads, "max_heads"));
  if (spec.q_heads() % spec.kv_heads() != 0) {
    return Bad("q_heads", absl::StrCat("must be a multiple of kv_heads (", spec.kv_heads(),
                                       "), got ", spec.q_heads()));
  }
  RETURN_IF_ERROR(CheckSize("head_dim", spec.head_dim(), limits.max_head_dim, "max_head_dim"));
  RETURN_IF_ERROR(CheckSize("seq_len", spec.seq_len(), limits.max_seq_len, "max_seq_len"));
  switch (spec.dtype()) {
    case v1::DTYPE_F32:
    case v1::DTYPE_BF16:
    case v1::DTYPE_F16:
      break;
    default:
      return Bad("dtype", absl::StrCat("must be DTYPE_F32, DTYPE_BF16 or DTYPE_F16, got ",
                                       static_cast<int>(spec.dtype())));
  }
  const float scale = spec.softmax_scale();
  if (!std::isfinite(scale) || scale < 0.f) {
    return Bad("softmax_scale",
               absl::StrCat("must be finite and >= 0 (0: 1/sqrt(head_dim)), got ", scale));
  }
  return ValidateSpecMask(spec, limits);
}

absl::Status ValidateSpecForPlacement(const v1::AttentionSpec& spec, absl::string_view backend,
                                      int num_workers) {
  if (backend == "cuda" && spec.head_dim() != 64 && spec.head_dim() != 128) {
    return Bad("head_dim", absl::StrCat("cuda workers support 64 or 128, got ", spec.head_dim()));
  }
  if (spec.seq_len() < num_workers) {
    return Bad("seq_len", absl::StrCat("must be at least the number of workers (", num_workers,
                                       "), got ", spec.seq_len()));
  }
  return absl::OkStatus();
}

absl::Status ValidateSchedule(absl::string_view schedule) {
  if (schedule.empty() || schedule == "balanced" || schedule == "ring" || schedule == "distflash" ||
      schedule == "zigzag" || schedule == "heads" || schedule == "auto") {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("schedule: must be balanced, ring, distflash, zigzag, heads or auto, got \"",
                   schedule, "\""));
}

AttentionShape ShapeOf(const v1::AttentionSpec& spec) {
  AttentionShape shape;
  shape.batch = spec.batch();
  shape.q_heads = spec.q_heads();
  shape.kv_heads = spec.kv_heads();
  shape.head_dim = spec.head_dim();
  shape.dtype = static_cast<DType>(spec.dtype());
  return shape;
}

MaskSpec MaskSpecOf(const v1::AttentionSpec& spec) {
  MaskSpec m;
  m.causal = spec.causal();
  m.window_left = spec.has_window_left() ? spec.window_left() : -1;
  m.window_right = spec.has_window_right() ? spec.window_right() : -1;
  m.doc_offsets.reserve(static_cast<size_t>(spec.doc_offsets_size()));
  for (const v1::DocOffsets& row : spec.doc_offsets()) {
    m.doc_offsets.emplace_back(row.offsets().begin(), row.offsets().end());
  }
  return m;
}

void SetSpecMask(const MaskSpec& mask, v1::AttentionSpec* spec) {
  spec->clear_doc_offsets();
  for (const std::vector<int64_t>& row : mask.doc_offsets) {
    v1::DocOffsets* out = spec->add_doc_offsets();
    out->mutable_offsets()->Add(row.begin(), row.end());
  }
  spec->clear_window_left();
  spec->clear_window_right();
  if (mask.window_left != -1) spec->set_window_left(mask.window_left);
  if (mask.window_right != -1) spec->set_window_right(mask.window_right);
}

double SpecForwardFlops(const v1::AttentionSpec& spec) {
  const MaskSpec mask = MaskSpecOf(spec);
  const int64_t S = spec.seq_len();
  if (mask.IsDense()) {
    return ForwardFlops(spec.batch(), spec.q_heads(), spec.head_dim(), 0, S, 0, S, mask.Kind());
  }
  // Rows with the same documents count once.
  const int rows = mask.doc_offsets.size() > 1 ? spec.batch() : 1;
  double pairs = 0;
  for (int b = 0; b < rows; ++b) pairs += static_cast<double>(VisiblePairs(mask, b, S, 0, S, 0, S));
  pairs *= static_cast<double>(spec.batch()) / rows;
  return 4.0 * spec.q_heads() * spec.head_dim() * pairs;
}

float EffectiveScale(const v1::AttentionSpec& spec) {
  if (spec.softmax_scale() > 0.f) return spec.softmax_scale();
  return 1.f / std::sqrt(static_cast<float>(spec.head_dim()));
}

}  // namespace dfa
