// Our balanced schedule. Three ideas (docs/planner.md has the numbers):
//  1. Shards are contiguous and sized so that the visible work of worker w's queries is
//     proportional to its speed: sum over its rows of visible keys = total * s_w / sum(s).
//     Every worker then computes exactly its share, with its own queries only (no partial
//     outputs to return, no merges across workers in the forward pass).
//  2. K/V go straight from their owner to each worker that needs them (never forwarded), so a
//     slow or busy worker never delays a chain of others; each K/V chunk reaches a worker once.
//  3. Each worker spreads its work list (own block first, then the other chunks newest first)
//     evenly over T = P steps, cutting blocks into query sub-blocks; step 0 uses own data only.
//     All workers thus finish step t at the same time t * makespan / T (in the cost model), and
//     step t+1's K/V transfers overlap step t's compute.
// Its weak spot is communication at large P: the owner of the first (largest) shard sends it to
// every other worker over one link. So "balanced" is a cost-model search over this plan, zigzag
// and the striped ring (striped_ring_schedule.cc) at several piece sizes (its backward also with
// its transfers spread by BalanceTransfers, or K/V-stationary, in index order or with slow and
// fast workers interleaved around the ring), the cut ring (cut_ring_schedule.cc, unequal
// speeds) and the 2-D tiled plans (groups of consecutive workers, or grouped by speed), ranked
// by the cost model for
// an H200-like worker at the given speeds. Profile "cpu" (32 heads of 128, bf16, 400 TFLOP/s,
// 300 GB/s, 20 us): the cheapest with kSearchOpOverheadSeconds per op among those whose balance
// (worse pass, no overhead) is within kBalanceTarget, else the best balanced. Profile "gpu":
// the least true time under GpuCostParams (see Better below). Masked requests (documents,
// windows) add the contiguous plan's variants (ContiguousOptions, planner.h): shards of equal
// visible pairs per speed, each receiving only the keys its queries see, and, for packed
// documents, the packed-document plan (document_schedule.cc: long documents striped over their
// own workers, short ones filling the rest; docs/planner.md, "Masked plans").
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <tuple>

#include "core/planner/cost_model.h"
#include "core/planner/plan_builder.h"
#include "core/planner/planner.h"

namespace dfa {

using planner_internal::AddForwardCompute;
using planner_internal::AddForwardTransfer;

namespace {

// Shard boundaries b[0..P] with work(b[w], b[w+1]) proportional to speeds[w]: the visible
// pairs of query rows [0, R) against the whole sequence, under the request's mask.
std::vector<int64_t> ShardBoundaries(const PlanRequest& r, const std::vector<double>& speeds,
                                     const UnitPairs& unit_pairs) {
  const int P = r.workers;
  const int64_t S = r.seq_len;
  auto PrefixWork = [&](int64_t rows, int64_t seq_len, bool) {
    return unit_pairs(RowRange{0, rows}, RowRange{0, seq_len});
  };
  double total_speed = 0;
  for (double s : speeds) total_speed += s;
  const double total = PrefixWork(S, S, r.causal);
  std::vector<int64_t> b(P + 1, 0);
  b[P] = S;
  double cum = 0;
  for (int w = 1; w < P; ++w) {
    cum += speeds[w - 1];
    const double target = total * cum / total_speed;
    int64_t lo = 0, hi = S;  // smallest R with PrefixWork(R) >= target
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (PrefixWork(mid, S, r.causal) >= target) hi = mid; else lo = mid + 1;
    }
    if (lo > 0 && target - PrefixWork(lo - 1, S, r.causal) < PrefixWork(lo, S, r.causal) - target) {
      --lo;
    }
    b[w] = std::clamp<int64_t>(lo, b[w - 1] + 1, S - (P - w));
  }
  return b;
}

// Largest r in [q0, q1] such that the pairs of rows [q0, r) x kv are nearest to `need`.
int64_t CutRow(int64_t q0, int64_t q1, const RowRange& kv, const UnitPairs& unit_pairs,
               double need) {
  auto pairs = [&](int64_t r) { return unit_pairs(RowRange{q0, r}, kv); };
  int64_t lo = q0, hi = q1;  // smallest r with pairs(r) >= need
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (pairs(mid) >= need) hi = mid; else lo = mid + 1;
  }
  if (lo > q0 && need - pairs(lo - 1) < pairs(lo) - need) --lo;
  return lo;
}

}  // namespace

Plan MakeSpeedProportionalPlan(const PlanRequest& r) {
  return MakeSpeedProportionalPlan(r, ContiguousOptions{});
}

