// The schedules pass CheckPlan; the balanced one is within 2% of ideal; the seed's schedule is
// exactly the paper's; the checker catches broken plans; bad requests get clear errors.
#include <algorithm>
#include <cstdio>
#include <string>
#include <tuple>
#include <utility>

#include "core/planner/cost_model.h"
#include "core/planner/plan_checker.h"
#include "core/planner/plan_builder.h"
#include "core/planner/planner.h"
#include "gtest/gtest.h"

namespace dfa {
namespace {

CostParams ComputeOnly(const std::vector<double>& speeds = {}) {
  CostParams p;
  p.speeds = speeds;
  p.bandwidth_bytes_per_second = 0;  // free communication: the schedule's own balance
  return p;
}

TEST(PlannerTest, EverySchedulePassesTheCheckerForManyP) {
  for (const char* schedule : {"ring", "distflash", "zigzag", "balanced"}) {
    for (int P : {1, 2, 3, 4, 5, 7, 8, 13, 16, 31, 64}) {
      if (std::string(schedule) == "distflash" && P % 2) continue;
      for (bool causal : {true, false}) {
        for (int64_t S : {int64_t{2} * P + 1, int64_t{1000} * P + 17}) {
          absl::StatusOr<Plan> plan = MakePlan({schedule, P, S, causal, {}});
          ASSERT_TRUE(plan.ok()) << plan.status();
          absl::StatusOr<CheckReport> r = CheckPlan(*plan);
          ASSERT_TRUE(r.ok()) << schedule << " P=" << P << " S=" << S << ": " << r.status();
        }
      }
    }
  }
}

TEST(PlannerTest, BalancedIsWithinTwoPercentOfIdealForEveryP) {
  for (int P = 1; P <= 64; P += P < 20 ? 1 : 11) {  // 1..20, 31, 42, 53, 64 (runtime)
    for (bool causal : {true, false}) {
      absl::StatusOr<Plan> plan = MakePlan({"balanced", P, 65536, causal, {}});
      ASSERT_TRUE(plan.ok()) << plan.status();
      ASSERT_TRUE(CheckPlan(*plan).ok()) << P;
      absl::StatusOr<PlanCost> c = EstimateCost(*plan, ComputeOnly());
      ASSERT_TRUE(c.ok());
      EXPECT_LE(c->forward.makespan_ratio, 1.02) << "P=" << P << " causal=" << causal;
      EXPECT_LE(c->backward.makespan_ratio, 1.02) << "P=" << P << " causal=" << causal;
    }
  }
}

TEST(PlannerTest, BalancedHandlesUnequalSpeeds) {
  for (int P : {2, 3, 5, 8, 17, 64}) {
    std::vector<double> speeds;
    for (int w = 0; w < P; ++w) speeds.push_back(0.5 + (w * 7 % 5) * 0.4);  // 0.5 .. 2.1
    for (bool causal : {true, false}) {
      PlanRequest req{"balanced", P, 131072, causal, speeds};
      // The speed-proportional candidate is within 2% of ideal in compute for any speeds.
      Plan sp = MakeSpeedProportionalPlan(req);
      DeriveBackwardSteps(sp);
      ASSERT_TRUE(CheckPlan(sp).ok()) << CheckPlan(sp).status();
      absl::StatusOr<PlanCost> c = EstimateCost(sp, ComputeOnly(speeds));
      ASSERT_TRUE(c.ok());
      EXPECT_LE(c->forward.makespan_ratio, 1.02) << "P=" << P;
      EXPECT_LE(c->backward.makespan_ratio, 1.02) << "P=" << P;
      // The equal-speed layouts cannot adapt: zigzag is far off with these speeds.
      auto zz = MakePlan({"zigzag", P, 131072, causal, {}});
      ASSERT_TRUE(zz.ok());
      if (P >= 3) {
        EXPECT_GT(EstimateCost(*zz, ComputeOnly(speeds))->forward.makespan_ratio, 1.2) << P;
      }
      // "balanced" picks among its candidates with communication (default H200-like figures):
      // its worse-pass ratio is within the target, or no worse than these two candidates'.
      absl::StatusOr<Plan> plan = MakePlan(req);
      ASSERT_TRUE(plan.ok());
      ASSERT_TRUE(CheckPlan(*plan).ok());
      CostParams real;
      real.shape = AttentionShape{1, 32, 32, 128, DType::kBF16};
      real.speeds = speeds;
      auto ratio = [&](const Plan& p) {
        absl::StatusOr<PlanCost> c = EstimateCost(p, real);
        return std::max(c->forward.makespan_ratio, c->backward.makespan_ratio);
      };
      const double got = ratio(*plan);
      EXPECT_LE(got, std::max(kBalanceTarget, ratio(sp) * (1 + 1e-9))) << P;
      EXPECT_LE(got, std::max(kBalanceTarget, ratio(*zz) * (1 + 1e-9))) << P;
    }
  }
}

// The goal, with communication: H200-like figures (the defaults of `dfa plan`: 400 TFLOP/s,
// 300 GB/s per link and direction, 20 us per message; 32 heads of 128, bf16) at 256K tokens,
// no per-op overhead (the plan's balance). Speed patterns as in `dfa-plan-sweep` (docs/planner.md
// has the whole P = 1..64 table): 0 equal, 1 alternating 1,2, 2 random in [0.5, 2) (an LCG),
// 3 cycling 1,2,3,4, 4 one straggler at 0.5.
std::vector<double> SpeedSet(int kind, int P) {
  std::vector<double> s;
  uint32_t x = 12345u + static_cast<uint32_t>(P);
  for (int w = 0; w < P; ++w) {
    if (kind == 0) s.push_back(1.0);
    if (kind == 1) s.push_back(1.0 + w % 2);
    if (kind == 2) {
      x = x * 1664525u + 1013904223u;
      s.push_back(0.5 + 1.5 * (x >> 8) / double(1 << 24));
    }
    if (kind == 3) s.push_back(1.0 + w % 4);
    if (kind == 4) s.push_back(w == P / 2 ? 0.5 : 1.0);
  }
  return s;
}

CostParams H200Like(const std::vector<double>& speeds) {
  CostParams real;
  real.shape = AttentionShape{1, 32, 32, 128, DType::kBF16};
  real.speeds = speeds;
  return real;
}

// A representative set of where the 2% bound holds (docs/planner.md, sweep table): every
// pattern up to P = 16, equal speeds and the straggler up to 64 (causal 62 needed the
// K/V-stationary backward), speeds 1,2 causal at 48 (K/V-stationary backward), random causal at
// 48 (the cut ring) and full at 64, cycling 1..4 causal at 24 and 32 (interleaved ring order)
// and full at 48. Where it does not hold, see the next test.
TEST(PlannerTest, BalancedIsWithinTwoPercentWithCommunication) {
  struct Case {
    int kind;
    std::vector<int> workers;
    std::vector<bool> masks;
  };
  const std::vector<Case> cases = {{0, {1, 2, 3, 7, 16, 64}, {true, false}},
                                   {1, {2, 3, 7, 16, 32}, {true, false}},
                                   {1, {48}, {true}},
                                   {1, {48, 64}, {false}},
                                   {2, {3, 7, 16}, {true, false}},
                                   {2, {48}, {true}},
                                   {2, {64}, {false}},
                                   {3, {2, 3, 7, 16}, {true, false}},
                                   {3, {24, 32}, {true}},
                                   {3, {48}, {false}},
                                   {4, {2, 3, 7, 16, 62, 64}, {true, false}}};
  for (const Case& k : cases) {
    for (int P : k.workers) {
      for (bool causal : k.masks) {
        const CostParams real = H200Like(SpeedSet(k.kind, P));
        absl::StatusOr<Plan> plan = MakePlan({"balanced", P, 262144, causal, real.speeds});
        ASSERT_TRUE(plan.ok()) << plan.status();
        if (P <= 16) {
          ASSERT_TRUE(CheckPlan(*plan).ok()) << CheckPlan(*plan).status();
        }
        absl::StatusOr<PlanCost> c = EstimateCost(*plan, real);
        ASSERT_TRUE(c.ok());
        EXPECT_LE(c->forward.makespan_ratio, 1.02)
            << "speeds " << k.kind << " P=" << P << " causal=" << causal;
        EXPECT_LE(c->backward.makespan_ratio, 1.02)
            << "speeds " << k.kind << " P=" << P << " causal=" << causal;
      }
    }
  }
}

// Unequal speeds at large P, causal, sequence plans only (no PlanRequest::session_shape: no
// head groups): the 2% bound is NOT reached there (docs/planner.md, "Limits": 1-D
// plans are bandwidth-bound, the 2-D tiled plans lose time where a step's
// transfer window is overfull, more so the wider the speed spread). This guards what the search
// reaches today (measured: speeds 1,2 at P = 64: 1.042 / 1.016, 1.051 before the passes were
// mixed; random at 64: 1.031 / 1.034; cycling 1..4 at 40: 1.081 / 1.074, at 64: 1.206 / 1.132,
// with the speed-grouped tiles; before them 1.071 / 1.041, 1.158 / 1.196 and 1.430 / 1.197)
// against regressions.
TEST(PlannerTest, BalancedAtLargePWithUnequalSpeedsStaysWithinWhatIsReached) {
  // (Only cycling 1..4 at 40 since the head groups: the 2% test below covers P = 64.)
  for (const auto& [kind, P, limit] : {std::tuple{3, 40, 1.10}}) {
    const CostParams real = H200Like(SpeedSet(kind, P));
    absl::StatusOr<Plan> plan = MakePlan({"balanced", P, 262144, true, real.speeds});
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_TRUE(CheckPlan(*plan).ok());
    absl::StatusOr<PlanCost> c = EstimateCost(*plan, real);
    ASSERT_TRUE(c.ok());
    EXPECT_LE(c->forward.makespan_ratio, limit) << "speeds " << kind << " P=" << P;
    EXPECT_LE(c->backward.makespan_ratio, limit) << "speeds " << kind << " P=" << P;
    std::printf("speeds %d P=%d causal: forward %.4f backward %.4f\n", kind, P,
                c->forward.makespan_ratio, c->backward.makespan_ratio);
  }
}

// Where no sequence plan is within 2% (docs/planner.md, "Limits"), "balanced" given
// the session's shape (PlanRequest::session_shape, as `dfa plan` and the sweep pass it) splits
// the kv heads into groups whose summed speeds follow their head counts, each a sequence plan of
// fewer workers: cycling 1..4 causal at P = 37 (groups of unequal worker counts) and 64 (was
// 1.206 / 1.132). (The sweep has the rest: random causal 62-64, cycling 1..4 full 62; ~10 s
// each here, too slow for this test.)
// MQA (one kv head) cannot split: the sequence plan stays.
TEST(PlannerTest, BalancedSplitsHeadsWhereNoSequencePlanIsWithinTwoPercent) {
  const AttentionShape shape{1, 32, 32, 128, DType::kBF16};
  for (const auto& [kind, P, causal] : {std::tuple{3, 37, true}, std::tuple{3, 64, true}}) {
    const CostParams real = H200Like(SpeedSet(kind, P));
    PlanRequest request{"balanced", P, 262144, causal, real.speeds};
    request.session_shape = shape;
    absl::StatusOr<Plan> plan = MakePlan(request);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->schedule, "balanced");
    CheckOptions check;
    check.shape = shape;
    ASSERT_TRUE(CheckPlan(*plan, check).ok()) << CheckPlan(*plan, check).status();
    std::vector<std::pair<int, int>> ranges;
    for (const WorkerPlan& w : plan->workers) ranges.emplace_back(w.kv_heads.begin, w.kv_heads.end);
    std::sort(ranges.begin(), ranges.end());
    ranges.erase(std::unique(ranges.begin(), ranges.end()), ranges.end());
    EXPECT_GE(ranges.size(), 2u) << "speeds " << kind << " P=" << P << ": no head groups";
    absl::StatusOr<PlanCost> c = EstimateCost(*plan, real);
    ASSERT_TRUE(c.ok());
    EXPECT_LE(c->forward.makespan_ratio, 1.02) << "speeds " << kind << " P=" << P;
    EXPECT_LE(c->backward.makespan_ratio, 1.02) << "speeds " << kind << " P=" << P;
    std::printf("speeds %d P=%d %s: %zu head groups, forward %.4f backward %.4f\n", kind, P,
                causal ? "causal" : "full", ranges.size(), c->forward.makespan_ratio,
                c->backward.makespan_ratio);
  }
  PlanRequest mqa{"balanced", 37, 262144, true, SpeedSet(3, 37)};
  mqa.session_shape = AttentionShape{1, 32, 1, 128, DType::kBF16};
  absl::StatusOr<Plan> plan = MakePlan(mqa);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const WorkerPlan& w : plan->workers) EXPECT_TRUE(w.kv_heads.empty());
}

