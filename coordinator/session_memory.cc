#include "coordinator/session_memory.h"

#include "core/shape.h"

namespace dfa {

double SessionBytesEstimate(const v1::AttentionSpec& spec) {
  const double rows = static_cast<double>(spec.batch()) * static_cast<double>(spec.seq_len());
  const double hq = spec.q_heads(), hkv = spec.kv_heads(), d = spec.head_dim();
  const double e = spec.dtype() == v1::DTYPE_F32 ? 4 : 2;
  // Q, dO, K, V (+ K/V in flight) in the client's dtype; fp32 dQ, dK, dV (the widest work
  // region); LSE, D fp32.
  return rows * ((2 * hq + 4 * hkv) * d * e + (hq + 2 * hkv) * d * 4 + 2 * hq * 4);
}

absl::StatusOr<WorkerMemory> SessionWorkerMemory(const v1::AttentionSpec& spec, const Plan& plan,
                                                 int rank, const CheckReport& report,
                                                 int64_t step_tokens) {
  if (rank < 0 || rank >= plan.num_workers()) {
    return absl::InvalidArgumentError("rank: outside the plan");
  }
  const AttentionShape local = LocalShape(ShapeOf(spec), plan.workers[rank]);
  return PlanWorkerMemory(plan, rank, local, report, step_tokens);
}

}  // namespace dfa