// The speed-proportional direct-send plan described at the top of this file.
Plan MakeSpeedProportionalPlan(const PlanRequest& r, const ContiguousOptions& options) {
  const int steps = options.steps;
  const bool early = options.early, own_tail = options.own_tail;
  const int P = r.workers;
  Plan plan;
  plan.schedule = "balanced";
  plan.seq_len = r.seq_len;
  plan.causal = r.causal;
  plan.mask_spec = r.mask_spec;
  plan.workers.resize(P);
  std::vector<double> speeds = r.speeds;
  if (speeds.empty()) speeds.assign(P, 1.0);
  const UnitPairs work_of(plan);
  const std::vector<int64_t> b = ShardBoundaries(r, speeds, work_of);
  auto shard = [&](int w) { return RowRange{b[w], b[w + 1]}; };
  // The work list of each worker: own block, then the other shards newest first (causal:
  // earlier ones only), those its queries see.
  std::vector<std::vector<int>> kv_owners(P);
  size_t most_sources = 1;
  for (int w = 0; w < P; ++w) {
    std::vector<int>& kv_owner = kv_owners[w];
    kv_owner = {w};
    for (int k = 1; k < P; ++k) {
      const int j = ((w - k) % P + P) % P;
      if ((!r.causal || j < w) && work_of(shard(w), shard(j)) > 0) kv_owner.push_back(j);
    }
    if (options.far_first) std::reverse(kv_owner.begin() + 1, kv_owner.end());
    most_sources = std::max(most_sources, kv_owner.size());
  }
  // Steps: P (dense; each worker's list spread over them), else `steps`, or by default as many
  // as the longest list.
  const int T = steps > 0 ? steps : plan.dense() ? P : static_cast<int>(most_sources);
  // What each worker receives: key rows of shard `source`, first used in step `first`.
  struct Received {
    int source;
    RowRange rows;
    int first;
  };
  std::vector<std::vector<Received>> received(P);

  for (int w = 0; w < P; ++w) {
    plan.workers[w].owned = {shard(w)};
    // The work list: (queries, keys, source shard) items. Masks: only the keys of a source that
    // the shard's queries see (a document crossing the boundary, a window's reach), and only
    // the queries that see them.
    struct Item {
      RowRange q, kv;
      int source;
    };
    std::vector<Item> items;
    for (int j : kv_owners[w]) {
      const RowRange seen = plan.dense() ? shard(j) : work_of.KeysSeen(shard(w), shard(j));
      // kv_pieces: foreign keys in pieces, each used for all its queries before the next.
      const int64_t n = j == w ? 1 : std::clamp<int64_t>(options.kv_pieces, 1, seen.size());
      for (int64_t k = 0; k < n; ++k) {
        const RowRange kv{seen.begin + seen.size() * k / n, seen.begin + seen.size() * (k + 1) / n};
        const RowRange qs = plan.dense() ? shard(w) : work_of.QueriesSeeing(shard(w), kv);
        if (qs.size() > 0 && kv.size() > 0) items.push_back({qs, kv, j});
      }
    }
    double total = 0;
    for (const Item& it : items) total += work_of(it.q, it.kv);
    const double own = items.empty() ? 0 : work_of(items[0].q, items[0].kv);
    // own_tail: the last step's share of the own block moves to the end of the list, so the
    // derived backward's dK/dV partials of the last foreign keys travel while it computes.
    if (own_tail && T >= 3 && items.size() > 1 && own > 0) {
      // A little over one step, so that no sliver of the last foreign keys spills into it.
      const double tail = std::min(own / 2, 1.1 * total / T);
      const Item first = items[0];
      const int64_t cut = CutRow(first.q.begin, first.q.end, first.kv, work_of, own - tail);
      if (cut > first.q.begin && cut < first.q.end) {
        items[0].q.end = cut;
        items.push_back({{cut, first.q.end}, first.kv, w});
      }
    }
    const double head = items.empty() ? 0 : work_of(items[0].q, items[0].kv);
    // End-of-step cumulative targets: (t+1)/T of the work, so every worker ends step t at
    // (t+1) * makespan / T; step 0 holds own work only (a worker with less own work than a
    // step's share catches up in step 1, whose K/V was posted at time 0).
    std::vector<double> target(T, total);
    for (int t = 0; t + 1 < T; ++t) target[t] = total * (t + 1) / T;
    if (T > 1) target[0] = std::min(head, total / T);
    double done = 0;
    int t = 0;
    for (const Item& it : items) {
      const int j = it.source;
      int first_step = -1;
      if (j != w && t == 0 && T > 1) t = 1;
      int64_t q = it.q.begin;
      while (q < it.q.end) {
        int64_t cut = it.q.end;
        if (t < T - 1) cut = CutRow(q, it.q.end, it.kv, work_of, target[t] - done);
        if (cut > q) {
          const RowRange part{q, cut};
          const double work = work_of(part, it.kv);
          if (work > 0) {  // masks: a part may see none of kv
            AddForwardCompute(plan, t, w, part, it.kv);
            if (first_step < 0) first_step = t;
          }
          done += work;
          q = cut;
        }
        if (q < it.q.end) ++t;  // this step is full
      }
      if (j != w && first_step >= 0) received[w].push_back({j, it.kv, first_step});
    }
  }
  // The K/V transfers: from the owner, or (relay, causal) from the previous worker when it
  // holds those keys (owned, or received for a step before) by then, so that the shard of a
  // long document's first worker travels down the chain once per link instead of every later
  // worker's copy leaving its owner's one link.
  for (int w = 0; w < P; ++w) {
    for (const Received& in : received[w]) {
      const int j = in.source, f = in.first;
      const RowRange& rows = in.rows;
      int from = j;
      if (options.relay && r.causal && w - 1 > j) {
        for (const Received& prev : received[w - 1]) {
          if (prev.source == j && prev.first <= f - 1 && prev.rows.Contains(rows)) from = w - 1;
        }
      }
      AddForwardTransfer(plan, f, from, w, PlanTensor::kKV, rows);
      if (early && f > 1 && from == j) {  // posted before the pass (Transfer::lead)
        plan.workers[from].forward[f].sends.back().lead = f - 1;
        plan.workers[w].forward[f].recvs.back().lead = f - 1;
      }
    }
  }
  return plan;
}

