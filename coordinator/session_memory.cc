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

double SessionBytesEstimate(const v1::AttentionSpec& spec) {
  const double rows = static_cast<double>(spec.batch()) * static_cast<double>(spec.seq_len());
  const double hq = spec.q_heads(), hkv = spec.kv_heads(), d = spec.head_dim();
  const double e = spec.dtype() == v1::DTYPE_F32 ? 4 : 2;
  // Q, O, dO, K, V (+ K/V in flight) in the client's dtype; dQ, dK, dV fp32; LSE, D fp32.
  return rows * ((3 * hq + 4 * hkv) * d * e + (hq + 2 * hkv) * d * 4 + 2 * hq * 4);
}

int64_t SessionBytes(const v1::AttentionSpec& spec, int64_t owned_rows, int64_t scratch_bytes) {
  return SessionBytes(spec, HeadRange{}, owned_rows, scratch_bytes);
}

int64_t SessionBytes(const v1::AttentionSpec& spec, const HeadRange& kv_heads, int64_t owned_rows,
                     int64_t scratch_bytes) {
  // The worker's storage shape (worker/session_registry.cc cuts it the same way).
  WorkerPlan w;
  w.kv_heads = kv_heads;
  const AttentionShape local = LocalShape(ShapeOf(spec), w);
  SessionShape shape;
  shape.batch = local.batch;
  shape.q_heads = local.q_heads;
  shape.kv_heads = local.kv_heads;
  shape.head_dim = local.head_dim;
  shape.dtype = local.dtype;
  return SessionStorageBytes(shape, owned_rows) + scratch_bytes;
}

}  // namespace dfa
