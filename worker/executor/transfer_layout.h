// How each PlanTensor is laid out on the wire and in the executor's buffers (internal to the
// executor): a list of dense components, each [B, n, heads, D] or, for statistics, fp32
// [B, heads, n]. See plan_executor.h for the table.
#pragma once

#include <cstdint>
#include <vector>

#include "core/planner/plan.h"
#include "kernels/attention_backend.h"
#include "worker/executor/session_storage.h"

namespace dfa::executor_internal {

struct Component {
  DType dtype;
  int heads;
  bool stat;  // per-row statistic (fp32 [B, heads, n])
};

std::vector<Component> Components(PlanTensor tensor, const AttentionShape& shape);
int64_t ComponentBytes(const Component& c, const AttentionShape& shape, int64_t rows);

// Rows [off, off + n) of a component stored densely over `total` rows at `base`, as a
// TensorView (statistics become [B*heads, n, 1, 1] with batch stride `total`, which lets the
// backend's Convert copy them like any tensor).
TensorView ComponentView(void* base, const Component& c, const AttentionShape& shape, int64_t total,
                         int64_t off, int64_t n);
// Rows [off, off + n) of a dense fp32 [B, Hq, total] statistic.
RowStatView StatView(void* base, const AttentionShape& shape, int64_t total, int64_t off, int64_t n);
// True when the view's elements are one contiguous run (can be sent without packing).
bool IsContiguous(const TensorView& v);

// dst += src, element-wise, both fp32 and the same shape, through AttentionBackend::Accumulate
// (queued on `stream` for device backends; no host synchronisation).
absl::Status AddInto(AttentionBackend& backend, const TensorView& dst, const TensorView& src,
                     void* stream);

}  // namespace dfa::executor_internal
