// The planner: makes a Plan (plan.h) for P workers and a sequence, by schedule name.
//
//   ring      contiguous shards; K/V travel around the ring (forwarded), P steps.
//   distflash the DistFlashAttn paper's Algorithm 2 (even P only): P/2+1 forward steps;
//             helpers compute later workers' queries against their own K/V and return partials.
//   zigzag    worker i owns chunks i and 2P-1-i of 2P; K/V pairs travel around the ring.
//   balanced  ours, a cost-model search (profile "cpu": H200-like figures, balance first, then
//             per-op cost: kBalanceTarget, kSearchOpOverheadSeconds below; profile "gpu": least
//             true time under GpuCostParams, ring/zigzag/distflash included) over:
//             the striped ring (mirrored front/back ranges sized by speed, so any speeds are
//             balanced exactly; equal-size K/V pieces travel the ring, several piece sizes
//             tried; each also with the K/V-stationary backward, in index order and with
//             slow and fast workers interleaved around the ring), the cut ring (cpu
//             profile, unequal speeds: steps cut by work, MakeCutRingPlan), zigzag, contiguous
//             speed-proportional shards with K/V sent straight from the owner, and
//             (P >= 16) 2-D tiled plans (MakeTiledPlan), for packed documents the
//             packed-document plan (MakeDocumentPlan); profile "cpu", when no candidate is
//             within kBalanceTarget, also the forward of one candidate with the backward of
//             another of the same layout (planner_internal::TakeBackwardFrom), and when still
//             none is and PlanRequest::session_shape is given, head groups of any worker counts
//             (SpeedBalancedHeadGroups, each group a sequence plan; WorkerPlan::kv_heads set);
//             profile "gpu" with session_shape given ranks those head groups by true time too.
//   heads     head groups (plan.h "Head groups", DeepSpeed-Ulysses style): g groups of P/g
//             workers (consecutive; with unequal speeds dealt by speed when that evens the
//             load), g = the largest divisor of P with g <= kv_heads, each group
//             holding a share of the kv heads (proportional to its summed speed, >= 1 each) and
//             running the "balanced" plan of its local shape over all rows; no traffic between
//             groups (P = g: none at all). P = 1 or kv_heads = 1: the balanced plan, unsplit.
//             Needs the real shape in PlanRequest::shape (its kv_heads decide the split).
//   auto      the least forward + backward makespan under the request's profile (cost_model.h;
//             cpu: with kSearchOpOverheadSeconds per op) of "balanced" and "heads" with every
//             group count g | P, 2 <= g <= kv_heads; the plan keeps the chosen one's name.
// Backward steps are derived from the forward ones unless the schedule made its own (the
// K/V-stationary ring backwards; MakePlan keeps those) (same routing: kQ -> kGradIn,
// kOutPartial -> kDqPartial, plus a kDkvPartial back to the K/V owner after the last use of
// each received K/V buffer). Pure functions; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "core/planner/plan.h"
#include "core/status.h"