// Per-op overhead: each compute op costs op_overhead_seconds on top of its FLOPs (not part of
// the ideal), and the search prefers fewer ops when they cost no balance.
TEST(PlannerTest, OpOverheadIsChargedPerComputeOpAndSteersTheSearch) {
  absl::StatusOr<Plan> ring = MakePlan({"ring", 4, 4096, true, {}});
  ASSERT_TRUE(ring.ok());
  CostParams p = ComputeOnly();
  absl::StatusOr<PlanCost> base = EstimateCost(*ring, p);
  p.op_overhead_seconds = 1e-3;  // large: it dominates
  absl::StatusOr<PlanCost> over = EstimateCost(*ring, p);
  ASSERT_TRUE(base.ok() && over.ok());
  EXPECT_EQ(over->forward.ideal_seconds, base->forward.ideal_seconds);
  for (int w = 0; w < 4; ++w) {
    EXPECT_EQ(base->forward.workers[w].compute_ops, w + 1);  // worker w: its w+1 chunks
    EXPECT_NEAR(over->forward.workers[w].busy_seconds,
                base->forward.workers[w].busy_seconds + 1e-3 * (w + 1), 1e-9);
  }
  p.op_overhead_seconds = -1;
  EXPECT_FALSE(EstimateCost(*ring, p).ok());
  // Equal speeds at P = 8: zigzag and striped rings with 2-8 pieces per worker are all within
  // 2%; without the overhead the search took 8 pieces (136 ops per worker, a hair better
  // balanced); now it takes one with far fewer ops (small units cost real GPUs
  // 15-38%), at most one piece size finer than zigzag.
  absl::StatusOr<Plan> plan = MakePlan({"balanced", 8, 131072, true, {}});
  absl::StatusOr<Plan> zigzag = MakePlan({"zigzag", 8, 131072, true, {}});
  ASSERT_TRUE(plan.ok() && zigzag.ok());
  const CostParams real = H200Like({});
  absl::StatusOr<PlanCost> c = EstimateCost(*plan, real), z = EstimateCost(*zigzag, real);
  ASSERT_TRUE(c.ok() && z.ok());
  EXPECT_LE(std::max(c->forward.makespan_ratio, c->backward.makespan_ratio), kBalanceTarget);
  int ops = 0, zigzag_ops = 0;
  for (int w = 0; w < 8; ++w) {
    ops = std::max(ops, c->forward.workers[w].compute_ops);
    zigzag_ops = std::max(zigzag_ops, z->forward.workers[w].compute_ops);
  }
  EXPECT_LE(ops, 2 * zigzag_ops);
  Plan fine = MakeStripedRingPlan({"balanced", 8, 131072, true, {}}, std::vector<int>(8, 8));
  planner_internal::EqualizeSteps(fine);
  DeriveBackwardSteps(fine);
  absl::StatusOr<PlanCost> f = EstimateCost(fine, real);
  ASSERT_TRUE(f.ok());
  EXPECT_GE(f->forward.workers[0].compute_ops, 4 * ops);
  // With the overhead charged, the chosen plan is cheaper than the finely cut one.
  CostParams with_overhead = real;
  with_overhead.op_overhead_seconds = kSearchOpOverheadSeconds;
  absl::StatusOr<PlanCost> co = EstimateCost(*plan, with_overhead),
                           fo = EstimateCost(fine, with_overhead);
  ASSERT_TRUE(co.ok() && fo.ok());
  EXPECT_LT(co->forward.makespan_seconds + co->backward.makespan_seconds,
            fo->forward.makespan_seconds + fo->backward.makespan_seconds);
}

