// The cost model: how long a plan takes, who idles, and what moves, without running it.
//
// Compute: a unit costs its visible (query, key) pairs x 4·B·Hq·D FLOPs (backward: x2.5, the
// usual FlashAttention count) at `flops_per_second` x the worker's relative speed, plus
// `op_overhead_seconds` per compute op (kernel launch, prologue, accumulate pass: what a real GPU
// pays per unit whatever its size; not scaled by speed, and not part of the ideal), plus, when
// `memory_bandwidth_bytes_per_second` > 0, the op's fp32 accumulate traffic at that bandwidth:
// a forward op LSE-merges its result into an fp32 accumulator (own output or a partial buffer),
// reading and writing q_rows x Hq x D x 4 B (+ the LSE); a backward op adds into the fp32 dQ
// (q_rows x Hq x D) and dK/dV (2 x kv_rows x Hkv x D) accumulators, read and write. Neither is
// scaled by speed nor part of the ideal. GpuCostParams / CpuCostParams below are the two
// named profiles (docs/planner.md, "Cost model").
// Communication: a message costs latency + bytes / bandwidth; each worker has one outgoing and
// one incoming link, each carrying one message at a time. A message starts when both sides
// have posted it.
// Posting mirrors the PlanExecutor exactly: step t+1's non-partial receives and sends are posted
// when step t's compute starts; step t+1's partial sends and receives when step t's compute
// ends. Step t's compute starts when step t-1's compute has ended, step t's non-partial messages
// are done and step t-1's partial messages are done. So step t+1's transfers overlap step t's
// compute (double buffering) and a partial overlaps the compute of the step that sends it.
// The last step's partials end the pass when they arrive. Messages are modelled on the two links
// of each worker, in posting order; a transport that runs whole groups one after another (NCCL
// on one stream) is a little more serial than that.
// Head groups (plan.h): a worker with a kv head range is costed at its LocalShape (FLOPs per
// pair, merge traffic, bytes of its messages); work_units still count all heads' pairs, so a
// worker holding half the heads of a full unit does 0.5 of it.
// Virtual ranks (plan.h): a worker runs its ranks in lock-step: its step t is the step-t
// computes of all its ranks, one after another, starting when the step-t messages of all of
// them are done (and the step t-1 partials); their messages are posted at the worker's step
// times and share its two links. So a rank's messages travel while the worker computes another
// rank's share of the step (whole heads hiding a shared plan's K/V). WorkerCost is per worker
// (work units, ops and bytes summed over its ranks); a unit is (S / workers)^2.
// Makespan: when the last worker ends its last step. Ideal: total compute seconds of all units
// at total speed (sum of speeds), i.e. perfect balance with free communication.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/planner/plan.h"
#include "core/status.h"

namespace dfa {

struct CostParams {
  AttentionShape shape;
  std::vector<double> speeds;          // relative, one per worker (plan.h); empty: all 1
  double flops_per_second = 400e12;    // one worker at speed 1
  double bandwidth_bytes_per_second = 300e9;  // per link and direction; 0: free communication
  double latency_seconds = 20e-6;      // per message
  // Fixed cost of one compute op. 0 (the default) measures a plan's balance alone; the balanced
  // search charges kSearchOpOverheadSeconds (planner.h) so that it does not cut work into many
  // small pieces for a hair of balance (docs/planner.md, "Cost model").
  double op_overhead_seconds = 0;
  // Device memory bandwidth for the per-op accumulate (merge) traffic; 0 (the default): ignored.
  double memory_bandwidth_bytes_per_second = 0;
};

// The named profiles. "cpu": the figures `dfa plan` has always printed (400 TFLOP/s, 300 GB/s,
// 20 us, no per-op or merge cost): a plan's balance alone. "gpu": H200-like workers running
// cuDNN-class kernels, measured on 2xH200 (docs/planner.md): 600 TFLOP/s, 300 GB/s NVLink per
// direction, 100 us per message (NCCL floor ~110 us per exchange), 60 us per compute op, merge
// traffic at 3 TB/s. `speeds` as in CostParams (empty: all 1).
CostParams CpuCostParams(const AttentionShape& shape, std::vector<double> speeds = {});
CostParams GpuCostParams(const AttentionShape& shape, std::vector<double> speeds = {});
// "cpu" or "gpu"; INVALID_ARGUMENT (naming `profile`) otherwise.
absl::StatusOr<CostParams> CostParamsForProfile(const std::string& profile,
                                                const AttentionShape& shape,
                                                std::vector<double> speeds = {});

struct WorkerCost {
  double busy_seconds = 0;
  double idle_seconds = 0;   // waiting for messages before a step, until its last step ends
  double end_seconds = 0;    // when its last step ends
  double work_units = 0;     // visible pairs / (S/P)^2: a full unit of contiguous ring shards
  int compute_ops = 0;       // compute ops (kernel launches) in the pass
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  std::vector<double> step_busy_seconds;
  std::vector<double> step_idle_seconds;
};

struct PassCost {
  std::vector<WorkerCost> workers;
  double makespan_seconds = 0;
  double ideal_seconds = 0;
  double makespan_ratio = 0;          // makespan / ideal (>= 1)
  double compute_makespan_ratio = 0;  // max busy-at-speed / ideal: communication left out
  int steps = 0;
};

struct PlanCost {
  PassCost forward;
  PassCost backward;
};

// INVALID_ARGUMENT for speeds of the wrong count or not positive, non-positive flops, negative
// bandwidth, latency, op overhead or memory bandwidth. The plan is assumed to pass CheckPlan.
absl::StatusOr<PlanCost> EstimateCost(const Plan& plan, const CostParams& params);

}  // namespace dfa
