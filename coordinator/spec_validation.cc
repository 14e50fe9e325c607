#include "coordinator/spec_validation.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace dfa {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("spec.", field, ": ", what));
}

}  // namespace

absl::Status ValidateSpec(const v1::AttentionSpec& spec, const CoordinatorLimits& limits) {
  if (spec.batch() < 1 || spec.batch() > limits.max_batch) {
    return Bad("batch", absl::StrCat("must be in [1, ", limits.max_batch, "], got ", spec.batch()));
  }
  if (spec.q_heads() < 1 || spec.q_heads() > limits.max_heads) {
    return Bad("q_heads",
               absl::StrCat("must be in [1, ", limits.max_heads, "], got ", spec.q_heads()));
  }
  if (spec.kv_heads() < 1 || spec.kv_heads() > limits.max_heads) {
    return Bad("kv_heads",
               absl::StrCat("must be in [1, ", limits.max_heads, "], got ", spec.kv_heads()));
  }
  if (spec.q_heads() % spec.kv_heads() != 0) {
    return Bad("kv_heads",
               absl::StrCat("q_heads (", spec.q_heads(), ") must be a multiple of kv_heads (",
                            spec.kv_heads(), ")"));
  }
  if (spec.head_dim() < 1 || spec.head_dim() > 512) {
    return Bad("head_dim", absl::StrCat("must be in [1, 512], got ", spec.head_dim()));
  }
  if (spec.seq_len() < 1 || spec.seq_len() > limits.max_seq_len) {
    return Bad("seq_len", absl::StrCat("must be in [1, ", limits.max_seq_len, "] (the limit is ",
                                       "--max_seq_len), got ", spec.seq_len()));
  }
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

float EffectiveScale(const v1::AttentionSpec& spec) {
  if (spec.softmax_scale() > 0.f) return spec.softmax_scale();
  return 1.f / std::sqrt(static_cast<float>(spec.head_dim()));
}

}  // namespace dfa
