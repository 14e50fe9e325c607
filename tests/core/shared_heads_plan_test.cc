// Shared-heads plans (plan.h "Virtual ranks"): CheckPlan's rank_workers checks, the cost model's
// lock-step workers, and "balanced" choosing them only where head groups are tried
// (session_shape set). Their exactness in the simulator: tests/worker/executor/
// shared_heads_simulation_test.cc.
#include <numeric>

#include "core/planner/cost_model.h"
#include "core/planner/plan_checker.h"
#include "core/planner/planner.h"
#include "gtest/gtest.h"

namespace dfa {
namespace {

// "balanced" at P workers, S = 1024 P, the reference 32 x 128 heads as the session's.
PlanRequest DenseRequest(int P) {
  PlanRequest r;
  r.workers = P;
  r.seq_len = 1024 * P;
  r.session_shape = r.shape;
  return r;
}

TEST(SharedHeadsPlanTest, BalancedAtP6GivesEveryWorkerWholeHeadsAndAShareOfTheRest) {
  const PlanRequest r = DenseRequest(6);
  absl::StatusOr<Plan> plan = MakePlan(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_FALSE(plan->rank_workers.empty());
  EXPECT_EQ(plan->physical_workers(), 6);
  CheckOptions check;
  check.shape = r.shape;
  ASSERT_TRUE(CheckPlan(*plan, check).ok()) << CheckPlan(*plan, check).status();
  // Each worker: one rank of 5 whole heads over all rows, one rank of the 2 shared heads.
  std::vector<int> whole(6, 0), shared(6, 0);
  for (int rank = 0; rank < plan->num_workers(); ++rank) {
    const WorkerPlan& w = plan->workers[rank];
    const bool all_rows = w.owned.size() == 1 && w.owned[0].size() == r.seq_len;
    (all_rows ? whole : shared)[plan->WorkerOfRank(rank)] += w.kv_heads.size();
  }
  for (int w = 0; w < 6; ++w) {
    EXPECT_EQ(whole[w], 5) << "worker " << w;
    EXPECT_GE(shared[w], 1) << "worker " << w;
  }
  absl::StatusOr<PlanCost> cost = EstimateCost(*plan, CpuCostParams(r.shape));
  ASSERT_TRUE(cost.ok()) << cost.status();
  ASSERT_EQ(cost->forward.workers.size(), 6u);
  EXPECT_LE(cost->forward.makespan_ratio, 1.02);
  EXPECT_LE(cost->backward.makespan_ratio, 1.02);
  // The shared ranks exchange K/V; every worker's work is its share (5 1/3 heads of 32).
  for (const WorkerCost& wc : cost->forward.workers) {
    EXPECT_GT(wc.bytes_received, 0);
    EXPECT_NEAR(wc.busy_seconds, cost->forward.ideal_seconds, 1e-3 * cost->forward.ideal_seconds);
  }
}

TEST(SharedHeadsPlanTest, SessionsWithoutSessionShapeGetNoRanks) {
  PlanRequest r = DenseRequest(6);
  r.session_shape = PlanRequest{}.session_shape;
  absl::StatusOr<Plan> plan = MakePlan(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->rank_workers.empty());
}

// A worker's ranks run one after another (lock-step): all ranks on one worker cost their summed
// compute, and the speeds are per worker.
TEST(SharedHeadsPlanTest, RanksOnOneWorkerAreSerialised) {
  const PlanRequest r = DenseRequest(6);
  absl::StatusOr<Plan> plan = MakePlan(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const CostParams params = CpuCostParams(r.shape);
  absl::StatusOr<PlanCost> spread = EstimateCost(*plan, params);
  ASSERT_TRUE(spread.ok()) << spread.status();
  Plan one = *plan;
  std::fill(one.rank_workers.begin(), one.rank_workers.end(), 0);
  ASSERT_TRUE(CheckPlan(one, CheckOptions{r.shape}).ok());
  absl::StatusOr<PlanCost> serial = EstimateCost(one, params);
  ASSERT_TRUE(serial.ok()) << serial.status();
  ASSERT_EQ(serial->forward.workers.size(), 1u);
  // One worker does all the work: 6 times the 6-worker ideal.
  EXPECT_NEAR(serial->forward.workers[0].busy_seconds, 6 * spread->forward.ideal_seconds,
              1e-6 * spread->forward.ideal_seconds);
  EXPECT_GE(serial->forward.makespan_seconds, serial->forward.workers[0].busy_seconds);
  // Speeds count workers, not ranks.
  absl::StatusOr<PlanCost> wrong =
      EstimateCost(*plan, CpuCostParams(r.shape, std::vector<double>(plan->num_workers(), 1.0)));
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("speeds: 12 values for 6 workers"), std::string::npos)
      << wrong.status();
}

TEST(SharedHeadsPlanTest, CheckPlanRefusesBadRankWorkers) {
  const PlanRequest r = DenseRequest(6);
  absl::StatusOr<Plan> plan = MakePlan(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const CheckOptions check{r.shape};
  auto message = [&](const Plan& p) {
    absl::StatusOr<CheckReport> report = CheckPlan(p, check);
    return report.ok() ? std::string("OK") : std::string(report.status().message());
  };
  Plan short_map = *plan;
  short_map.rank_workers.pop_back();
  EXPECT_NE(message(short_map).find("rank_workers: 11 entries for 12 ranks"), std::string::npos)
      << message(short_map);
  Plan negative = *plan;
  negative.rank_workers[3] = -1;
  EXPECT_NE(message(negative).find("rank_workers[3] = -1"), std::string::npos) << message(negative);
  Plan gap = *plan;  // worker 0's ranks moved to worker 6: worker 0 runs none
  for (int& w : gap.rank_workers) w = w == 0 ? 6 : w;
  EXPECT_NE(message(gap).find("rank_workers: worker 0 runs no rank"), std::string::npos)
      << message(gap);
}

// Each split's plan passes CheckPlan and holds every worker's share of the work within 1%.
TEST(SharedHeadsPlanTest, EverySplitIsValidAndBalancedInCompute) {
  for (int P : {3, 6, 7, 11, 17, 37}) {
    const PlanRequest r = DenseRequest(P);
    PlanRequest heads = r;
    heads.session_shape = PlanRequest{}.session_shape;
    for (const SharedHeadsSplit& split : SharedHeadsSplits(heads)) {
      const Plan plan = MakeSharedHeadsPlan(heads, split);
      ASSERT_FALSE(plan.workers.empty()) << "P " << P;
      ASSERT_TRUE(CheckPlan(plan, CheckOptions{r.shape}).ok())
          << "P " << P << ": " << CheckPlan(plan, CheckOptions{r.shape}).status();
      absl::StatusOr<PlanCost> cost = EstimateCost(plan, CpuCostParams(r.shape));
      ASSERT_TRUE(cost.ok()) << cost.status();
      EXPECT_LE(cost->forward.compute_makespan_ratio, 1.0 + 0.01 + 1e-3) << "P " << P;
    }
  }
}

}  // namespace
}  // namespace dfa
