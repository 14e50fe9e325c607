#include "coordinator/session_memory.h"

#include "worker/executor/session_storage.h"

namespace dfa {

AttentionShape ShapeOf(const v1::AttentionSpec& spec) {
  AttentionShape shape;
  shape.batch = spec.batch();
  shape.q_heads = spec.q_heads();
  shape.kv_heads = spec.kv_heads();
  shape.head_dim = spec.head_dim();
  shape.dtype = static_cast<DType>(spec.dtype());  // the enums share their values
  return shape;
}

int64_t SessionBytes(const v1::AttentionSpec& spec, int64_t owned_rows, int64_t scratch_bytes) {
  SessionShape shape;
  shape.batch = spec.batch();
  shape.q_heads = spec.q_heads();
  shape.kv_heads = spec.kv_heads();
  shape.head_dim = spec.head_dim();
  shape.dtype = static_cast<DType>(spec.dtype());
  return SessionStorageBytes(shape, owned_rows) + scratch_bytes;
}

}  // namespace dfa
