#include "coordinator/session_memory.h"

#include <algorithm>

#include "worker/executor/session_storage.h"

namespace dfa {
namespace {

int64_t ElementBytes(v1::DType t) { return t == v1::DTYPE_F32 ? 4 : 2; }

// Bytes per row of one received buffer of `tensor`.
int64_t TransferRowBytes(const v1::AttentionSpec& spec, v1::PlanTensor tensor) {
  const int64_t b = spec.batch(), hq = spec.q_heads(), hkv = spec.kv_heads();
  const int64_t d = spec.head_dim(), e = ElementBytes(spec.dtype());
  switch (tensor) {
    case v1::PLAN_Q: return b * hq * d * e;
    case v1::PLAN_KV: return 2 * b * hkv * d * e;
    case v1::PLAN_OUT_PARTIAL: return b * hq * (d + 1) * 4;
    case v1::PLAN_GRAD_IN: return b * hq * (2 * d * e + 2 * 4);
    case v1::PLAN_DQ_PARTIAL: return b * hq * d * 4;
    case v1::PLAN_DKV_PARTIAL: return 2 * b * hkv * d * 4;
    default: return 0;
  }
}

int64_t LargestStepRecv(const v1::AttentionSpec& spec,
                        const google::protobuf::RepeatedPtrField<v1::PlanStep>& steps) {
  int64_t largest = 0;
  for (const v1::PlanStep& step : steps) {
    int64_t bytes = 0;
    for (const v1::PlanTransfer& t : step.recvs()) {
      bytes += std::max<int64_t>(0, t.rows().end() - t.rows().begin()) *
               TransferRowBytes(spec, t.tensor());
    }
    largest = std::max(largest, bytes);
  }
  return largest;
}

}  // namespace

int64_t PlanBufferBytes(const v1::AttentionSpec& spec, const v1::WorkerPlan& plan) {
  const int64_t fwd = LargestStepRecv(spec, plan.forward_steps());
  const int64_t bwd = LargestStepRecv(spec, plan.backward_steps());
  return 2 * std::max(fwd, bwd);
}

int64_t SessionBytesForWorker(const v1::AttentionSpec& spec, const v1::WorkerPlan& plan) {
  int64_t rows = 0;
  for (const v1::RowRange& r : plan.owned()) rows += std::max<int64_t>(0, r.end() - r.begin());
  SessionShape shape;
  shape.batch = spec.batch();
  shape.q_heads = spec.q_heads();
  shape.kv_heads = spec.kv_heads();
  shape.head_dim = spec.head_dim();
  shape.dtype = static_cast<DType>(spec.dtype());  // the enums share their values
  return SessionStorageBytes(shape, rows) + PlanBufferBytes(spec, plan);
}

}  // namespace dfa
