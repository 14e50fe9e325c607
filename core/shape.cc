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

namespace {
int64_t Align(int64_t n) { return (n + kStorageAlign - 1) / kStorageAlign * kStorageAlign; }
}  // namespace

StorageBytes SessionStorageLayout(const AttentionShape& s, int64_t rows,
                                  const StorageLayout& layout) {
  const int64_t qe = int64_t{s.batch} * rows * s.q_heads * s.head_dim;
  const int64_t ke = int64_t{s.batch} * rows * s.kv_heads * s.head_dim;
  const int64_t st = int64_t{s.batch} * s.q_heads * rows;
  const int64_t es = DTypeSize(s.dtype);
  StorageBytes b;
  b.q = Align(qe * es);
  b.kv = Align(ke * es);
  b.dout = Align(qe * es);
  b.stat = Align(st * 4);
  b.o = Align(qe * es);
  int64_t forward = b.o;
  if (layout.forward_accumulator && s.dtype != DType::kF32) {
    b.o_acc_offset = b.o;
    forward += Align(qe * 4);
  }
  b.dq_acc = Align(qe * 4);
  int64_t backward = b.dq_acc;
  if (layout.kv_accumulators) {
    b.dk_acc_offset = backward;
    b.dv_acc_offset = backward + Align(ke * 4);
    backward += 2 * Align(ke * 4);
  }
  b.work = forward > backward ? forward : backward;
  b.total = b.q + 2 * b.kv + b.dout + 2 * b.stat + b.work;
  return b;
}

int64_t SessionStorageBytes(const AttentionShape& s, int64_t rows) {
  return SessionStorageLayout(s, rows, StorageLayout{}).total;
}

int64_t KeyChunkBytes(const AttentionShape& s, int64_t rows) {
  return 2 * Align(int64_t{s.batch} * rows * s.kv_heads * s.head_dim * 4);
}

}  // namespace dfa