// The backward of a striped ring with unequal piece counts, its transfers spread by
// BalanceTransfers: still valid (the simulator runs such plans: striped_bb), and at P = 36 with
// speeds 1,2 it brings the backward within 2% (1.038 without).
TEST(PlannerTest, BackwardBalanceKeepsStripedPlansValidAndHelps) {
  const int P = 36;
  const CostParams real = H200Like(SpeedSet(1, P));
  std::vector<int> pieces;
  for (int w = 0; w < P; ++w) pieces.push_back(2 * (1 + w % 2));
  Plan before = MakeStripedRingPlan({"balanced", P, 262144, true, real.speeds}, pieces);
  planner_internal::EqualizeSteps(before);
  DeriveBackwardSteps(before);
  Plan after = before;
  planner_internal::BalanceTransfers(after, real, 1, /*forward=*/false);
  for (int w = 0; w < P; ++w) {
    ASSERT_EQ(before.workers[w].forward.size(), after.workers[w].forward.size());
    for (size_t t = 0; t < before.workers[w].forward.size(); ++t) {
      EXPECT_EQ(before.workers[w].forward[t].sends, after.workers[w].forward[t].sends);
    }
  }
  ASSERT_TRUE(CheckPlan(after, {real.shape, 0}).ok()) << CheckPlan(after).status();
  absl::StatusOr<PlanCost> cb = EstimateCost(before, real), ca = EstimateCost(after, real);
  ASSERT_TRUE(cb.ok() && ca.ok());
  EXPECT_LT(ca->backward.makespan_ratio, cb->backward.makespan_ratio - 0.01);
  EXPECT_LE(ca->backward.makespan_ratio, 1.02);
  std::printf("P=36 speeds 1,2 striped backward: %.4f -> %.4f with BalanceTransfers\n",
              cb->backward.makespan_ratio, ca->backward.makespan_ratio);
}

