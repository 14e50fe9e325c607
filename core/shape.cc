#include "core/shape.h"

#include "absl/strings/str_cat.h"

namespace dfa {

absl::Status AttentionShape::Validate() const {
  auto bad = [](const char* field, auto... what) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", what...));
  };
  if (batch < 1) return bad("batch", "must be >= 1, got ", batch);
  if (q_heads < 1) return bad("q_heads", "must be >= 1, got ", q_heads);
  if (kv_heads < 1) return bad("kv_heads", "must be >= 1, got ", kv_heads);
  if (q_heads % kv_heads != 0) {
    return bad("q_heads", "must be a multiple of kv_heads (", kv_heads, "), got ", q_heads);
  }
  if (head_dim < 1) return bad("head_dim", "must be >= 1, got ", head_dim);
  if (head_dim > kMaxHeadDim) {
    return bad("head_dim", "must be <= ", kMaxHeadDim, " (max_head_dim), got ", head_dim);
  }
  return absl::OkStatus();
}

int64_t SessionStorageBytes(const AttentionShape& s, int64_t rows) {
  const int64_t qe = int64_t{s.batch} * rows * s.q_heads * s.head_dim;
  const int64_t ke = int64_t{s.batch} * rows * s.kv_heads * s.head_dim;
  const int64_t st = int64_t{s.batch} * s.q_heads * rows;
  const int64_t es = DTypeSize(s.dtype);
  // q, o, dout (dtype) + k, v (dtype) + dq (f32) + dk, dv (f32) + lse, delta (f32)
  return 3 * qe * es + 2 * ke * es + qe * 4 + 2 * ke * 4 + 2 * st * 4;
}

}  // namespace dfa
