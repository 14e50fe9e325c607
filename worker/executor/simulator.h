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
#include "core/planner/worker_memory.h"
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
  // Per worker: the most backend memory it held at once (storage, buffers, key chunks),
  // measured by MemoryTrackingBackend, and what core/planner/worker_memory.h predicts
  // (WorkerMemory::peak with the plan's CheckPlan report): what admission charges.
  std::vector<int64_t> peak_bytes;
  std::vector<int64_t> predicted_bytes;
  // Per worker: the most each pass held beyond the storage (buffers, partials, key chunks).
  std::vector<int64_t> forward_peak_bytes, backward_peak_bytes;
};

struct SimulationOptions {
  std::string backend = "cpu";
  int threads_per_worker = 1;
  float softmax_scale = 0.f;  // 0: 1/sqrt(D)
  absl::Duration step_timeout = absl::Seconds(60);
  // Key rows per chunk of a chunked backward (each worker's storage has the layout its plan
  // needs: PlanWorkerMemory).
  int64_t step_tokens = kDefaultStepTokens;
  // How the executors cut transfers into steps (and admission counts them): ExecutorOptions.
  TransferCut transfer_cut;
  // Run each pass as a streamed job runs (ExecutorOptions::inputs and ::outputs set): every
  // input row already present (so the backward forms D range by range), and every row the pass
  // announces final checked against the end of the pass: the bytes the rows held when announced
  // must be the bytes they end with (INTERNAL naming the worker, pass and rows otherwise).
  bool streamed = false;
};

// INVALID_ARGUMENT for inputs of the wrong size, a bad shape or a worker's kv head range outside
// shape.kv_heads; the first worker's error otherwise.
absl::StatusOr<SimulationResult> Simulate(const Plan& plan, const AttentionShape& shape,
                                          const SimulationInputs& inputs,
                                          const SimulationOptions& options = {});

}  // namespace dfa