namespace {

// How the search ranks candidates.
// Profile "cpu" (balance first): each is costed twice with the CPU profile's H200-like figures
// (400 TFLOP/s, 300 GB/s, 20 us per message): without per-op overhead (its balance: the worse
// of the forward and backward makespan/ideal ratios, each pass must be balanced on its own) and
// with kSearchOpOverheadSeconds per compute op (what a GPU pays per kernel launch). Among the
// candidates whose balance is within kBalanceTarget, the one with the smallest cost with
// overhead wins (fewer, larger ops when they cost no balance); when none is, the best balanced
// one. Each cost adds 0.25 x total time / total ideal to break near-ties.
// Profile "gpu" (true time): each is costed once with GpuCostParams (per-op overhead and merge
// traffic included) and the least forward + backward makespan wins: on a GPU a few large ops
// beat a finer balance (docs/planner.md, "What the GPU profile picks").
struct Score {
  double balance = std::numeric_limits<double>::infinity();  // worse pass ratio, no overhead
  double balance_cost = std::numeric_limits<double>::infinity();
  double overhead_cost = std::numeric_limits<double>::infinity();
  double true_seconds = std::numeric_limits<double>::infinity();  // "gpu": fwd + bwd makespan
};

// One pass's costs as the search ranks them (see Score), kept so that the forward of one
// candidate can be combined with the backward of another that has the same layout.
struct PassScore {
  double ratio = std::numeric_limits<double>::infinity();           // no overhead
  double seconds = std::numeric_limits<double>::infinity();         // no overhead
  double overhead_ratio = std::numeric_limits<double>::infinity();  // kSearchOpOverheadSeconds
  double overhead_seconds = std::numeric_limits<double>::infinity();
  double ideal = 0;
};

// Score of the plan made of forward `f` and backward `b` (profile "cpu"; the same as
// Objective on the combined plan's cost: the passes are costed independently).
Score Combine(const PassScore& f, const PassScore& b) {
  Score score;
  const double ideal = f.ideal + b.ideal;
  score.balance = std::max(f.ratio, b.ratio);
  score.balance_cost = score.balance + (ideal > 0 ? 0.25 * (f.seconds + b.seconds) / ideal : 0);
  score.overhead_cost = std::max(f.overhead_ratio, b.overhead_ratio) +
                        (ideal > 0 ? 0.25 * (f.overhead_seconds + b.overhead_seconds) / ideal : 0);
  return score;
}

// Scores `plan` equalized and with its backward derived (as MakePlan completes it); the per-pass
// scores (profile "cpu") go to *fwd / *bwd when given.
Score Evaluate(Plan plan, CostParams params, bool true_time, PassScore* fwd = nullptr,
               PassScore* bwd = nullptr) {
  planner_internal::EqualizeSteps(plan);
  if (!HasBackwardSteps(plan)) DeriveBackwardSteps(plan);
  Score score;
  if (true_time) {
    absl::StatusOr<PlanCost> c = EstimateCost(plan, params);
    if (c.ok()) score.true_seconds = c->forward.makespan_seconds + c->backward.makespan_seconds;
    return score;
  }
  PassScore f, b;
  params.op_overhead_seconds = 0;
  absl::StatusOr<PlanCost> c = EstimateCost(plan, params);
  if (!c.ok()) return score;
  f.ratio = c->forward.makespan_ratio;
  f.seconds = c->forward.makespan_seconds;
  f.ideal = c->forward.ideal_seconds;
  b.ratio = c->backward.makespan_ratio;
  b.seconds = c->backward.makespan_seconds;
  b.ideal = c->backward.ideal_seconds;
  params.op_overhead_seconds = kSearchOpOverheadSeconds;
  c = EstimateCost(plan, params);
  if (c.ok()) {
    f.overhead_ratio = c->forward.makespan_ratio;
    f.overhead_seconds = c->forward.makespan_seconds;
    b.overhead_ratio = c->backward.makespan_ratio;
    b.overhead_seconds = c->backward.makespan_seconds;
  }
  if (fwd != nullptr) *fwd = f;
  if (bwd != nullptr) *bwd = b;
  return Combine(f, b);
}

// Whether `a` is a better pick than `b` (see above).
bool Better(const Score& a, const Score& b, bool true_time) {
  if (true_time) return a.true_seconds < b.true_seconds * (1 - 1e-9);
  const bool fa = a.balance <= kBalanceTarget, fb = b.balance <= kBalanceTarget;
  if (fa != fb) return fa;
  if (fa) return a.overhead_cost < b.overhead_cost * (1 - 1e-9);
  return a.balance_cost < b.balance_cost * (1 - 1e-9);
}

// Head groups (PlanRequest::session_shape): profile "cpu" when no sequence plan (mixed passes
// included) is within kBalanceTarget, profile "gpu" always (each grouping ranked by its true
// time against the best sequence plan). A group of P' workers holding n of the K kv heads has the
// wire / compute ratio of a sequence plan of P' workers at the group's summed speed (bytes and
// FLOPs both scale with the heads), so groups whose speed sums follow their head counts
// (SpeedBalancedHeadGroups) take each worker's K/V volume down by the group count. Tries
// g = 2, 3, ... up to kv_heads, each costed at the session shape (and so is the sequence plan it
// must beat when that shape is not the reference one). Profile "cpu" skips groupings whose
// compute alone is off by more than the best balance and stops at the first within the target
// (fewest groups: the least search time; more groups would only add per-op savings); profile
// "gpu" costs every g (at most kv_heads plans) and keeps the fastest.
Plan WithHeadGroups(const PlanRequest& r, Plan best, Score best_score, bool true_time) {
  const AttentionShape& shape = r.session_shape;
  if (shape.batch < 1 || shape.kv_heads < 2 || r.workers < 2) return best;
  PlanRequest heads = r;
  heads.shape = shape;
  heads.session_shape = PlanRequest{}.session_shape;
  std::vector<double> speeds = r.speeds;
  if (speeds.empty()) speeds.assign(r.workers, 1.0);
  const CostParams params =
      true_time ? GpuCostParams(shape, speeds) : CpuCostParams(shape, speeds);
  // Compare at one shape: when the session's differs from the reference the sequence plan was
  // ranked at, rank the sequence plan at the session's too (what the plan will be run at).
  const AttentionShape& ref = r.shape;
  if (shape.batch != ref.batch || shape.q_heads != ref.q_heads || shape.kv_heads != ref.kv_heads ||
      shape.head_dim != ref.head_dim || shape.dtype != ref.dtype) {
    best_score = Evaluate(best, params, true_time);
  }
  std::vector<Plan> grouped;  // the head-group plans made (for the own tails below)
  for (int g = 2; g <= std::min(r.workers, shape.kv_heads); ++g) {
    const HeadGroupSplit groups = SpeedBalancedHeadGroups(heads, g);
    // (A split whose compute alone is off by more than the best plan so far cannot win.)
    if (groups.members.empty()) continue;
    if (!true_time && HeadGroupsLoad(heads, groups) >= best_score.balance) continue;
    Plan plan = MakeHeadsPlan(heads, groups);
    if (plan.workers.empty()) continue;
    plan.schedule = "balanced";
    const Score score = Evaluate(plan, params, true_time);
    grouped.push_back(plan);
    if (Better(score, best_score, true_time)) {
      best = std::move(plan);
      best_score = score;
    }
    if (!true_time && score.balance <= kBalanceTarget) break;
  }
  // Shared heads (shared_heads_schedule.cc): groups of whole heads plus the rest of the heads
  // split by sequence over every worker, a worker running one rank of each (plan.h "Virtual
  // ranks"). Profile "cpu": when still nothing is within kBalanceTarget; "gpu": always. The
  // splits whose whole groups are single workers first (their ranks wait on nothing, so in the
  // lock-step worker they hide the shared plan's messages best), then by the least estimated
  // wire time per worker; kSharedHeadsTried of them at most of each form (shared groups of
  // equal shares, straddled shared groups), kept where the model says they are better.
  if (true_time || best_score.balance > kBalanceTarget) {
    constexpr size_t kSharedHeadsTried = 3;
    constexpr double kWholePairsLast = 1e3;  // (estimates are O(1))
    std::vector<std::pair<double, SharedHeadsSplit>> splits;
    for (SharedHeadsSplit& split : SharedHeadsSplits(heads)) {
      double rank = SharedHeadsWireRatio(heads, split, params.flops_per_second,
                                         params.bandwidth_bytes_per_second);
      for (const std::vector<int>& m : split.groups.members) {
        if (m.size() > 1) rank += kWholePairsLast;
      }
      splits.emplace_back(rank, std::move(split));
    }
    std::stable_sort(splits.begin(), splits.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    size_t tried[2] = {0, 0};  // of each form: equal shares, straddled (shared_work)
    for (size_t i = 0; i < splits.size(); ++i) {
      if (tried[splits[i].second.shared_work.empty() ? 0 : 1]++ >= kSharedHeadsTried) continue;
      Plan plan = MakeSharedHeadsPlan(heads, splits[i].second);
      if (plan.workers.empty()) continue;
      const Score score = Evaluate(plan, params, true_time);
      if (Better(score, best_score, true_time)) {
        best = std::move(plan);
        best_score = score;
      }
      if (!true_time && best_score.balance <= kBalanceTarget) break;
    }
  }
  // Straddled head groups (straddled_heads_schedule.cc): two head groups whose speeds follow
  // their heads exactly, a worker on the boundary running a rank in each (equal speeds, odd P:
  // the two groups' plans mirror each other, so its two ranks keep one pace). The same rule:
  // profile "cpu" when still nothing is within kBalanceTarget, "gpu" always. (With more groups
  // a straddler's two shares differ, its ranks' steps do not line up in the lock-step worker,
  // and the model puts them at 1.05-1.8 for the masked target at P = 63.)
  if (true_time || best_score.balance > kBalanceTarget) {
    Plan plan = MakeStraddledHeadsPlan(heads, 2);
    if (!plan.workers.empty()) {
      const Score score = Evaluate(plan, params, true_time);
      if (Better(score, best_score, true_time)) {
        best = std::move(plan);
        best_score = score;
      }
    }
  }
  // The head-group plans again with 0.25 and 0.5 of each worker's own-rows backward moved to
  // the step whose partials end the pass (OwnTailBackward: the groups' last dK/dV or dQ partials
  // travel behind compute); the same rule (last, so that they do not stop the search before
  // the shared and straddled candidates).
  for (const Plan& plan : grouped) {
    if (!true_time && best_score.balance <= kBalanceTarget) break;
    for (double fraction : {0.25, 0.5}) {
      Plan tail = plan;
      planner_internal::OwnTailBackward(tail, fraction);
      const Score score = Evaluate(tail, params, true_time);
      if (Better(score, best_score, true_time)) {
        best = std::move(tail);
        best_score = score;
      }
    }
  }
  return best;
}

}  // namespace

Plan MakeBalancedPlan(const PlanRequest& r) {
  const int P = r.workers;
  std::vector<double> speeds = r.speeds;
  if (speeds.empty()) speeds.assign(P, 1.0);
  const bool true_time = r.profile == "gpu";
  const CostParams params =
      true_time ? GpuCostParams(r.shape, speeds) : CpuCostParams(r.shape, speeds);
  // Profile "cpu": every candidate's layout, per-pass scores and a way to remake it, so that the
  // forward of one can be combined with the backward of another of the same layout (MixPasses).
  struct Recorded {
    std::function<Plan()> remake;
    std::vector<std::vector<RowRange>> owned;
    PassScore fwd, bwd;
  };
  std::vector<Recorded> recorded;
  Plan best;
  Score best_score;
  auto consider = [&](Plan candidate, std::function<Plan()> remake) {
    PassScore f, b;
    const Score score = Evaluate(candidate, params, true_time, &f, &b);
    if (!true_time) {
      Recorded rec{std::move(remake), {}, f, b};
      for (const WorkerPlan& w : candidate.workers) rec.owned.push_back(w.owned);
      recorded.push_back(std::move(rec));
    }
    if (best.workers.empty() || Better(score, best_score, true_time)) {
      best = std::move(candidate);
      best_score = score;
    }
  };
  // Packed documents (document_schedule.cc): long documents on their own workers, striped
  // inside, the short ones filling the rest of every worker's share. Tried first; once one is
  // within kNearIdeal of ideal (both passes) the other document variants and the contiguous
  // variants below are skipped (they would not be picked over it by more than a hair of
  // per-op cost, and each costs a search step at large P).
  constexpr double kNearIdeal = 1.005;
  bool near_ideal = false;
  // (Skipped where the longest document's ring would be communication-bound: each of its workers
  // receives about all of its keys, which must travel within one worker's share of compute.)
  auto document_rings_fit = [&] {
    if (!DocumentPlanApplies(r) || params.bandwidth_bytes_per_second <= 0) {
      return DocumentPlanApplies(r);
    }
    const std::vector<int64_t>& off = r.mask_spec.doc_offsets[0];
    int64_t longest = 0;
    for (size_t d = 0; d + 1 < off.size(); ++d) longest = std::max(longest, off[d + 1] - off[d]);
    const UnitPairs pairs(RequestMask(r), r.seq_len);
    const double flops = 4.0 * r.shape.batch * r.shape.q_heads * r.shape.head_dim *
                         pairs(RowRange{0, r.seq_len}, RowRange{0, r.seq_len});
    double total_speed = 0;
    for (double x : speeds) total_speed += x;
    const double share_seconds = flops / params.flops_per_second / total_speed;
    const double wire_seconds = static_cast<double>(TransferBytes(r.shape, PlanTensor::kKV,
                                                                  longest)) /
                                params.bandwidth_bytes_per_second;
    return wire_seconds < share_seconds;
  };
  const bool rings_fit = document_rings_fit();
  // (Profile cpu: where the longest document's ring is communication-bound so are the
  // contiguous shards' (its later shards receive about all its keys): no contiguous variants;
  // head groups of fewer workers carry such requests, and their sub-searches try them.)
  const bool skip_contiguous = DocumentPlanApplies(r) && !rings_fit && !true_time;
  if (rings_fit) {
    // (lead 1: each travelling piece of a ring posted as early as its sender has it, as for
    // the whole-sequence rings below; profile cpu only.)
    for (const auto& [pieces, lead] :
         std::initializer_list<std::pair<int, int>>{{2, 0}, {4, 0}, {1, 0}, {2, 1}, {4, 1}}) {
      if (lead > 0 && true_time) continue;
      for (bool kvs : {true, false}) {
        // Short documents packed, grouped, packed with the rest over the ring workers too, or
        // binned (DocumentOptions); the last two with the K/V-stationary rings only.
        for (int placement = 0; placement < 4; ++placement) {
          if (placement >= 2 && !kvs) continue;
          for (double tail : {0.5, 0.0}) {
            if (near_ideal) break;
            const DocumentOptions options{1.0,  pieces,         lead,
                                          tail, kvs,            placement == 1,
                                          placement == 2, placement == 3};
            auto documents = [r, options] {
              Plan plan = MakeDocumentPlan(r, options);
              if (plan.workers.empty()) return plan;
              planner_internal::EqualizeSteps(plan);
              if (!HasBackwardSteps(plan)) DeriveBackwardSteps(plan);
              return plan;
            };
            Plan base = documents();
            if (base.workers.empty()) continue;
            consider(std::move(base), documents);
            near_ideal = !true_time && best_score.balance <= kNearIdeal;
          }
        }
      }
    }
  }
  consider(MakeSpeedProportionalPlan(r), [r] { return MakeSpeedProportionalPlan(r); });
  // Masks (documents, window): the contiguous shards of equal visible pairs per speed are the
  // natural layout (each worker receives only the keys its queries see: the documents crossing
  // its boundaries, the window's reach), with a few step counts, K/V posted one step before use
  // or all before the pass.
  if (!RequestMask(r).IsDense() && !near_ideal && !skip_contiguous) {
    for (int steps : {0, 3, 4, 6, 8, P}) {
      for (int variant = 0; variant < 32; ++variant) {
        const ContiguousOptions options{steps, (variant & 1) != 0, (variant & 2) != 0,
                                        (variant & 4) != 0, (variant & 8) != 0,
                                        (variant & 16) != 0 ? 4 : 1};
        if (steps == 0 && variant == 0) continue;
        if (options.relay && (options.early || !r.causal)) continue;
        auto contiguous = [r, options] {
          Plan plan = MakeSpeedProportionalPlan(r, options);
          planner_internal::EqualizeSteps(plan);
          DeriveBackwardSteps(plan);
          return plan;
        };
        Plan base = contiguous();
        // The derived backward returns every dK/dV partial of a shard to its owner: spread them.
        if (P >= 3) {
          for (int window : {2, 4}) {
            Plan spread = base;
            planner_internal::BalanceTransfers(spread, params, window, /*forward=*/false);
            consider(std::move(spread), [contiguous, params, window] {
              Plan plan = contiguous();
              planner_internal::BalanceTransfers(plan, params, window, /*forward=*/false);
              return plan;
            });
          }
        }
        consider(std::move(base), contiguous);
      }
    }
  }
  if (P >= 2 && r.seq_len >= 2 * int64_t{P}) {
    auto zigzag = [r] {
      Plan zigzag = MakeZigzagPlan(r);
      zigzag.schedule = "balanced";
      return zigzag;
    };
    consider(zigzag(), zigzag);
  }
  if (true_time) {  // The fixed schedules too: the least true time may be one of them.
    Plan ring = MakeRingPlan(r);
    ring.schedule = "balanced";
    consider(std::move(ring), nullptr);
    if (P % 2 == 0) {
      Plan distflash = MakeDistFlashPlan(r);
      distflash.schedule = "balanced";
      consider(std::move(distflash), nullptr);
    }
  }
  const double slowest = *std::min_element(speeds.begin(), speeds.end());
  const bool unequal = *std::max_element(speeds.begin(), speeds.end()) > slowest;
  std::vector<std::vector<int>> ring_orders = {{}};  // {}: workers in index order
  if (unequal && P >= 4) ring_orders.push_back(planner_internal::InterleavedRingOrder(speeds));
  // Striped rings with pieces of about 1/g of the slowest worker's pairs, g = 1..8.
  for (int g : {1, 2, 3, 4, 6, 8}) {
    std::vector<int> pieces(P);
    int64_t total = 0;
    for (int w = 0; w < P; ++w) {
      pieces[w] = std::max(1, static_cast<int>(std::lround(g * speeds[w] / slowest)));
      total += pieces[w];
    }
    // Every piece needs a row in each half; keep plans (and their step counts) modest.
    if (2 * total > r.seq_len || total > 16 * int64_t{P} + 64) break;
    // With unequal piece counts several workers may return dK/dV partials to one owner in the
    // same step: the same plan with the backward's transfers spread over 1 or 2 steps too.
    auto striped = [r, pieces] {
      Plan plan = MakeStripedRingPlan(r, pieces);
      planner_internal::EqualizeSteps(plan);
      DeriveBackwardSteps(plan);
      return plan;
    };
    Plan base = striped();
    if (P >= 3) {
      for (int window : {1, 2}) {
        Plan spread = base;
        planner_internal::BalanceTransfers(spread, params, window, /*forward=*/false);
        consider(std::move(spread), [striped, params, window] {
          Plan plan = striped();
          planner_internal::BalanceTransfers(plan, params, window, /*forward=*/false);
          return plan;
        });
      }
    }
    consider(std::move(base), striped);
    // The same rings with each travelling piece posted as early as its sender has it
    // (Transfer::lead): with >= 2 pieces per worker a piece gets two steps of compute to travel
    // in, so the links' load spreads over twice the time (profile cpu: not yet run on GPUs).
    if (!true_time && *std::min_element(pieces.begin(), pieces.end()) >= 2) {
      auto led = [r, pieces](bool kvs) {
        Plan plan = MakeStripedRingPlan(r, pieces, kvs, /*lead=*/1);
        planner_internal::EqualizeSteps(plan);
        if (!kvs) DeriveBackwardSteps(plan);
        return plan;
      };
      consider(led(false), [led] { return led(false); });
      consider(led(true), [led] { return led(true); });
    }
    // The same ring with the K/V-stationary backward (query pieces travel, dQ partials return
    // home): fewer bytes per step than K/V + fp32 dK/dV, the backward's limit at large P.
    // With unequal speeds also with the ring visiting slow and fast workers alternately
    // (InterleavedRingOrder): fewer dQ partials into one fast owner in the same step.
    for (const std::vector<int>& order : ring_orders) {
      // The K/V-stationary ring in this order, its travelling pieces posted `lead` steps early.
      auto kvs_led = [r, pieces, order, speeds](int lead) {
        PlanRequest slots = r;
        std::vector<int> slot_pieces = pieces;
        if (!order.empty()) {
          for (int k = 0; k < r.workers; ++k) {
            slots.speeds[k] = speeds[order[k]];
            slot_pieces[k] = pieces[order[k]];
          }
        }
        Plan plan = MakeStripedRingPlan(slots, slot_pieces, /*kv_stationary_backward=*/true, lead);
        planner_internal::EqualizeSteps(plan);
        if (!order.empty()) planner_internal::PermuteWorkers(plan, order);
        return plan;
      };
      if (!true_time && !order.empty() && *std::min_element(pieces.begin(), pieces.end()) >= 2) {
        consider(kvs_led(1), [kvs_led] { return kvs_led(1); });
      }
      auto kvs = [kvs_led] { return kvs_led(0); };
      Plan kv_base = kvs();
      if (P >= 3) {
        Plan spread = kv_base;
        planner_internal::BalanceTransfers(spread, params, 1, /*forward=*/false);
        consider(std::move(spread), [kvs, params] {
          Plan plan = kvs();
          planner_internal::BalanceTransfers(plan, params, 1, /*forward=*/false);
          return plan;
        });
      }
      consider(std::move(kv_base), kvs);
    }
  }
  // The cut ring (cut_ring_schedule.cc): the striped ring's layout with steps cut by work, exact
  // for speeds that are not multiples of one another (where the striped ring's rounded piece
  // counts make unequal steps). Many small ops: the op-overhead rule takes it only when needed.
  // Also with the interleaved ring order (fewer dQ partials into one fast owner per step).
  if (!true_time && unequal) {
    for (const std::vector<int>& order : ring_orders) {
      PlanRequest slots = r;
      if (!order.empty()) {
        for (int k = 0; k < P; ++k) slots.speeds[k] = speeds[order[k]];
      }
      for (const CutRingOptions& options :
           {CutRingOptions{1.25, 2, true}, CutRingOptions{1.25, 4, true},
            CutRingOptions{2, 4, true}}) {
        if (!CutRingApplies(slots, options)) continue;
        auto cut = [slots, options, order] {
          Plan plan = MakeCutRingPlan(slots, options);
          if (!plan.workers.empty() && !order.empty()) {
            planner_internal::PermuteWorkers(plan, order);
          }
          return plan;
        };
        Plan plan = cut();
        if (plan.workers.empty()) continue;
        consider(std::move(plan), cut);
      }
    }
  }
  // 2-D tiles (tiled_schedule.cc): less data per worker; pays off at large P with fast workers.
  if (P >= 16) {
    // A few settings that did best in a sweep at P = 64 (docs/planner.md).
    for (const TiledOptions& options :
         {TiledOptions{4, 0.3, 2, 1024, 24, 5, 8}, TiledOptions{6, 0.3, 2, 1024, 24, 2, 8},
          TiledOptions{4, 0.2, 3, 2048, 32, 3, 8}, TiledOptions{8, 0.2, 3, 512, 32, 3, 8},
          // Head peers first and transfers spread over the step windows (planner-4's sweep).
          TiledOptions{4, 0.3, 3, 1024, 32, 4, 8, true, 2},
          TiledOptions{4, 0.0, 3, 1024, 32, 4, 8, true, 2},
          TiledOptions{3, 0.0, 3, 1024, 32, 4, 8, true, 2}}) {
      if (TiledPlanApplies(r, options)) {
        consider(MakeTiledPlan(r, options), [r, options] { return MakeTiledPlan(r, options); });
      }
    }
  }
  // Tiles grouped by speed (TiledOptions::speed_groups): fast workers in small groups, so fewer
  // partials into their in-links; the settings that did best at P = 34..64 (docs/planner.md).
  if (!true_time && unequal && P >= 32) {
    for (const auto& [scale, pieces, steps, head_rows] :
         {std::tuple{2.5, 4096, 32, 2}, std::tuple{2.0, 4096, 24, 2}, std::tuple{3.0, 4096, 32, 2},
          std::tuple{2.5, 4096, 24, 2}, std::tuple{2.5, 2048, 24, 3}}) {
      TiledOptions options{1, 0.0, head_rows, pieces, steps, 4, 8, true, 2};
      options.speed_groups = scale;
      if (TiledPlanApplies(r, options)) {
        consider(MakeTiledPlan(r, options), [r, options] { return MakeTiledPlan(r, options); });
      }
    }
  }
  // Mixed passes (profile "cpu", only when no whole candidate is within kBalanceTarget: plans
  // that already are stay as they were): the forward of one candidate with the backward of
  // another of the same layout (owned ranges), when that pair beats every whole candidate. Each
  // pass reads only what its workers own (planner_internal::TakeBackwardFrom), so the pair is a
  // valid plan, and the passes are costed independently, so its score is exact. E.g. the
  // striped ring's forward with few large pieces (smaller ones lose the message latency) and
  // its K/V-stationary backward with smaller pieces, whose dQ partials BalanceTransfers can
  // spread (docs/planner.md, "Schedules").
  if (true_time) return WithHeadGroups(r, std::move(best), best_score, true_time);
  if (best_score.balance <= kBalanceTarget) return best;
  const Score sequence_score = best_score;
  int mix_f = -1, mix_b = -1;
  for (size_t a = 0; a < recorded.size(); ++a) {
    for (size_t b = 0; b < recorded.size(); ++b) {
      if (a == b || recorded[a].owned != recorded[b].owned) continue;
      const Score score = Combine(recorded[a].fwd, recorded[b].bwd);
      if (Better(score, best_score, true_time)) {
        best_score = score;
        mix_f = static_cast<int>(a);
        mix_b = static_cast<int>(b);
      }
    }
  }
  if (mix_f >= 0) {
    Plan mixed = recorded[mix_f].remake();
    if (planner_internal::TakeBackwardFrom(mixed, recorded[mix_b].remake())) {
      best = std::move(mixed);
    } else {
      best_score = sequence_score;
    }
  }
  if (best_score.balance <= kBalanceTarget) return best;
  return WithHeadGroups(r, std::move(best), best_score, true_time);
}

}  // namespace dfa
