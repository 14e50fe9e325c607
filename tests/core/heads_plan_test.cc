// Schedule "heads" (head groups, plan.h) and "auto": the plans the planner makes, what CheckPlan
// refuses in head-split plans, and the cost model at each worker's local heads.
#include <algorithm>
#include <string>

#include "core/planner/cost_model.h"
#include "core/planner/plan_checker.h"
#include "core/planner/planner.h"
#include "gtest/gtest.h"

namespace dfa {
namespace {

PlanRequest Request(const std::string& schedule, int workers, int64_t seq, int q_heads,
                    int kv_heads, std::vector<double> speeds = {}) {
  PlanRequest r;
  r.schedule = schedule;
  r.workers = workers;
  r.seq_len = seq;
  r.speeds = std::move(speeds);
  r.shape = AttentionShape{1, q_heads, kv_heads, 64, DType::kBF16};
  return r;
}

CheckOptions Shape(const PlanRequest& r) {
  CheckOptions o;
  o.shape = r.shape;
  return o;
}

int Transfers(const WorkerPlan& w) {
  int n = 0;
  for (const auto* pass : {&w.forward, &w.backward}) {
    for (const PlanStep& s : *pass) n += static_cast<int>(s.sends.size() + s.recvs.size());
  }
  return n;
}

TEST(HeadsPlanTest, GroupCountIsTheLargestDivisorWithinTheHeads) {
  EXPECT_EQ(HeadGroupCount(Request("heads", 2, 100, 32, 32)), 2);
  EXPECT_EQ(HeadGroupCount(Request("heads", 8, 100, 32, 32)), 8);
  EXPECT_EQ(HeadGroupCount(Request("heads", 6, 100, 8, 4)), 3);
  EXPECT_EQ(HeadGroupCount(Request("heads", 64, 1000, 32, 8)), 8);
  EXPECT_EQ(HeadGroupCount(Request("heads", 5, 100, 8, 2)), 1);
  EXPECT_EQ(HeadGroupCount(Request("heads", 4, 100, 8, 1)), 1);
}

// P = groups: every worker holds all rows of its heads; nothing moves between workers.
TEST(HeadsPlanTest, TwoWorkersSplitTheHeadsAndMoveNothing) {
  const PlanRequest r = Request("heads", 2, 16384, 32, 32);
  absl::StatusOr<Plan> plan = MakePlan(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->schedule, "heads");
  ASSERT_EQ(plan->num_workers(), 2);
  for (int w = 0; w < 2; ++w) {
    EXPECT_EQ(plan->workers[w].kv_heads, (HeadRange{16 * w, 16 * w + 16}));
    EXPECT_EQ(plan->workers[w].owned, (std::vector<RowRange>{{0, 16384}}));
    EXPECT_EQ(Transfers(plan->workers[w]), 0);
    EXPECT_EQ(LocalShape(r.shape, plan->workers[w]).q_heads, 16);
  }
  absl::StatusOr<CheckReport> check = CheckPlan(*plan, Shape(r));
  ASSERT_TRUE(check.ok()) << check.status();
  EXPECT_EQ(check->max_peak_bytes, 0);
}

// P > groups: each group runs a sequence plan over all rows, its transfers inside the group.
TEST(HeadsPlanTest, HybridGroupsRunASequencePlanEach) {
  const PlanRequest r = Request("heads", 6, 999, 8, 4);  // 3 groups of 2: heads 2, 1, 1
  absl::StatusOr<Plan> plan = MakePlan(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(CheckPlan(*plan, Shape(r)).ok()) << CheckPlan(*plan, Shape(r)).status();
  int heads = 0;
  for (int g = 0; g < 3; ++g) {
    const HeadRange h = plan->workers[2 * g].kv_heads;
    EXPECT_EQ(plan->workers[2 * g + 1].kv_heads, h);
    EXPECT_EQ(h.begin, heads);
    EXPECT_GE(h.size(), 1);
    heads = h.end;
    for (int k = 0; k < 2; ++k) {
      const WorkerPlan& w = plan->workers[2 * g + k];
      EXPECT_GT(Transfers(w), 0);
      for (const auto* pass : {&w.forward, &w.backward}) {
        for (const PlanStep& s : *pass) {
          for (const Transfer& x : s.sends) EXPECT_EQ(x.peer / 2, g);
        }
      }
    }
  }
  EXPECT_EQ(heads, 4);
}

// Head counts follow the groups' summed speeds.
TEST(HeadsPlanTest, FasterGroupsGetMoreHeads) {
  const PlanRequest r = Request("heads", 2, 4096, 16, 8, {1, 3});
  absl::StatusOr<Plan> plan = MakePlan(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->workers[0].kv_heads, (HeadRange{0, 2}));
  EXPECT_EQ(plan->workers[1].kv_heads, (HeadRange{2, 8}));
  ASSERT_TRUE(CheckPlan(*plan, Shape(r)).ok());
}

// Unequal speeds: consecutive groups {0, 1}, {2, 3} of speeds 1, 1, 2, 2 would give one head to
// speed 2 and one to speed 4; dealing by speed gives {0, 2}, {1, 3} (speed 3 each). Equal
// speeds keep consecutive groups.
TEST(HeadsPlanTest, UnequalSpeedsAreDealtIntoEvenGroups) {
  const PlanRequest r = Request("heads", 4, 2000, 8, 2, {1, 1, 2, 2});
  absl::StatusOr<Plan> plan = MakePlan(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(CheckPlan(*plan, Shape(r)).ok()) << CheckPlan(*plan, Shape(r)).status();
  EXPECT_EQ(plan->workers[0].kv_heads, plan->workers[2].kv_heads);
  EXPECT_EQ(plan->workers[1].kv_heads, plan->workers[3].kv_heads);
  EXPECT_NE(plan->workers[0].kv_heads, plan->workers[1].kv_heads);
  for (const PlanStep& s : plan->workers[0].forward) {
    for (const Transfer& x : s.sends) EXPECT_EQ(x.peer, 2);
  }
  absl::StatusOr<Plan> equal = MakePlan(Request("heads", 4, 2000, 8, 2));
  ASSERT_TRUE(equal.ok());
  EXPECT_EQ(equal->workers[0].kv_heads, equal->workers[1].kv_heads);
  EXPECT_EQ(equal->workers[2].kv_heads, equal->workers[3].kv_heads);
}

// No split possible (P = 1, kv_heads = 1, no divisor of P within the heads): the balanced plan.
TEST(HeadsPlanTest, WithoutASplitItIsTheBalancedPlan) {
  for (const PlanRequest& r : {Request("heads", 1, 100, 8, 8), Request("heads", 4, 1000, 8, 1),
                               Request("heads", 5, 1000, 8, 2)}) {
    absl::StatusOr<Plan> heads = MakePlan(r);
    PlanRequest b = r;
    b.schedule = "balanced";
    absl::StatusOr<Plan> balanced = MakePlan(b);
    ASSERT_TRUE(heads.ok() && balanced.ok());
    ASSERT_EQ(heads->num_workers(), balanced->num_workers());
    for (int w = 0; w < heads->num_workers(); ++w) {
      EXPECT_TRUE(heads->workers[w].kv_heads.empty());
      EXPECT_EQ(heads->workers[w].owned, balanced->workers[w].owned);
      EXPECT_EQ(heads->workers[w].forward.size(), balanced->workers[w].forward.size());
    }
  }
}

TEST(HeadsPlanTest, ValidationNamesTheSchedules) {
  EXPECT_TRUE(ValidatePlanRequest(Request("heads", 3, 10, 4, 2)).ok());
  EXPECT_TRUE(ValidatePlanRequest(Request("auto", 3, 10, 4, 2)).ok());
  const absl::Status bad = ValidatePlanRequest(Request("head", 3, 10, 4, 2));
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("heads or auto"), absl::string_view::npos) << bad;
}

// The cost model runs each worker at its local heads: the heads plan's ideal is the balanced
// plan's (same FLOPs), each worker does half of the work units, nothing is sent.
TEST(HeadsPlanTest, CostModelUsesTheLocalHeads) {
  const PlanRequest r = Request("heads", 2, 8192, 32, 32);
  PlanRequest b = r;
  b.schedule = "balanced";
  absl::StatusOr<Plan> heads = MakePlan(r), balanced = MakePlan(b);
  ASSERT_TRUE(heads.ok() && balanced.ok());
  CostParams params = CpuCostParams(r.shape);
  absl::StatusOr<PlanCost> hc = EstimateCost(*heads, params), bc = EstimateCost(*balanced, params);
  ASSERT_TRUE(hc.ok() && bc.ok());
  EXPECT_NEAR(hc->forward.ideal_seconds, bc->forward.ideal_seconds,
              1e-9 * bc->forward.ideal_seconds);
  EXPECT_NEAR(hc->forward.makespan_ratio, 1.0, 1e-9);  // equal halves, no communication
  EXPECT_NEAR(hc->forward.makespan_seconds, hc->forward.ideal_seconds,
              1e-9 * hc->forward.ideal_seconds);
  double units = 0;
  for (const WorkerCost& w : hc->forward.workers) {
    EXPECT_EQ(w.bytes_sent, 0);
    units += w.work_units;
  }
  double balanced_units = 0;
  for (const WorkerCost& w : bc->forward.workers) balanced_units += w.work_units;
  EXPECT_NEAR(units, balanced_units, 1e-9 * balanced_units);
}

// "auto" takes the cheaper: heads when the heads split evenly (GPU profile, 16K, P = 2: one
// unit per pass, no messages), balanced when they cannot (3 heads on 2 workers: 2 vs 1).
TEST(HeadsPlanTest, AutoPicksTheCheaperSchedule) {
  PlanRequest even = Request("auto", 2, 16384, 32, 32);
  even.profile = "gpu";
  absl::StatusOr<Plan> a = MakePlan(even);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->schedule, "heads");
  ASSERT_TRUE(CheckPlan(*a, Shape(even)).ok());
  PlanRequest b = even;
  b.schedule = "balanced";
  absl::StatusOr<Plan> balanced = MakePlan(b);
  ASSERT_TRUE(balanced.ok());
  const CostParams gpu = GpuCostParams(even.shape);
  absl::StatusOr<PlanCost> ac = EstimateCost(*a, gpu), bc = EstimateCost(*balanced, gpu);
  ASSERT_TRUE(ac.ok() && bc.ok());
  EXPECT_LT(ac->forward.makespan_seconds + ac->backward.makespan_seconds,
            bc->forward.makespan_seconds + bc->backward.makespan_seconds);

  absl::StatusOr<Plan> uneven = MakePlan(Request("auto", 2, 65536, 3, 3));
  ASSERT_TRUE(uneven.ok()) << uneven.status();
  EXPECT_EQ(uneven->schedule, "balanced");
  for (const WorkerPlan& w : uneven->workers) EXPECT_TRUE(w.kv_heads.empty());
}

// Speed-balanced groups of any worker counts (what "balanced" splits into): cycling speeds
// 1..4 at P = 37 (sum 91) over 32 kv heads in 2 groups cannot be 16 + 16 heads on 45.5 + 45.5;
// the partition reaches a heads / speed within 1% of 32 / 91 with groups of unequal counts
// (2-4 groups; within 2% with 8).
// Every worker in one group, members ascending, heads >= 1 each and summing to kv_heads.
TEST(HeadsPlanTest, SpeedBalancedGroupsFollowTheHeadCounts) {
  std::vector<double> speeds;
  for (int w = 0; w < 37; ++w) speeds.push_back(1 + w % 4);
  const PlanRequest r = Request("balanced", 37, 262144, 32, 32, speeds);
  for (int g : {2, 3, 5, 8}) {
    const HeadGroupSplit groups = SpeedBalancedHeadGroups(r, g);
    ASSERT_EQ(groups.members.size(), static_cast<size_t>(g));
    ASSERT_EQ(groups.kv_heads.size(), static_cast<size_t>(g));
    std::vector<int> seen(37, 0);
    int heads = 0;
    double worst = 0;
    for (int i = 0; i < g; ++i) {
      EXPECT_GE(groups.kv_heads[i], 1);
      heads += groups.kv_heads[i];
      EXPECT_TRUE(std::is_sorted(groups.members[i].begin(), groups.members[i].end()));
      double sum = 0;
      for (int m : groups.members[i]) {
        ++seen[m];
        sum += speeds[m];
      }
      worst = std::max(worst, groups.kv_heads[i] / sum);
    }
    EXPECT_EQ(heads, 32);
    for (int w = 0; w < 37; ++w) EXPECT_EQ(seen[w], 1) << "worker " << w;
    EXPECT_NEAR(HeadGroupsLoad(r, groups), worst * 91 / 32, 1e-12);
    // 8 groups of ~4 heads on ~11.4 speed: integer sums cannot get closer than ~1.5%.
    EXPECT_LE(HeadGroupsLoad(r, groups), g <= 4 ? 1.01 : 1.02) << g << " groups";
  }
  const HeadGroupSplit two = SpeedBalancedHeadGroups(r, 2);
  EXPECT_NE(two.members[0].size(), two.members[1].size());
  EXPECT_TRUE(SpeedBalancedHeadGroups(r, 1).members.empty());
  EXPECT_TRUE(SpeedBalancedHeadGroups(r, 33).members.empty());  // more groups than kv heads
  EXPECT_TRUE(SpeedBalancedHeadGroups(Request("balanced", 3, 100, 8, 8), 4).members.empty());
}

// Explicit groups of unequal worker counts: each group a sequence plan at its local heads, no
// transfer between groups; bad groups make no plan.
// Equal speeds (none given), the same head count in groups of 3 and 2 workers: each group gets
// the sub-plan of its own size (they were once shared by head count and speeds alone).
TEST(HeadsPlanTest, GroupsOfDifferentSizesWithTheSameHeadsGetTheirOwnPlans) {
  const PlanRequest r = Request("heads", 5, 999, 8, 4, {});
  const Plan plan = MakeHeadsPlan(r, HeadGroupSplit{{{0, 1, 2}, {3, 4}}, {2, 2}});
  ASSERT_EQ(plan.num_workers(), 5);
  ASSERT_TRUE(CheckPlan(plan, Shape(r)).ok()) << CheckPlan(plan, Shape(r)).status();
  for (int w = 0; w < 5; ++w) {
    for (const PlanStep& s : plan.workers[w].forward) {
      for (const Transfer& x : s.sends) {
        EXPECT_EQ(plan.workers[x.peer].kv_heads, plan.workers[w].kv_heads) << "worker " << w;
      }
    }
  }
}

TEST(HeadsPlanTest, ExplicitGroupsOfUnequalCounts) {
  const PlanRequest r = Request("heads", 5, 999, 8, 4, {1, 2, 1, 1, 1});
  const Plan plan = MakeHeadsPlan(r, HeadGroupSplit{{{0, 2, 4}, {1, 3}}, {2, 2}});
  ASSERT_EQ(plan.num_workers(), 5);
  ASSERT_TRUE(CheckPlan(plan, Shape(r)).ok()) << CheckPlan(plan, Shape(r)).status();
  for (int w : {0, 2, 4}) EXPECT_EQ(plan.workers[w].kv_heads, (HeadRange{0, 2}));
  for (int w : {1, 3}) EXPECT_EQ(plan.workers[w].kv_heads, (HeadRange{2, 4}));
  int sends = 0;
  for (int w = 0; w < 5; ++w) {
    for (const PlanStep& s : plan.workers[w].forward) {
      for (const Transfer& x : s.sends) {
        ++sends;
        EXPECT_EQ(plan.workers[x.peer].kv_heads, plan.workers[w].kv_heads) << "worker " << w;
      }
    }
  }
  EXPECT_GT(sends, 0);
  for (const HeadGroupSplit& bad :
       {HeadGroupSplit{{{0, 2, 4}, {1, 3}}, {2, 1}},        // heads do not sum to 4
        HeadGroupSplit{{{0, 2, 4}, {1, 3}}, {4, 0}},        // a group without heads
        HeadGroupSplit{{{0, 2, 4}, {1, 3, 4}}, {2, 2}},     // worker 4 twice
        HeadGroupSplit{{{0, 2}, {1, 3}}, {2, 2}},           // worker 4 in no group
        HeadGroupSplit{{{0, 1, 2, 3, 4}, {}}, {2, 2}},      // an empty group
        HeadGroupSplit{{{0, 2, 4}, {1, 3, 5}}, {2, 2}}}) {  // no worker 5
    EXPECT_TRUE(MakeHeadsPlan(r, bad).workers.empty());
  }
}

// A session shape other than the cpu profile's reference: "balanced" ranks the sequence plan
// at the session shape too before a head split may replace it. Short and latency-bound (7
// workers, 2000 rows, 8 heads of 128, full): no sequence plan is within 2%, the head split
// replaces it only because it ranks better there (worse-pass ratio + 0.25 x time / ideal), and
// then it is also the faster plan.
TEST(HeadsPlanTest, BalancedSplitsOnlyWhenItRanksBetterAtTheSessionShape) {
  PlanRequest r = Request("balanced", 7, 2000, 8, 8, {1, 2, 3, 4, 1, 2, 3});
  r.shape = PlanRequest{}.shape;  // the cpu profile's reference shape
  r.causal = false;
  const AttentionShape session{1, 8, 8, 128, DType::kBF16};
  PlanRequest split = r;
  split.session_shape = session;
  absl::StatusOr<Plan> seq = MakePlan(r), heads = MakePlan(split);
  ASSERT_TRUE(seq.ok() && heads.ok());
  CheckOptions check;
  check.shape = session;
  ASSERT_TRUE(CheckPlan(*heads, check).ok()) << CheckPlan(*heads, check).status();
  EXPECT_FALSE(heads->workers[0].kv_heads.empty());
  for (const WorkerPlan& w : seq->workers) EXPECT_TRUE(w.kv_heads.empty());
  const CostParams params = CpuCostParams(session, r.speeds);
  absl::StatusOr<PlanCost> a = EstimateCost(*seq, params), b = EstimateCost(*heads, params);
  ASSERT_TRUE(a.ok() && b.ok());
  auto rank = [](const PlanCost& c) {
    return std::max(c.forward.makespan_ratio, c.backward.makespan_ratio) +
           0.25 * (c.forward.makespan_seconds + c.backward.makespan_seconds) /
               (c.forward.ideal_seconds + c.backward.ideal_seconds);
  };
  EXPECT_GT(std::max(a->forward.makespan_ratio, a->backward.makespan_ratio), 1.02);
  EXPECT_LT(rank(*b), rank(*a));
  EXPECT_LT(b->forward.makespan_seconds + b->backward.makespan_seconds,
            a->forward.makespan_seconds + a->backward.makespan_seconds);
}

TEST(HeadsPlanTest, ValidationNamesTheSessionShape) {
  PlanRequest r = Request("balanced", 3, 100, 4, 2);
  r.session_shape = AttentionShape{1, 6, 4, 64, DType::kBF16};
  const absl::Status bad = ValidatePlanRequest(r);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("session_shape"), absl::string_view::npos) << bad;
  r.session_shape = AttentionShape{1, 8, 4, 64, DType::kBF16};
  EXPECT_TRUE(ValidatePlanRequest(r).ok());
}

// What CheckPlan refuses in head-split plans, each naming the worker or group.
class HeadsCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    r_ = Request("heads", 4, 1000, 8, 2);  // groups {0, 1} heads [0, 1), {2, 3} heads [1, 2)
    absl::StatusOr<Plan> plan = MakePlan(r_);
    ASSERT_TRUE(plan.ok()) << plan.status();
    plan_ = *plan;
    ASSERT_TRUE(CheckPlan(plan_, Shape(r_)).ok()) << CheckPlan(plan_, Shape(r_)).status();
  }
  std::string Error(const Plan& plan) {
    absl::Status s = CheckPlan(plan, Shape(r_)).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    return std::string(s.message());
  }
  PlanRequest r_;
  Plan plan_;
};

