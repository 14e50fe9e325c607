// The simulator: executes a whole Plan in one process, one thread per worker, each with its own
// PlanExecutor, SessionStorage and backend, connected by an InprocTransport hub. Forward, then
// backward. Used by the tests to prove plans exact against single-device attention, and by
// benchmarks. Requires a host-memory backend ("cpu"). Head-split plans (plan.h "Head groups"):
// each worker gets its head slice of the global Q, K, V, dO (a storage of its local shape) and
// writes back its slice of the outputs and gradients.
#pragma once

#include <string>
#include <vector>

#include "core/planner/plan.h"
#include "worker/executor/plan_executor.h"
#include "worker/executor/session_storage.h"

namespace dfa {

// Whole-sequence host tensors, fp32, dense BSHD ([B, S, H, D]); rounded to the session dtype
// when loaded into the workers.
struct SimulationInputs {
  std::vector<float> q, k, v;  // q: [B, S, Hq, D]; k, v: [B, S, Hkv, D]
  std::vector<float> dout;     // [B, S, Hq, D]; empty: forward only
};

struct SimulationResult {
  std::vector<float> out;             // [B, S, Hq, D] (session dtype values, as fp32)
  std::vector<float> lse;             // [B, Hq, S]
  std::vector<float> dq, dk, dv;      // fp32, [B, S, H, D] (empty when forward only)
  std::vector<PassStats> forward;     // per worker
  std::vector<PassStats> backward;    // per worker
};

struct SimulationOptions {
  std::string backend = "cpu";
  int threads_per_worker = 1;
  float softmax_scale = 0.f;  // 0: 1/sqrt(D)
  absl::Duration step_timeout = absl::Seconds(60);
};

// INVALID_ARGUMENT for inputs of the wrong size, a bad shape or a worker's kv head range outside
// shape.kv_heads; the first worker's error otherwise.
absl::StatusOr<SimulationResult> Simulate(const Plan& plan, const AttentionShape& shape,
                                          const SimulationInputs& inputs,
                                          const SimulationOptions& options = {});

}  // namespace dfa
