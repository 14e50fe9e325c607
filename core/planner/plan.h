// A plan: which worker computes which attention unit in which step, and what moves where.
// Plans are data (printable, convertible to dfa.v1.Plan, checkable by CheckPlan); the
// planner makes them, the workers' PlanExecutor runs them, the simulator runs them in-process.
//
// Semantics of one pass (forward or backward) on worker w, step t:
//  1. Non-partial recvs[t] complete before computes[t] start. The executor posts them early
//     (during step t-1's computes): that is the overlap of communication with computation.
//     Partial transfers of step t (sends and recvs) are posted when step t-1's computes end and
//     complete before computes[t+1] (or the end of the pass): a partial is merged/added into the
//     owner's accumulators one step after it is sent, so it travels during step t's computes.
//  2. computes[t]: each op is one unit q_rows x kv_rows under the plan's mask. q_rows must lie
//     inside one range w owns or one query-side buffer w has received (kQ forward, kGradIn
//     backward, this step or earlier); kv_rows inside one owned range or one received kKV
//     buffer. Results:
//       forward: q_rows owned by w -> LSE-merged into w's output accumulator; otherwise
//                merged into w's partial buffer (kOutPartial, q_rows' enclosing buffer rows).
//       backward: dQ -> w's dQ accumulator if owned, else the (kDqPartial) partial buffer;
//                 dK/dV -> w's accumulators if kv owned, else the (kDkvPartial) buffer.
//  3. sends[t] carry data available at the start of step t: owned Q/KV (and, backward, dO,
//     LSE, D as kGradIn), buffers received in earlier steps (forwarding), or partial buffers
//     completed by computes of earlier steps. (A non-partial transfer with lead L is posted at
//     the start of step t-1-L: what it forwards must belong to a step <= t-1-L.) A partial received by its owner (kOutPartial,
//     kDqPartial, kDkvPartial) is merged/added into the owner's accumulator on arrival.
//  Every send in step t from w to p is matched by exactly one recv in step t on p from w with
//  the same tensor and rows; all sends/recvs of a step are posted together (one NCCL group), so
//  no ordering inside a step can deadlock. Between one pair of workers the messages of a step
//  are posted in CanonicalTransferLess order on both sides (non-partials first: the executor
//  posts step t+1's partial sends and recvs after step t's computes, the rest before them).
//  A kQ/kKV/kGradIn send of rows not owned by the sender forwards (a part of) a buffer it
//  received earlier. A partial buffer is sent exactly once, whole, to the owner of its rows, and
//  no compute writes to it after that. Every visible (query, key) pair is computed exactly once
//  per pass; CheckPlan (plan_checker.h) verifies all of this.
//  A plan may end with steps that only communicate (e.g. the backward's last dK/dV partials).
//
// Head groups. A worker may hold only a range of the key/value heads (WorkerPlan::kv_heads,
// with the query heads of those groups: q head h belongs to kv head h / (q_heads / kv_heads)).
// Workers with the same head range form a head group: each group is a complete plan of its own
// over its rows (owned ranges of the group partition [0, seq_len)), its transfers stay inside
// the group, and the groups' head ranges partition [0, kv_heads). An empty range (the default)
// means all heads: one group, the plans above. A worker's tensors, buffers and transfers hold
// only its heads, so the executor runs its part with the local head counts
// (LocalShape below). Schedule "heads" (planner.h) makes such plans (Ulysses-style head
// parallelism; hybrid head groups x sequence plans when P > groups).
//
// Virtual ranks. With Plan::rank_workers set, each entry of Plan::workers is a *rank*: a
// complete WorkerPlan of its own (owned rows, head range, steps; peers in transfers are ranks),
// and rank r runs on worker rank_workers[r]. A worker may run several ranks, e.g. whole heads
// over all rows (no traffic) and a share of the remaining heads split by sequence over all
// workers, whose traffic the whole heads' compute hides ("balanced" with session_shape,
// docs/planner.md "Schedules"). Everything above holds per rank (CheckPlan proves each head
// group exact); the cost model runs a worker's ranks in lock-step on one device and one pair of
// links (step t of all its ranks, one after another: cost_model.h); the simulator runs each rank
// as its own executor.
// Empty (the default): rank r is worker r. Sessions run one rank per worker: dfa.v1.Plan does
// not carry the map and MakeSessionPlan refuses a plan that has one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/mask.h"
#include "core/shape.h"
#include "core/status.h"

namespace dfa {

struct RowRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool Contains(const RowRange& o) const { return begin <= o.begin && o.end <= end; }
  friend bool operator==(const RowRange&, const RowRange&) = default;
};

enum class PlanTensor : int {
  kQ = 1,           // forward: queries of the rows
  kKV = 2,          // keys and values of the rows (at kv_heads)
  kOutPartial = 3,  // forward: fp32 partial output + LSE (helper -> owner)
  kGradIn = 4,      // backward: Q, dO, LSE, D of the rows (owner -> helper)
  kDqPartial = 5,   // backward: fp32 dQ partial (helper -> owner)
  kDkvPartial = 6,  // backward: fp32 dK, dV partials (-> kv owner)
};

struct Transfer {
  int peer = 0;
  PlanTensor tensor = PlanTensor::kKV;
  RowRange rows;
  // Non-partial transfers only: posted `lead` steps earlier than the step before the one that
  // needs it (at the start of step t - 1 - lead; -1 = before the pass), so it has lead + 1 steps
  // of compute to travel in. Both sides carry the same lead. A forwarded buffer must have
  // arrived by then: its own step <= t - 1 - lead. 0 = the default rule above.
  int lead = 0;
  friend bool operator==(const Transfer&, const Transfer&) = default;
};