// BalanceTransfers keeps plans exact and valid and only moves what it may: owned Q/KV earlier,
// partials later, within the window; at P = 64 (speeds 1,2,...) it shortens the tiled forward.
TEST(PlannerTest, BalanceTransfersKeepsPlansValidAndHelpsTheTiledForward) {
  const AttentionShape shape{1, 32, 32, 128, DType::kBF16};
  CostParams real;
  real.shape = shape;
  for (int P : {5, 16, 64}) {
    const std::vector<double> speeds = SpeedSet(1, P);
    real.speeds = speeds;
    PlanRequest req{"balanced", P, 262144, true, speeds};
    TiledOptions options{4, 0.3, 2, 1024, 32, 4, 8, true, 0};
    Plan before = MakeTiledPlan(req, options);
    planner_internal::EqualizeSteps(before);
    options.balance_window = 2;
    Plan after = MakeTiledPlan(req, options);
    planner_internal::EqualizeSteps(after);
    // Same computes; each transfer moved at most 2 steps, in its allowed direction.
    ASSERT_EQ(before.workers.size(), after.workers.size());
    int moved = 0;
    for (int w = 0; w < P; ++w) {
      const auto& b = before.workers[w].forward;
      const auto& a = after.workers[w].forward;
      ASSERT_EQ(b.size(), a.size());
      for (size_t t = 0; t < b.size(); ++t) {
        EXPECT_EQ(b[t].computes, a[t].computes);
        for (const Transfer& x : b[t].sends) {
          int found = -1;
          for (size_t u = 0; u < a.size() && found < 0; ++u) {
            if (std::count(a[u].sends.begin(), a[u].sends.end(), x) > 0) found = static_cast<int>(u);
          }
          ASSERT_GE(found, 0);
          const int delta = found - static_cast<int>(t);
          EXPECT_TRUE(IsPartial(x.tensor) ? delta >= 0 && delta <= 2 : delta <= 0 && delta >= -2);
          moved += delta != 0;
        }
      }
    }
    EXPECT_GT(moved, 0) << P;
    for (Plan* p : {&before, &after}) {
      DeriveBackwardSteps(*p);
      absl::StatusOr<CheckReport> r = CheckPlan(*p, {shape, 0});
      ASSERT_TRUE(r.ok()) << "P=" << P << ": " << r.status();
    }
    if (P == 64) {
      absl::StatusOr<PlanCost> cb = EstimateCost(before, real), ca = EstimateCost(after, real);
      ASSERT_TRUE(cb.ok() && ca.ok());
      EXPECT_LT(ca->forward.makespan_ratio, cb->forward.makespan_ratio - 0.01);
      std::printf("P=64 tiled forward: %.4f -> %.4f with BalanceTransfers\n",
                  cb->forward.makespan_ratio, ca->forward.makespan_ratio);
    }
  }
}