TEST_F(HeadsCheckTest, RejectsOverlappingGroups) {
  plan_.workers[2].kv_heads = {0, 2};
  plan_.workers[3].kv_heads = {0, 2};
  EXPECT_NE(Error(plan_).find("overlaps another head group"), std::string::npos);
}

TEST_F(HeadsCheckTest, RejectsHeadsNobodyHolds) {
  plan_.workers[0].kv_heads = {0, 1};
  plan_.workers[1].kv_heads = {0, 1};
  CheckOptions wide = Shape(r_);
  wide.shape.q_heads = 12;
  wide.shape.kv_heads = 3;  // head 2 is nowhere
  const absl::Status s = CheckPlan(plan_, wide).status();
  EXPECT_NE(s.message().find("no worker holds kv heads [2, 3)"), absl::string_view::npos) << s;
}

TEST_F(HeadsCheckTest, RejectsAHeadRangeOutsideTheShape) {
  plan_.workers[3].kv_heads = {1, 3};
  const std::string e = Error(plan_);
  EXPECT_NE(e.find("worker 3: kv_heads [1, 3)"), std::string::npos) << e;
}

TEST_F(HeadsCheckTest, RejectsATransferAcrossGroups) {
  bool moved = false;
  for (PlanStep& s : plan_.workers[0].forward) {
    for (Transfer& x : s.sends) {
      x.peer = 2;
      moved = true;
      break;
    }
    if (moved) break;
  }
  ASSERT_TRUE(moved);
  const std::string e = Error(plan_);
  EXPECT_NE(e.find("worker 0 forward"), std::string::npos) << e;
  EXPECT_NE(e.find("another head group"), std::string::npos) << e;
}

TEST_F(HeadsCheckTest, RejectsAGroupWhoseRowsDoNotCoverTheSequence) {
  plan_.workers[3].owned.back().end -= 1;
  const std::string e = Error(plan_);
  EXPECT_NE(e.find("head group [1, 2)"), std::string::npos) << e;
  EXPECT_NE(e.find("owned ranges"), std::string::npos) << e;
}

TEST_F(HeadsCheckTest, CoverageIsCheckedPerGroup) {
  // Group [1, 2) loses a unit (the other group still computes those rows: not enough).
  for (PlanStep& s : plan_.workers[3].forward) {
    if (!s.computes.empty()) {
      s.computes.pop_back();
      break;
    }
  }
  const std::string e = Error(plan_);
  EXPECT_NE(e.find("head group [1, 2): forward"), std::string::npos) << e;
}

}  // namespace
}  // namespace dfa
