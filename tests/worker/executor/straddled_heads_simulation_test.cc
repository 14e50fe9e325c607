// Straddled head groups (MakeStraddledHeadsPlan, core/planner/straddled_heads_schedule.cc; plan.h
// "Virtual ranks": a worker on the boundary of two head groups runs a rank in each) run by the
// simulator, one executor per rank, against the fp64 reference, forward and backward: two
// groups at odd P (the mirrored half-and-half straddler "balanced" tries), three and four
// groups (straddlers with unequal shares, the second group's plan spread over the first's
// steps), dense causal and full, and packed documents with a 1-token document.
#include <random>
#include <tuple>
#include <vector>

#include "core/planner/doc_lengths.h"
#include "core/planner/plan_checker.h"
#include "core/planner/planner.h"
#include "gtest/gtest.h"
#include "tests/worker/executor/simulation_test_util.h"
#include "worker/executor/simulator.h"

namespace dfa {
namespace {

using testing_util::ExpectMatchesMaskedReference;
using testing_util::Random;

// How many workers run two ranks.
int StraddlingWorkers(const Plan& plan) {
  std::vector<int> ranks(plan.physical_workers(), 0);
  for (int r = 0; r < plan.num_workers(); ++r) ++ranks[plan.WorkerOfRank(r)];
  int n = 0;
  for (int k : ranks) n += k > 1;
  return n;
}

class StraddledHeadsSimulationTest
    : public ::testing::TestWithParam<std::tuple<int, int, bool, bool>> {};

TEST_P(StraddledHeadsSimulationTest, MatchesTheReference) {
  const auto [P, groups, causal, documents] = GetParam();
  // GQA: 24 query heads over 12 kv heads (even splits into 2, 3 and 4 groups).
  const AttentionShape shape{1, 24, 12, 8, DType::kF32};
  const int64_t S = 19 * P + 3;
  MaskSpec mask;
  mask.causal = causal;
  if (documents) mask.doc_offsets = {DocOffsetsOf({5, 11 * P, 1, 3 * P, S - 14 * P - 6})};
  PlanRequest r;
  r.workers = P;
  r.seq_len = S;
  r.causal = causal;
  r.shape = shape;
  r.mask_spec = mask;
  const Plan plan = MakeStraddledHeadsPlan(r, groups);
  ASSERT_FALSE(plan.workers.empty());
  EXPECT_EQ(plan.physical_workers(), P);
  EXPECT_EQ(plan.num_workers(), P + StraddlingWorkers(plan));
  EXPECT_GE(StraddlingWorkers(plan), 1);
  CheckOptions check;
  check.shape = shape;
  const absl::StatusOr<CheckReport> report = CheckPlan(plan, check);
  ASSERT_TRUE(report.ok()) << report.status();
  std::mt19937 rng(29 + static_cast<unsigned>(P * 4 + groups));
  const size_t nq = size_t(S) * shape.q_heads * shape.head_dim;
  const size_t nk = size_t(S) * shape.kv_heads * shape.head_dim;
  SimulationInputs in{Random(nq, rng), Random(nk, rng), Random(nk, rng), Random(nq, rng)};
  SimulationOptions opt;
  opt.step_tokens = 5;
  absl::StatusOr<SimulationResult> sim = Simulate(plan, shape, in, opt);
  ASSERT_TRUE(sim.ok()) << sim.status();
  ExpectMatchesMaskedReference(*sim, in, shape, mask, S);
}

INSTANTIATE_TEST_SUITE_P(TwoGroupsOddP, StraddledHeadsSimulationTest,
                         ::testing::Combine(::testing::Values(3, 5), ::testing::Values(2),
                                            ::testing::Bool(), ::testing::Bool()));
INSTANTIATE_TEST_SUITE_P(UnequalShares, StraddledHeadsSimulationTest,
                         ::testing::Combine(::testing::Values(5), ::testing::Values(3, 4),
                                            ::testing::Values(true), ::testing::Bool()));

TEST(StraddledHeadsPlanTest, RefusesWhatIsNotAStraddle) {
  PlanRequest r;
  r.workers = 4;
  r.seq_len = 400;
  r.shape = AttentionShape{1, 8, 8, 8, DType::kF32};
  EXPECT_TRUE(MakeStraddledHeadsPlan(r, 2).workers.empty());  // 4 workers, 2 groups: whole
  EXPECT_TRUE(MakeStraddledHeadsPlan(r, 1).workers.empty());
  EXPECT_TRUE(MakeStraddledHeadsPlan(r, 9).workers.empty());  // more groups than heads
  r.workers = 5;
  EXPECT_FALSE(MakeStraddledHeadsPlan(r, 2).workers.empty());
}

}  // namespace
}  // namespace dfa