TEST(PlannerTest, StripedRingBalancesAnySpeedsInCompute) {
  // Mirrored ranges sized by speed: work proportional to speed without any search.
  for (int P : {2, 3, 7, 16, 64}) {
    for (bool causal : {true, false}) {
      std::vector<double> speeds = SpeedSet(2, P);
      PlanRequest req{"balanced", P, 1 << 20, causal, speeds};
      Plan plan = MakeStripedRingPlan(req, std::vector<int>(P, 1));
      planner_internal::EqualizeSteps(plan);
      DeriveBackwardSteps(plan);
      absl::StatusOr<CheckReport> r = CheckPlan(plan);
      ASSERT_TRUE(r.ok()) << r.status();
      absl::StatusOr<PlanCost> c = EstimateCost(plan, ComputeOnly(speeds));
      ASSERT_TRUE(c.ok());
      EXPECT_LE(c->forward.compute_makespan_ratio, 1.001) << P;
      // Every K/V piece reaches each worker at most once, one piece per link per step.
      for (const WorkerPlan& w : plan.workers) {
        for (const PlanStep& st : w.forward) EXPECT_LE(st.recvs.size(), 2u);
      }
    }
  }
}

// Largest forward bytes received by one worker (the bandwidth limit of a plan).
int64_t MaxForwardBytesReceived(const Plan& plan, const AttentionShape& shape) {
  int64_t most = 0;
  for (const WorkerPlan& w : plan.workers) {
    int64_t got = 0;
    for (const PlanStep& st : w.forward) {
      for (const Transfer& x : st.recvs) got += TransferBytes(shape, x.tensor, x.rows.size());
    }
    most = std::max(most, got);
  }
  return most;
}

