#include "core/spec_validation.h"

#include <cmath>

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
  return absl::OkStatus();
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

float EffectiveScale(const v1::AttentionSpec& spec) {
  if (spec.softmax_scale() > 0.f) return spec.softmax_scale();
  return 1.f / std::sqrt(static_cast<float>(spec.head_dim()));
}

}  // namespace dfa
