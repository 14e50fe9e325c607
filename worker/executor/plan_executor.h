// PlanExecutor: runs ONE worker's steps of one pass (forward or backward) of a Plan
// (core/planner/plan.h) with an AttentionBackend and a Transport.
//
// The plan it runs is CutTransfers(plan, options.transfer_cut) (core/planner/worker_memory.h):
// the same units, every received row straight from its owner, steps with large receives cut
// into steps of bounded receives, partials returned one step after their last unit. The steps
// below (and PassStats::steps) are the cut plan's.
//
// Overlap (the paper's idea 2): step t+1's non-partial receives and sends (owned rows, buffers
// received earlier) are posted as one transport group (the "early" group) *before* step t
// computes, and waited for before step t+1 computes. (GPU transports: the group's readiness is
// marked on the stream before step t's computes, which are queued first; the group's launch
// follows them on the host but not on the device — Transport::MarkReady.) A transfer with a
// lead L (plan.h) is posted L steps earlier still, in its own group: every worker posts, at the
// start of step p, the groups (step u, lead u-1-p) for u = p+1, p+2, ... in that order.
// Step t+1's partials (kOutPartial, kDqPartial, kDkvPartial), sends and receives both, are
// posted as a second ("late") group right after step t's computes are queued, and waited for
// (and merged into the accumulators) right after step t+1's computes are queued, before step
// t+2's late group is posted, so a partial travels while the step that sends it computes, never
// delays it, and one late group's buffers are alive at a time. Every worker posts the groups in the same order (early t+1, late t+1, early t+2,
// ...) and each group's messages match only messages of the same kind of group of the same
// step on the peers, so even a transport that runs groups one after another (NCCL on one
// stream) cannot deadlock, including two workers exchanging partials in one step. The per-pair
// message order inside a group is the plan's canonical order on both sides. The executor
// itself never synchronises the host with the compute stream: a GPU transport's Wait makes the
// stream wait on an event (host transports block, as they must).
//
// Wire format of a Transfer (each a contiguous, dense message; K/V at kv_heads, never expanded):
//   kQ          : Q  [B, n, Hq, D] (dtype)
//   kKV         : K, V  [B, n, Hkv, D] (dtype), two messages
//   kOutPartial : O fp32 [B, n, Hq, D], LSE fp32 [B, Hq, n], two messages
//   kGradIn     : Q, dO [B, n, Hq, D] (dtype), LSE, D fp32 [B, Hq, n], four messages
//   kDqPartial  : dQ fp32 [B, n, Hq, D]
//   kDkvPartial : dK, dV fp32 [B, n, Hkv, D], two messages
// Precision: partial outputs and gradients are fp32 throughout; O is converted to the session
// dtype once, at the end of the forward pass, and the gradients at the end of the backward (a
// key chunk's dK, dV when the chunk completes).
//
// Threads: one executor is used by one thread at a time. backend, transport and storage are not
// owned and must outlive every call. Cancellation: set *options.cancel (checked before every
// step) or call Transport::Abort() from any thread; the pass then returns CANCELLED.
// Head groups (plan.h): a worker with a kv head range runs at the storage's shape, which must
// hold exactly that range's heads (the local shape, LocalShape); nothing is compared with the
// session's global head counts. Its peers are global ranks of its own head group.
// Errors: INVALID_ARGUMENT when the plan does not fit this worker (wrong owned ranges or head
// count, a compute
// on data it does not hold, ...), the backend's or transport's status otherwise. After an error
// the storage's outputs are unspecified.
// Implementation, one concern per file: plan_executor.cc (the pass loop), step_groups.h (group
// scheduling), pass_buffers.h (buffer lifetimes), pass_accumulators.h (outputs and gradients),
// step_compute.h (a step's backend calls and merges).
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "core/planner/plan.h"
#include "core/planner/worker_memory.h"
#include "core/status.h"
#include "core/transport.h"
#include "kernels/attention_backend.h"
#include "worker/executor/input_gate.h"
#include "worker/executor/output_gate.h"
#include "worker/executor/session_storage.h"