TEST(PlannerTest, TiledPlansAreExactBalancedAndMoveLessData) {
  const AttentionShape shape{1, 32, 32, 128, DType::kBF16};
  for (int P : {4, 9, 16, 64}) {
    for (int groups : {1, 2, 3, 8}) {
      if (groups > P) continue;
      for (bool causal : {true, false}) {
        const std::vector<double> speeds = SpeedSet(2, P);
        PlanRequest req{"balanced", P, 262144, causal, speeds};
        const TiledOptions options{groups, 0.2, 2, 2048, 16, 3, 8};
        ASSERT_TRUE(TiledPlanApplies(req, options));
        Plan plan = MakeTiledPlan(req, options);
        planner_internal::EqualizeSteps(plan);
        DeriveBackwardSteps(plan);
        absl::StatusOr<CheckReport> r = CheckPlan(plan, {shape, 0});
        ASSERT_TRUE(r.ok()) << "P=" << P << " groups=" << groups << ": " << r.status();
        absl::StatusOr<PlanCost> c = EstimateCost(plan, ComputeOnly(speeds));
        ASSERT_TRUE(c.ok());
        // Tile areas proportional to speed (up to the diagonal's O(x) and row rounding).
        EXPECT_LE(c->forward.compute_makespan_ratio, 1.005) << "P=" << P << " groups=" << groups;
        if (P == 64 && groups == 8) {  // O(S/sqrt(P)) rows (and partials) per worker, not ~S
          Plan striped = MakeStripedRingPlan(req, std::vector<int>(P, 1));
          EXPECT_LT(2 * MaxForwardBytesReceived(plan, shape),
                    MaxForwardBytesReceived(striped, shape));
        }
      }
    }
  }
  PlanRequest tiny{"balanced", 8, 40, true, {}};
  EXPECT_FALSE(TiledPlanApplies(tiny, TiledOptions{2}));  // needs seq_len >= 8 * workers
}

