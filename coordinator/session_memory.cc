#include "coordinator/session_memory.h"

#include "core/shape.h"

namespace dfa {

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
  // The worker's storage shape: the spec's, cut to the worker's key/value heads.
  WorkerPlan w;
  w.kv_heads = kv_heads;
  const AttentionShape local = LocalShape(ShapeOf(spec), w);
  return SessionStorageBytes(local, owned_rows) + scratch_bytes;
}

}  // namespace dfa