namespace dfa {

// The balanced search's per-compute-op overhead (kernel launch and fixed per-unit costs of a
// GPU, where small units run 15-38% slower per FLOP) and its balance target: among the
// candidates whose worse-pass makespan/ideal ratio without overhead is within kBalanceTarget,
// it picks the cheapest with kSearchOpOverheadSeconds per op (docs/planner.md).
inline constexpr double kSearchOpOverheadSeconds = 10e-6;
inline constexpr double kBalanceTarget = 1.02;

struct PlanRequest {
  std::string schedule = "balanced";
  int workers = 1;
  int64_t seq_len = 0;
  bool causal = true;
  // Relative worker speeds (empty: all 1). Used by "balanced" to size the shards.
  std::vector<double> speeds;
  // The cost profile "balanced" ranks its candidates with (cost_model.h): "cpu" (default:
  // balance within kBalanceTarget first, then the cheapest at kSearchOpOverheadSeconds per op)
  // or "gpu" (GpuCostParams: the candidate with the least forward + backward makespan including
  // per-op overhead and merge traffic, i.e. the true expected time; ring, zigzag and distflash
  // are candidates too). Other schedules ignore it.
  std::string profile = "cpu";
  // The session's per-token shape, used by "balanced" to cost candidates, and by "heads" and
  // "auto" to split the kv heads. The default is the reference shape the search has always
  // used (32 heads of 128, bf16).
  AttentionShape shape{1, 32, 32, 128, DType::kBF16};
  // The session's real shape, for "balanced": under profile "cpu" (which costs its sequence
  // candidates at the reference `shape`), when none of them is within kBalanceTarget, and under
  // profile "gpu" always (ranked by true time), the search also tries head-group plans over
  // session_shape.kv_heads heads (SpeedBalancedHeadGroups, g = 2, 3, ..., each group a
  // "balanced" plan at its local session shape) and may return one (schedule "balanced",
  // WorkerPlan::kv_heads set): callers that set it must check, cost and run the plan at this
  // shape. batch 0 (the default) or kv_heads < 2: no head groups.
  AttentionShape session_shape{0, 0, 0, 0, DType::kBF16};
  // The rest of the mask (core/mask.h): packed documents per batch row and a sliding window.
  // Plans carry it as Plan::mask_spec; every schedule computes only units with visible pairs,
  // and "balanced" (head groups included) divides the visible pairs by speed. When it has
  // documents or a window its `causal` must equal `causal` (ValidatePlanRequest).
  MaskSpec mask_spec = {};
};

// INVALID_ARGUMENT naming the field for: workers < 1, seq_len < workers, speeds of the wrong
// count or not positive/finite, an unknown schedule, distflash with odd workers, an unknown
// profile, a shape with a non-positive size or q_heads not a multiple of kv_heads, a mask_spec
// that ValidateMask refuses (batch: session_shape's when given, else shape's; "mask_spec.
// doc_offsets[0][3]: ...") or whose causal differs from `causal`.
absl::Status ValidatePlanRequest(const PlanRequest& request);
// The request's whole mask: mask_spec with causal = request.causal.
MaskSpec RequestMask(const PlanRequest& request);

absl::StatusOr<Plan> MakePlan(const PlanRequest& request);

// The individual schedules (request already validated).
Plan MakeRingPlan(const PlanRequest& request);
Plan MakeDistFlashPlan(const PlanRequest& request);
Plan MakeZigzagPlan(const PlanRequest& request);
// "balanced": the best (see kBalanceTarget) of the striped ring at several piece counts (and
// with its backward's transfers spread), zigzag, MakeSpeedProportionalPlan, (P >= 16) tiled
// plans and (P >= 32, unequal speeds, profile cpu) speed-grouped tiled plans. Returns a plan with its backward steps when it tuned them (else MakePlan derives them).
Plan MakeBalancedPlan(const PlanRequest& request);
Plan MakeSpeedProportionalPlan(const PlanRequest& request);
// Variants of it (the balanced search tries several for masked requests). Masked requests:
// shards hold equal visible pairs per speed, and each worker receives only the keys its queries
// see (the documents crossing its boundaries, the window's reach).
struct ContiguousOptions {
  // Each worker's work list spread over this many steps (0: P for dense masks, else the
  // longest list: own shard plus the shards its queries see).
  int steps = 0;
  // Every K/V transfer from its owner posted before the pass (Transfer::lead), not one step
  // before its use.
  bool early = false;
  // The last step's share of the own block computed last (steps >= 3), so the derived
  // backward's dK/dV partials of the foreign keys travel during it.
  bool own_tail = false;
  // Causal: keys forwarded by the previous worker when it holds them a step before they are
  // needed (a chain down a long document) instead of sent by their owner to every later worker.
  bool relay = false;
  // The other shards farthest first (default: nearest first), so that the keys seen by many
  // later workers (a long document's first shard) are used, and their derived backward's dK/dV
  // partials returned, early in the pass.
  bool far_first = false;
  // Each other shard's keys in this many pieces of equal rows, used one after the other (each
  // its own transfer), so the derived backward returns the dK/dV partial of all but the last
  // piece early.
  int kv_pieces = 1;
};
Plan MakeSpeedProportionalPlan(const PlanRequest& request, const ContiguousOptions& options);
// The packed-document plan (document_schedule.cc; a "balanced" candidate for masked requests
// with one document list and no window): every long document (visible work above
// long_fraction x the mean worker share, largest first) on its own consecutive workers, as few
// as hold its work at their speed shares, with the striped ring inside the document (`pieces`
// K/V pieces per slowest worker, travelling pieces posted `lead` steps early); the short
// documents in the rest of every worker's share (short_groups below). A ring worker's short work
// is spread evenly over its ring's steps (tail_fraction of its own in a step after the ring);
// outside the rings the same over the longest ring's steps. Returns a plan
// with no workers when it does not apply (DocumentPlanApplies false, a document too short for
// its ring's pieces); with its backward when kv_stationary_backward (else none: derive it).
struct DocumentOptions {
  double long_fraction = 1.0;
  int pieces = 1;
  int lead = 0;
  double tail_fraction = 0.5;
  // The rings' K/V-stationary backward (MakeStripedRingPlan); the plan then has its backward.
  bool kv_stationary_backward = false;
  // How the short documents are placed. false (packed): whole into the ring workers' free
  // shares, largest that fits first, the rest cut over the workers outside the rings (which
  // absorb what the rings leave). true (grouped): whole to groups (each ring's workers, the
  // workers outside the rings), largest first to the group with the most free capacity, then
  // cut inside each group over its workers' free shares; keys of a document cut between two
  // ring workers travel in pieces on the ring's steps.
  bool short_groups = false;
  // Packed only: the short documents that do not fit whole into a ring worker's free share are
  // cut over the ring workers' free shares too (first, in worker order), then over the workers
  // outside the rings (without it: only over the workers outside, or the ring workers' when
  // there are none). For a long and a middle document whose rings, rounded up to whole
  // workers, would need more than P: the middle one is then spread over every free share.
  bool fill_rings = false;
  // Instead of the above: every worker's free share a bin (ring workers and the workers
  // outside alike), the short documents largest first, each whole into the fullest bin that
  // holds it, else cut over the bins of one group (a ring's workers, or the workers outside),
  // the group with the most free share first: few documents cut, each over few workers, and
  // the keys of a cut one on one ring's step times.
  bool cut_bins = false;
};
bool DocumentPlanApplies(const PlanRequest& request);
Plan MakeDocumentPlan(const PlanRequest& request, const DocumentOptions& options);
// "heads" (heads_schedule.cc) with HeadGroupCount(request) groups, or with `groups` groups
// (groups must divide workers and be <= kv_heads; otherwise, and for groups <= 1, the balanced
// plan with every worker holding all heads). Head ranges are set only when groups > 1. Returns a
// plan with its backward steps, or one with no workers if a group's sub-plan failed (never for a
// validated request).
Plan MakeHeadsPlan(const PlanRequest& request);
Plan MakeHeadsPlan(const PlanRequest& request, int groups);
// Explicit head groups: members[i] are the global ranks of group i (member k runs worker k of
// the group's sub-plan, so the order is the sub-plan's worker order) and kv_heads[i] >= 1 its
// kv head count (groups hold consecutive head ranges in group order; the counts sum to
// request.shape.kv_heads). Groups may have different worker counts.
struct HeadGroupSplit {
  std::vector<std::vector<int>> members;
  std::vector<int> kv_heads;
};
// g head groups of any worker counts whose summed speeds follow their head counts: heads as even
// as g allows, workers dealt largest first to the group with the most capacity left (speed
// target minus summed speed), then single moves and pairwise swaps while they lower the largest
// kv_heads / summed speed, and the heads re-dealt by the groups' speeds. Members ascending.
// Empty (no groups) unless 2 <= g <= min(workers, shape.kv_heads).
HeadGroupSplit SpeedBalancedHeadGroups(const PlanRequest& request, int groups);
// The largest heads / summed speed of `groups` over kv_heads / total speed (1: the groups'
// compute is exactly proportional to their speed; the 1-D plans inside add their own loss).
double HeadGroupsLoad(const PlanRequest& request, const HeadGroupSplit& groups);
// "heads" with explicit groups (validated here: every worker in exactly one group, counts >= 1
// summing to shape.kv_heads; otherwise a plan with no workers). Each group runs the "balanced"
// plan of its local shape (request.shape cut to its heads, profile and speeds of its members);
// groups with the same head count and member speeds share one search. Schedule "heads".
Plan MakeHeadsPlan(const PlanRequest& request, const HeadGroupSplit& groups);
// Shared heads (shared_heads_schedule.cc; plan.h "Virtual ranks"): whole-head groups
// (`groups`: members are workers, group i the kv heads after those of the groups before it)
// plus the remaining heads in `shared` groups (the heads after the whole groups'), each worker
// in at most one group of each kind, so it runs one or two ranks. A group of one worker holds its
// heads over all rows; a larger whole group runs the "balanced" plan of its local shape, a shared
// group the striped ring with one piece per worker whose K/V go straight from their owners, each
// posted one step early (no piece waits on another's arrival: at small S the per-message
// latency is not on a chain of hops).
struct SharedHeadsSplit {
  HeadGroupSplit groups;
  HeadGroupSplit shared;
  // Per shared group and member, its heads of work (empty: the group's heads by its members'
  // speeds). With it the shared groups may straddle: a worker in two of them (three ranks).
  std::vector<std::vector<double>> shared_work;
};
// The splits "balanced" tries (dense requests at equal speeds only; none otherwise): for
// m = 1..min(P, 8), whole groups of m consecutive workers with floor(m K / P) heads (and one
// fewer), the workers left over a group of their own rounded-down share; the rest of the K kv
// heads shared by the workers with work left, in 1..6 groups of >= 2 consecutive workers with
// heads by their work left, where no worker's work exceeds its share (K / P heads) by more than
// 1%; and, for 2..6 shared groups, the straddled form (shared_work): the open workers' work
// left laid end to end, shared group j taking the next part of it in proportion to its heads
// (as even as possible), a worker on a boundary in both groups with its part of each. No split
// without shared heads.
std::vector<SharedHeadsSplit> SharedHeadsSplits(const PlanRequest& request);
// A quick estimate, for ranking splits before planning them: the largest over workers of the
// seconds its K/V receives take at `bandwidth_bytes_per_second` (each group: all rows but its
// own share, at the group's heads) over its share of the dense compute at `flops_per_second`.
double SharedHeadsWireRatio(const PlanRequest& request, const SharedHeadsSplit& split,
                            double flops_per_second, double bandwidth_bytes_per_second);
// The plan of `split` (schedule "balanced", Plan::rank_workers set; per worker its whole rank,
// then its shared rank). A worker's work is its groups' heads by their members' speeds; each
// sub-plan is made at its ranks' shares of their workers' speeds (so that it weighs its messages
// against the compute they travel behind: cost_model.h "Virtual ranks"). A shorter part's steps
// are spread over the longest part's (its computes cut over the steps between), and a one-worker
// group's rank computes its heads in pieces of equal work per step (twice that in the forward's
// first step and the backward's last, where the first K/V and the last partials travel). A plan
// with no workers for an invalid split (a worker in two groups of a kind or in none, head
// counts not summing to kv_heads, no shared group).
Plan MakeSharedHeadsPlan(const PlanRequest& request, const SharedHeadsSplit& split);
// Straddled head groups (straddled_heads_schedule.cc; plan.h "Virtual ranks"): `groups` groups
// of consecutive workers, kv heads as even as possible (the first K % groups one more), group i
// taking exactly its heads' share of the summed speed in worker order, so a worker on a boundary
// runs a rank in both groups at the share of its speed each takes (a share under 5% of the
// worker goes to the other group). Each group runs the "balanced" plan of its local shape at its
// ranks' speeds. A plan with no workers unless 2 <= groups <= min(workers, kv_heads) and some
// worker straddles two groups (else MakeHeadsPlan makes it).
Plan MakeStraddledHeadsPlan(const PlanRequest& request, int groups);
// The largest divisor g of request.workers with g <= request.shape.kv_heads (1: no split).
int HeadGroupCount(const PlanRequest& request);
// "auto": the cheaper of "balanced" and the head splits (see above); a head split on a tie.
Plan MakeAutoPlan(const PlanRequest& request);
// The striped ring (striped_ring_schedule.cc): worker w owns a front row range and its mirror
// back range sized by its speed, cut into pieces[w] (>= 1) K/V pieces that travel the ring.
// Needs seq_len >= 2 * (sum of pieces) for every piece to have rows in both halves.
Plan MakeStripedRingPlan(const PlanRequest& request, const std::vector<int>& pieces);
// The same with, when kv_stationary_backward, its own backward (filled in; MakePlan keeps it):
// the ring over query pieces instead, K/V stay home. Worker i at step t receives (from i-1, who
// forwards it) the Q, dO, LSE, D (kGradIn) of the piece the forward's step t used as K/V,
// computes it against its own K/V (dK/dV accumulate locally, no dK/dV partials), and returns
// the piece's dQ partial to its owner in step t+1. Per piece pair ~64 KiB on the wire instead
// of ~96 KiB (K/V + fp32 dK/dV), and no owner receives more than ~1 dQ partial per step.
// `lead` > 0: each travelling piece (K/V forward; Q/dO/LSE/D of the K/V-stationary backward) is
// posted up to `lead` steps early (Transfer::lead): as early as its sender has it (worker i's
// predecessor meets a piece pieces[i] steps before i), so with >= 2 pieces per worker a piece
// gets two steps of compute to travel in instead of one.
Plan MakeStripedRingPlan(const PlanRequest& request, const std::vector<int>& pieces,
                         bool kv_stationary_backward, int lead = 0);

// The cut ring (cut_ring_schedule.cc): the striped ring's layout with ownership exactly
// proportional to speed for any speeds, pieces of about F / (T * pieces_per_step) pairs
// (F = seq_len / 2), and each worker's work list cut into T = ceil(steps_factor * F / x_min)
// steps of equal work (x_min: the smallest worker's pairs), so all workers' steps take the same
// time. Pieces travel the ring (forwarded by the previous worker) up to the last worker that
// needs them. kv_stationary_backward: the backward is the same ring over query pieces (kGradIn
// forwarded, dQ partials home, dK/dV stay); otherwise MakePlan derives it.
struct CutRingOptions {
  double steps_factor = 2;     // >= 1: each worker meets a piece >= 1 step after its predecessor
  double pieces_per_step = 1;  // piece size relative to one step's share of the key axis
  bool kv_stationary_backward = true;
};
bool CutRingApplies(const PlanRequest& request, const CutRingOptions& options);
// A plan with no workers when the options leave a worker without a piece in time (never for
// steps_factor >= 2; the search skips such candidates).
Plan MakeCutRingPlan(const PlanRequest& request, const CutRingOptions& options);

// The 2-D tiled plan (tiled_schedule.cc): workers in `groups` groups of consecutive workers;
// each computes its group's queries against a speed-proportional share of the keys, so it
// receives O(S/sqrt(P)) rows instead of O(S); partial outputs (dQ, dK/dV) return to the owners.
struct TiledOptions {
  int groups = 1;                 // G, 1..workers
  double head_fraction = 0.2;     // share of the own queries computed while K/V stream in
  int head_rows = 1;              // peers' query pieces computed while K/V stream in
  int64_t max_piece_pairs = 1 << 30;  // largest K/V piece (mirrored pairs = 2 rows each)
  int steps = 24;       // steps after the local step 0 and before the tail (even work)
  int head_ramp = 4;     // the first head_ramp of them are smaller: 1/2^k of an even step
  int tail_steps = 16;   // fine steps of the last phase (own queries x one K piece each)
  bool peers_first = false;  // head peers' queries (x own K/V) before the K pieces stream in
  int balance_window = 0;    // > 0: BalanceTransfers over this many steps (forward; plan_builder.h)
  // > 0: column-major mode. All own queries stream against the first K pieces (each piece's
  // dK/dV partial leaves right after its step, spread over the pass instead of piling into the
  // tail); only the last `late_pieces` pieces are kept for the end: every peer's queries
  // against them (one peer per step: its partial output / dQ leaves during the next), then the
  // own queries against one of them per step. head_fraction is ignored (all own rows lead).
  int late_pieces = 0;
  // > 0: groups by speed instead of `groups`: workers sorted by speed (fastest first), a group
  // starting at speed s has ~speed_groups * sqrt(sum of speeds / (1.5 s)) members (fast workers
  // in small groups: fewer partials into their in-links), then relabelled to the request's order.
  double speed_groups = 0;
};
// Whether MakeTiledPlan supports the request (seq_len >= 8 * workers, sane options).
bool TiledPlanApplies(const PlanRequest& request, const TiledOptions& options);
Plan MakeTiledPlan(const PlanRequest& request, const TiledOptions& options);

// Fills every worker's backward steps from its forward steps (see above).
void DeriveBackwardSteps(Plan& plan);
// Whether any worker has backward steps (MakePlan derives them only for plans without: a
// schedule may tune its backward's transfers after deriving it).
bool HasBackwardSteps(const Plan& plan);

// Token boundary of chunk `i` of `n` equal chunks of [0, seq_len): floor(i * seq_len / n).
int64_t ChunkBoundary(int64_t seq_len, int64_t n, int64_t i);
// Index of the worker that owns global row `row` (-1 when none).
int OwnerOf(const Plan& plan, int64_t row);

}  // namespace dfa
