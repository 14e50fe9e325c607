// Small builders shared by the client's unit tests (shard I/O, head slices, CUDA IPC requests).
#pragma once

#include <cstdint>

#include "dfa/v1/attention.pb.h"

namespace dfa::client::test_util {

// A causal bf16 spec of the given shape.
inline v1::AttentionSpec Spec(int batch, int64_t seq, int hq, int hkv, int d) {
  v1::AttentionSpec s;
  s.set_batch(batch);
  s.set_seq_len(seq);
  s.set_q_heads(hq);
  s.set_kv_heads(hkv);
  s.set_head_dim(d);
  s.set_causal(true);
  s.set_dtype(v1::DTYPE_BF16);
  return s;
}

// The row range [b, e).
inline v1::RowRange R(int64_t b, int64_t e) {
  v1::RowRange r;
  r.set_begin(b);
  r.set_end(e);
  return r;
}

}  // namespace dfa::client::test_util