namespace dfa {

struct ExecutorOptions {
  float softmax_scale = 0.f;                   // 0: 1/sqrt(head_dim)
  void* compute_stream = nullptr;              // cudaStream_t for cuda; ignored by cpu
  absl::Duration step_timeout = absl::Seconds(120);  // per transport group Wait
  const std::atomic<bool>* cancel = nullptr;   // optional; true -> CANCELLED before the next step
  // Key rows per chunk of a chunked backward (a storage without fp32 dK/dV accumulators:
  // core/planner/worker_memory.h ChunkedBackward); must match what the storage was sized for.
  int64_t step_tokens = kDefaultStepTokens;
  // How the passes' transfers are cut into steps (core/planner/worker_memory.h CutTransfers):
  // the executor runs CutTransfers(plan, transfer_cut). Every worker of a session must use the
  // same figures, and admission (PlanWorkerMemory) the same.
  TransferCut transfer_cut;
  // A masked plan (Plan::mask() == kIntervals: documents, a window): the session's interval
  // arrays in the backend's memory (worker/session_mask.h), passed to every unit. Dense plans
  // leave them null and call kFull / kCausal.
  MaskIntervals mask_intervals;
  // Inputs still arriving (input_gate.h; not owned): the forward waits, before each unit on owned
  // rows, for its Q rows and K/V rows, and before each send of owned rows for the rows it
  // carries; the backward, before each unit, dQ partial and grad_in send on owned query rows,
  // for those rows' dO and for the dO of the O rows the zeroed part of dQ's fp32 accumulator
  // overlays (D = rowsum(dO·O) must be formed before O's memory is taken; pass_accumulators.h
  // PrepareQueries). Each wait is bounded by step_timeout and honours cancel; the time counts as
  // the step's idle time. null: the inputs are all present.
  InputGate* inputs = nullptr;
  // Outputs announced as their rows become final (output_gate.h; not owned): after each step but
  // the last, the owned rows whose outputs that step finished (output_finality.h) are converted
  // into the session's tensors, the compute stream is synchronised (GPU backends: a host wait),
  // and the gate is told. A chunked backward's dK, dV are announced at the end only. null: none
  // (the job's end makes every row final).
  OutputGate* outputs = nullptr;
};

// What one step cost. Times are host wall-clock: for a synchronous backend (cpu) busy is the
// compute time; for an asynchronous one it is the enqueue time (use stream events for truth).
struct StepStats {
  double busy_seconds = 0;  // computing (units, merges, accumulations)
  double idle_seconds = 0;  // waiting for this step's data
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  int64_t units = 0;        // compute ops of the plan step
  double flops = 0;         // ForwardFlops (core/mask.h) count (backward = 2.5x forward)
  // Backend calls by op, the metric labels of docs/metrics.md.
  int64_t forward_launches = 0;
  int64_t backward_launches = 0;
  int64_t merge_launches = 0;
  int64_t delta_launches = 0;
  int64_t other_launches = 0;  // converts, copies for packing, accumulations
};

struct PassStats {
  std::vector<StepStats> steps;
  double busy_seconds = 0;
  double idle_seconds = 0;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  double flops = 0;
  int64_t peak_scratch_bytes = 0;  // transfer buffers + partials alive at once (beyond storage)
};

class PlanExecutor {
 public:
  PlanExecutor(AttentionBackend* backend, Transport* transport, SessionStorage* storage,
               ExecutorOptions options = {});

  // Forward pass of `plan` for worker transport->rank(): reads storage q, k, v; writes o, lse.
  absl::StatusOr<PassStats> RunForward(const Plan& plan);
  // Backward pass: reads q, k, v, o, lse, dout; writes delta and the gradients in the session
  // dtype into q, k, v (storage dq(), dk(), dv()), consuming the inputs and O. Accumulates in
  // fp32 in the storage's work region: dQ of the owned rows, and dK, dV either of all owned rows
  // or, for a storage without them, key chunk by key chunk of `step_tokens` rows, each converted
  // into K's and V's slots once the step's calls on it are done. Never recomputes the forward
  // and never re-sends anything the forward already placed.
  absl::StatusOr<PassStats> RunBackward(const Plan& plan);

 private:
  AttentionBackend* backend_;
  Transport* transport_;
  SessionStorage* storage_;
  ExecutorOptions options_;
};

}  // namespace dfa