struct ComputeOp {
  RowRange q_rows;
  RowRange kv_rows;
  friend bool operator==(const ComputeOp&, const ComputeOp&) = default;
};

struct PlanStep {
  std::vector<Transfer> sends;
  std::vector<Transfer> recvs;
  std::vector<ComputeOp> computes;
};

// A half-open range [begin, end) of key/value heads; empty (0, 0) = all heads.
struct HeadRange {
  int begin = 0;
  int end = 0;
  int size() const { return end - begin; }
  bool empty() const { return end <= begin; }
  friend bool operator==(const HeadRange&, const HeadRange&) = default;
};

struct WorkerPlan {
  std::vector<RowRange> owned;  // this worker's shard, sorted by position
  HeadRange kv_heads;           // the key/value heads it holds; empty = all (see "Head groups")
  std::vector<PlanStep> forward;
  std::vector<PlanStep> backward;
};


// The kv head range worker `w` holds, resolved: an empty WorkerPlan::kv_heads = [0, kv_heads).
HeadRange WorkerKvHeads(const WorkerPlan& w, int kv_heads);
// The per-token shape worker `w` holds: `full` with q_heads/kv_heads cut to its head range.
AttentionShape LocalShape(const AttentionShape& full, const WorkerPlan& w);

// Bytes one Transfer of `rows` rows moves (the executor's wire format, see
// worker/executor/plan_executor.h): K/V at kv_heads, partials and statistics in fp32.
int64_t TransferBytes(const AttentionShape& shape, PlanTensor tensor, int64_t rows);
// "q", "kv", "out_partial", "grad_in", "dq_partial", "dkv_partial".
const char* PlanTensorName(PlanTensor t);
// Partials are produced by computes and merged/added by the receiving owner.
inline bool IsPartial(PlanTensor t) {
  return t == PlanTensor::kOutPartial || t == PlanTensor::kDqPartial ||
         t == PlanTensor::kDkvPartial;
}
// Canonical order of the transfers between one pair of workers in one step: non-partial before
// partial tensors (the executor posts partials after the step's computes), then by tensor, rows.
bool CanonicalTransferLess(const Transfer& a, const Transfer& b);

struct Plan {
  std::string schedule;
  int64_t seq_len = 0;
  bool causal = true;
  std::vector<WorkerPlan> workers;
  // The rest of the mask (core/mask.h): packed documents per batch row and a sliding window.
  // Its own `causal` is not read: the plan's mask is Mask(), this with causal = `causal`.
  // Default: no documents, no window (a dense plan: kFull / kCausal). A masked plan computes
  // only units with visible pairs; CheckPlan proves it exact under Mask().
  MaskSpec mask_spec = {};
  // Virtual ranks (see above): the worker that runs rank r; empty = rank r is worker r.
  std::vector<int> rank_workers;

  // Ranks (= workers without rank_workers).
  int num_workers() const { return static_cast<int>(workers.size()); }
  // The workers the ranks run on: 1 + the largest rank_workers entry, or num_workers().
  int physical_workers() const;
  // The worker rank r runs on.
  int WorkerOfRank(int r) const { return rank_workers.empty() ? r : rank_workers[r]; }
  // The whole mask: mask_spec with causal = `causal`.
  MaskSpec Mask() const;
  // No documents and no window (what a MaskKind of kFull / kCausal describes exactly).
  bool dense() const;
  // kFull / kCausal for dense plans, kIntervals otherwise (the kernels' mask kind).
  MaskKind mask() const {
    if (!dense()) return MaskKind::kIntervals;
    return causal ? MaskKind::kCausal : MaskKind::kFull;
  }
};

// Visible (query, key) pairs of units under one mask, per batch row and averaged over the batch
// rows (a mask with one document list, or none, counts one row): the figure the cost model
// multiplies by 4·B·Hq·D FLOPs. Dense masks use the closed form of VisiblePairs(..., MaskKind);
// masked ones VisiblePairs(MaskSpec, ...) (closed forms per document). Build once per plan;
// thread-compatible.
class UnitPairs {
 public:
  explicit UnitPairs(const Plan& plan);
  UnitPairs(const MaskSpec& mask, int64_t seq_len);
  // Mean over the batch rows of the visible pairs of queries q x keys kv.
  double operator()(const RowRange& q, const RowRange& kv) const;
  // The same for batch row b (exact, an integer).
  int64_t Row(int b, const RowRange& q, const RowRange& kv) const;
  // The smallest range inside kv holding every key some query of q sees, in any batch row
  // (empty when none: {kv.begin, kv.begin}); the smallest range inside q holding every query
  // that sees some key of kv. The keys one query sees form one interval whose ends never
  // decrease along the queries (core/mask.h), so both are read off the first and last rows.
  RowRange KeysSeen(const RowRange& q, const RowRange& kv) const;
  RowRange QueriesSeeing(const RowRange& q, const RowRange& kv) const;
  // How many distinct batch rows the mask has (1 without per-row documents).
  int rows() const { return rows_; }
  bool dense() const { return dense_; }
  const MaskSpec& mask() const { return mask_; }
  int64_t seq_len() const { return seq_; }

 private:
  MaskSpec mask_;
  int64_t seq_ = 0;
  bool dense_ = true;
  MaskKind kind_ = MaskKind::kFull;
  int rows_ = 1;
};

}  // namespace dfa
