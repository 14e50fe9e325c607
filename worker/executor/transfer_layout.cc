#include "worker/executor/transfer_layout.h"

#include <vector>

namespace dfa::executor_internal {

std::vector<Component> Components(PlanTensor tensor, const AttentionShape& s) {
  const Component q{s.dtype, s.q_heads, false}, kv{s.dtype, s.kv_heads, false};
  const Component q32{DType::kF32, s.q_heads, false}, kv32{DType::kF32, s.kv_heads, false};
  const Component stat{DType::kF32, s.q_heads, true};
  switch (tensor) {
    case PlanTensor::kQ: return {q};
    case PlanTensor::kKV: return {kv, kv};
    case PlanTensor::kOutPartial: return {q32, stat};
    case PlanTensor::kGradIn: return {q, q, stat, stat};
    case PlanTensor::kDqPartial: return {q32};
    case PlanTensor::kDkvPartial: return {kv32, kv32};
  }
  return {};
}

int64_t ComponentBytes(const Component& c, const AttentionShape& s, int64_t rows) {
  const int64_t per_row = c.stat ? int64_t{c.heads} : int64_t{c.heads} * s.head_dim;
  return int64_t{s.batch} * rows * per_row * DTypeSize(c.dtype);
}

TensorView ComponentView(void* base, const Component& c, const AttentionShape& s, int64_t total,
                         int64_t off, int64_t n) {
  TensorView v;
  v.dtype = c.dtype;
  if (c.stat) {
    v.data = static_cast<float*>(base) + off;
    v.batch = s.batch * c.heads;
    v.rows = n;
    v.heads = 1;
    v.head_dim = 1;
    v.row_stride = 1;
    v.batch_stride = total;
    return v;
  }
  v.data = base;
  v.batch = s.batch;
  v.rows = total;
  v.heads = c.heads;
  v.head_dim = s.head_dim;
  return v.Slice(off, n);
}

RowStatView StatView(void* base, const AttentionShape& s, int64_t total, int64_t off, int64_t n) {
  RowStatView v;
  v.data = static_cast<float*>(base);
  v.batch = s.batch;
  v.heads = s.q_heads;
  v.rows = total;
  return v.Slice(off, n);
}

bool IsContiguous(const TensorView& v) {
  const int64_t width = int64_t{v.heads} * v.head_dim;
  return v.RowStride() == width && (v.batch == 1 || v.BatchStride() == v.rows * width);
}

absl::Status AddInto(AttentionBackend& backend, const TensorView& dst, const TensorView& src,
                     void* stream) {
  if (dst.dtype != DType::kF32 || src.dtype != DType::kF32 || dst.batch != src.batch ||
      dst.rows != src.rows || dst.heads != src.heads || dst.head_dim != src.head_dim) {
    return absl::InvalidArgumentError("AddInto: dst and src must be fp32 views of one shape");
  }
  // On the backend's own stream: no host round trip, no synchronisation.
  return backend.Accumulate(src, dst, stream);
}

}  // namespace dfa::executor_internal
