// Step compute of one pass (internal to the executor): a step's compute ops, fused into as few
// backend calls as exactness allows (op_fusion.h). Each call reads its query side and its
// key/value side from owned storage or a received buffer, and writes
//   forward:  owned rows -> the output accumulator (pass_accumulators.h); received Q -> an
//             O/LSE partial for the rows' owner (pass_buffers.h);
//   backward: owned rows -> dQ, dK, dV in storage; received grad_in / K/V -> a dQ / dK/dV
//             partial for the rows' owner.
// Merge takes a partial received by its owner into the accumulators (forward: a merge of
// O/LSE; backward: dQ, dK, dV added).
#pragma once

#include "core/planner/plan.h"
#include "core/status.h"
#include "worker/executor/op_fusion.h"
#include "worker/executor/pass_accumulators.h"
#include "worker/executor/pass_buffers.h"
#include "worker/executor/pass_context.h"

namespace dfa::executor_internal {

class StepCompute {
 public:
  StepCompute(PassContext* ctx, PassBuffers* buffers, PassAccumulators* acc)
      : ctx_(*ctx), buffers_(*buffers), acc_(*acc) {}

  // Queues step t's computes (INVALID_ARGUMENT for an op on rows the worker neither owns nor
  // has received).
  absl::Status RunStep(int t);
  // A partial received by its owner: merged (forward) or added (backward) into the
  // accumulators; counted on the running step.
  absl::Status Merge(const Buffer& arrival);

 private:
  // Where an op's rows live (owned storage or a received buffer; null buffer = owned).
  struct Side {
    RowPlace place;
    Buffer* buffer = nullptr;
  };
  absl::StatusOr<Side> QuerySide(const RowRange& rows, int t);
  absl::StatusOr<Side> KvSide(const RowRange& rows, int t);
  absl::Status Compute(const FusedCall& call, const Side& q, const Side& kv, int t);

  PassContext& ctx_;
  PassBuffers& buffers_;
  PassAccumulators& acc_;
};

}  // namespace dfa::executor_internal
