// Step compute of one pass (internal to the executor): a step's compute ops, fused into as few
// backend calls as exactness allows (op_fusion.h). Each call reads its query side and its
// key/value side from owned storage or a received buffer, and writes
//   forward:  owned rows -> the output accumulator (pass_accumulators.h); received Q -> an
//             O/LSE partial for the rows' owner (pass_buffers.h);
//   backward: owned rows -> the fp32 dQ accumulator; owned keys -> the fp32 dK, dV
//             accumulators, or (chunked backward) key chunk by key chunk, each chunk's pieces
//             of every call of the step, then the chunk converted (pass_accumulators.h);
//             received grad_in / K/V -> a dQ / dK/dV partial for the rows' owner.
// Merge takes a partial received by its owner into the accumulators (forward: a merge of
// O/LSE; backward: dQ, dK, dV added).
#pragma once

#include <memory>

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
  // Key rows [off, off + n) of a call (a piece of key chunk `chunk` in a chunked backward; n < 0:
  // the whole call). `first`: the call's first piece (counts its units and FLOPs).
  struct KeyPiece {
    int64_t off = 0;
    int64_t n = -1;
    int64_t chunk = -1;
    bool first = true;
  };
  absl::Status Compute(const FusedCall& call, const Side& q, const Side& kv, int t,
                       const KeyPiece& piece);
  // Inputs still arriving (ExecutorOptions::inputs): waits for the owned Q rows and K/V rows the
  // call's ops read.
  absl::Status WaitForInputs(const FusedCall& call, const std::vector<ComputeOp>& ops,
                             const std::vector<Side>& qs, const std::vector<Side>& kvs);
  // Inputs still arriving: whether the forward runs `call` in query blocks, each once its own
  // rows have arrived (a causal call on owned queries and owned keys, each side one global
  // range, every query at or after the first key), so the first blocks compute while the rest
  // is uploaded. Compute then waits block by block instead of WaitForInputs.
  bool StreamInBlocks(const FusedCall& call, const Side& q, const Side& kv) const;
  // A chunked backward's piece of a call on owned keys: dK, dV into the chunk's accumulators.
  absl::Status ComputePiece(const FusedCall& call, const Side& q, int t, const KeyPiece& piece);

  // Visible pairs of a unit under the plan's mask (FLOPs, fusion and skipping of a masked
  // plan); made on the first step of a masked plan.
  const UnitPairs* MaskedPairs();

  PassContext& ctx_;
  PassBuffers& buffers_;
  PassAccumulators& acc_;
  std::unique_ptr<UnitPairs> pairs_;
};

}  // namespace dfa::executor_internal