// Speed groups (TiledOptions::speed_groups): workers sorted by speed into groups whose size
// falls with speed, relabelled to the request's order. Exact, compute-balanced, and a fast
// worker's in-link carries much less than with groups of consecutive workers.
TEST(PlannerTest, SpeedGroupedTilesAreExactBalancedAndUnloadFastOwners) {
  const AttentionShape shape{1, 32, 32, 128, DType::kBF16};
  for (int P : {5, 16, 37, 64}) {
    for (int kind : {1, 2, 3}) {
      for (bool causal : {true, false}) {
        const std::vector<double> speeds = SpeedSet(kind, P);
        PlanRequest req{"balanced", P, 262144, causal, speeds};
        TiledOptions options{1, 0.0, 2, 4096, 24, 4, 8, true, 2};
        options.speed_groups = P == 5 ? 0.7 : 2.5;
        ASSERT_TRUE(TiledPlanApplies(req, options));
        Plan plan = MakeTiledPlan(req, options);
        DeriveBackwardSteps(plan);
        absl::StatusOr<CheckReport> r = CheckPlan(plan, {shape, 0});
        ASSERT_TRUE(r.ok()) << "P=" << P << " kind=" << kind << ": " << r.status();
        absl::StatusOr<PlanCost> c = EstimateCost(plan, ComputeOnly(speeds));
        ASSERT_TRUE(c.ok());
        EXPECT_LE(c->forward.compute_makespan_ratio, 1.005) << "P=" << P << " kind=" << kind;
        // Worker w still owns a share of the rows proportional to its speed.
        int64_t owned = 0;
        for (const RowRange& rr : plan.workers[P - 1].owned) owned += rr.size();
        double sum = 0;
        for (double x : speeds) sum += x;
        EXPECT_NEAR(owned, 262144 * speeds[P - 1] / sum, 4.0 + 2 * P);
        if (P == 64 && kind == 3 && causal) {
          options.speed_groups = 0;
          options.groups = 4;
          Plan grouped = MakeTiledPlan(req, options);
          EXPECT_LT(5 * MaxForwardBytesReceived(plan, shape),
                    4 * MaxForwardBytesReceived(grouped, shape));  // 1.84 vs 2.40 GB
        }
      }
    }
  }
}

TEST(PlannerTest, SchedulesMatchTheirTheoreticalRatios) {
  const int64_t S = 1 << 20;
  for (int P : {2, 4, 8, 16}) {
    auto ratio = [&](const char* s) {
      auto plan = MakePlan({s, P, S, true, {}});
      return EstimateCost(*plan, ComputeOnly())->forward.makespan_ratio;
    };
    EXPECT_NEAR(ratio("ring"), (2.0 * P - 1) / P, 1e-3) << P;
    EXPECT_NEAR(ratio("distflash"), (P + 1.0) / P, 1e-3) << P;  // (P+1)/2 units vs P/2 ideal
    EXPECT_NEAR(ratio("zigzag"), 1.0, 1e-3) << P;
  }
}

TEST(PlannerTest, DistFlashIsThePapersAlgorithm2) {
  const int P = 6;
  auto plan = MakePlan({"distflash", P, 600, true, {}});
  ASSERT_TRUE(plan.ok());
  auto chunk = [](int i) { return RowRange{100 * i, 100 * (i + 1)}; };
  for (int r = 0; r < P; ++r) {
    const auto& steps = plan->workers[r].forward;
    ASSERT_EQ(steps.size(), size_t(P / 2 + 1) + 0);  // P/2 + 1 steps
    EXPECT_EQ(steps[0].computes, (std::vector<ComputeOp>{{chunk(r), chunk(r)}}));
    for (int t = 1; t <= P / 2; ++t) {
      std::vector<ComputeOp> want;
      if (r >= t) want.push_back({chunk(r), chunk(r - t)});
      if (r < t && t < P / 2) want.push_back({chunk(r + P - t), chunk(r)});
      EXPECT_EQ(steps[t].computes, want) << "worker " << r << " step " << t;
    }
  }
}

TEST(PlannerTest, GqaMovesKeysAndValuesAtTheirOwnHeadCount) {
  AttentionShape mha{1, 32, 32, 128, DType::kBF16}, gqa{1, 32, 8, 128, DType::kBF16};
  EXPECT_EQ(TransferBytes(gqa, PlanTensor::kKV, 1000) * 4, TransferBytes(mha, PlanTensor::kKV, 1000));
  EXPECT_EQ(TransferBytes(gqa, PlanTensor::kQ, 1000), TransferBytes(mha, PlanTensor::kQ, 1000));
  auto plan = MakePlan({"zigzag", 4, 4096, true, {}});
  CostParams a = ComputeOnly(), b = ComputeOnly();
  a.shape = mha;
  b.shape = gqa;
  EXPECT_EQ(EstimateCost(*plan, a)->forward.workers[1].bytes_received,
            4 * EstimateCost(*plan, b)->forward.workers[1].bytes_received);
}

TEST(PlannerTest, RejectsBadRequestsWithClearMessages) {
  auto err = [](PlanRequest r) { return std::string(MakePlan(r).status().message()); };
  EXPECT_NE(err({"ring", 0, 10, true, {}}).find("workers"), std::string::npos);
  EXPECT_NE(err({"ring", 8, 7, true, {}}).find("seq_len"), std::string::npos);
  EXPECT_NE(err({"nope", 2, 10, true, {}}).find("unknown"), std::string::npos);
  EXPECT_NE(err({"distflash", 3, 10, true, {}}).find("even"), std::string::npos);
  EXPECT_NE(err({"balanced", 2, 10, true, {1.0}}).find("speeds"), std::string::npos);
  EXPECT_NE(err({"balanced", 2, 10, true, {1.0, -1.0}}).find("speeds[1]"), std::string::npos);
}

TEST(CheckPlanTest, CatchesMissingAndDuplicatedUnits) {
  auto plan = *MakePlan({"ring", 3, 30, true, {}});
  Plan missing = plan;
  missing.workers[2].forward[2].computes.clear();
  EXPECT_NE(CheckPlan(missing).status().message().find("never attend"), absl::string_view::npos);
  Plan twice = plan;
  twice.workers[1].forward[0].computes.push_back(twice.workers[1].forward[0].computes[0]);
  EXPECT_NE(CheckPlan(twice).status().message().find("more than once"), absl::string_view::npos);
}

TEST(CheckPlanTest, CatchesUnmatchedTransfersAndMissingData) {
  auto plan = *MakePlan({"ring", 3, 30, true, {}});
  Plan unmatched = plan;
  unmatched.workers[1].forward[1].recvs.clear();
  EXPECT_NE(CheckPlan(unmatched).status().message().find("no matching"), absl::string_view::npos);
  Plan late = plan;  // the K/V arrives one step after it is used
  std::swap(late.workers[2].forward[1].computes, late.workers[2].forward[2].computes);
  late.workers[2].forward[1].computes.push_back({{20, 30}, {0, 10}});
  late.workers[2].forward[2].computes = {{{20, 30}, {10, 20}}};
  EXPECT_FALSE(CheckPlan(late).ok());
}

TEST(CheckPlanTest, CatchesPartialsNeverReturnedAndRepeatedKv) {
  auto plan = *MakePlan({"distflash", 4, 40, true, {}});
  Plan lost = plan;
  for (auto& w : lost.workers) {
    for (auto& s : w.forward) {
      std::erase_if(s.sends, [](const Transfer& x) { return x.tensor == PlanTensor::kOutPartial; });
      std::erase_if(s.recvs, [](const Transfer& x) { return x.tensor == PlanTensor::kOutPartial; });
    }
  }
  EXPECT_NE(CheckPlan(lost).status().message().find("never sent"), absl::string_view::npos);
  Plan again = *MakePlan({"ring", 3, 30, false, {}});
  // Worker 1 gets chunk 0's K/V a second time at step 2.
  again.workers[0].forward[2].sends.push_back({1, PlanTensor::kKV, {0, 10}});
  again.workers[1].forward[2].recvs.push_back({0, PlanTensor::kKV, {0, 10}});
  EXPECT_NE(CheckPlan(again).status().message().find("second time"), absl::string_view::npos);
}

TEST(CheckPlanTest, ReportsAndBoundsPeakBufferMemory) {
  auto plan = *MakePlan({"ring", 4, 4096, true, {}});
  CheckOptions o;
  o.shape = AttentionShape{1, 8, 8, 64, DType::kBF16};
  auto r = CheckPlan(plan, o);
  ASSERT_TRUE(r.ok());
  const int64_t chunk_kv = TransferBytes(o.shape, PlanTensor::kKV, 1024);
  EXPECT_EQ(r->peak_forward_bytes[0], 0);      // worker 0 receives nothing in a causal ring
  EXPECT_EQ(r->peak_forward_bytes[3], 2 * chunk_kv);  // one in use, the next arriving
  o.max_buffer_bytes = chunk_kv;
  EXPECT_FALSE(CheckPlan(plan, o).ok());
}

}  // namespace
}  // namespace dfa
