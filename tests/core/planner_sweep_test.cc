// The planner's promise over worker counts, in the cost model with communication (profile cpu,
// 32 x 128 heads, bf16, equal speeds, every plan CheckPlan-valid): a CI-fast sample of what
// `dfa-plan-sweep` prints for P = 1..64 (docs/planner.md, "Makespan / ideal over P = 1..64").
//  - Dense causal and full plans at S = 1024·P: within 1.02 at a sample of the P reached (every
//    P <= 32, and above 32 all but 33, 34, 49 and 63): head groups where the 32 kv heads split
//    over P evenly, shared heads (whole heads per worker plus the rest split by sequence,
//    plan.h "Virtual ranks") elsewhere up to 32, at P = 11 and 21 with straddled shared groups
//    (a worker in two of them), head groups with their own-rows backward tails moved above 32;
//    and never above the whole-heads bound max(1.02, ceil(32 / P) · P / 32) at P = 34, which is
//    not reached (at S = 1024·P every 1-D plan's wire time exceeds its compute:
//    docs/planner.md, "Limits").
//  - Dense causal plans at S = 64K within 1.02 at P spread over 1..64 where reached (every P
//    but 33, 49 and 63).
//  - Long-tailed documents at S = 256K (ParetoDocumentLengths(S, 1.2, 256, 64K, seed 1)) within
//    1.03 at a sample of P where reached (the packed-document plan, document_schedule.cc), and
//    at P = 33 the straddled head groups "balanced" picks there (MakeStraddledHeadsPlan: two
//    groups of 16 heads over 16.5 workers each), made directly (the whole search takes ~16 s).
// Sampled P (the full sweeps take minutes): listed in each test.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/planner/cost_model.h"
#include "core/planner/doc_lengths.h"
#include "core/planner/plan_checker.h"
#include "core/planner/planner.h"
#include "gtest/gtest.h"

namespace dfa {
namespace {

// Forward and backward makespan / ideal of the `balanced` plan `dfa-plan-sweep` makes
// (session_shape set: head groups where no sequence plan is within 2%).
struct Ratios {
  double forward = 1e9, backward = 1e9;
  double worst() const { return std::max(forward, backward); }
};

Ratios SweepRatios(int P, int64_t S, bool causal, const MaskSpec& mask = {}) {
  PlanRequest r;
  r.workers = P;
  r.seq_len = S;
  r.causal = causal;
  r.mask_spec = mask;
  r.mask_spec.causal = causal;
  r.session_shape = r.shape;
  absl::StatusOr<Plan> plan = MakePlan(r);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return {};
  absl::Status check = CheckPlan(*plan, CheckOptions{r.shape}).status();
  EXPECT_TRUE(check.ok()) << "P=" << P << " S=" << S << ": " << check;
  absl::StatusOr<PlanCost> cost = EstimateCost(*plan, CpuCostParams(r.shape));
  EXPECT_TRUE(cost.ok()) << cost.status();
  if (!cost.ok()) return {};
  return {cost->forward.makespan_ratio, cost->backward.makespan_ratio};
}

// The best any plan of whole heads per worker can do at S = 1024·P without a sequence split:
// the busiest worker holds ceil(32 / P) of the 32 heads.
double WholeHeadsBound(int P) {
  const int heads = 32;
  return std::max(1.02, std::ceil(static_cast<double>(heads) / P) * P / heads);
}

TEST(PlannerSweepTest, DenseAt1024TokensPerWorkerIsWithinTwoPercentWhereReached) {
  // Exact head groups (1, 2, 4, 8, 16, 32), shared heads (the others up to 32; 11 and 21
  // straddled), head groups with their own-rows backward tails moved (37).
  for (int P : {1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 16, 17, 18, 21, 24, 27, 32, 37}) {
    for (bool causal : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "P=" << P << (causal ? " causal" : " full"));
      const Ratios r = SweepRatios(P, 1024 * int64_t{P}, causal);
      EXPECT_LE(r.forward, 1.02);
      EXPECT_LE(r.backward, 1.02);
    }
  }
}

TEST(PlannerSweepTest, DenseAt1024TokensPerWorkerStaysWithinTheWholeHeadsBound) {
  // Where 1.02 is not reached (docs/planner.md, "Limits"): within WholeHeadsBound.
  for (int P : {34}) {
    for (bool causal : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "P=" << P << (causal ? " causal" : " full"));
      const Ratios r = SweepRatios(P, 1024 * int64_t{P}, causal);
      EXPECT_LE(r.forward, WholeHeadsBound(P) + 1e-3);
      EXPECT_LE(r.backward, WholeHeadsBound(P) + 1e-3);
    }
  }
}

TEST(PlannerSweepTest, DenseAt64KIsWithinTwoPercentWhereReached) {
  // The P at S = 64K that miss 1.02 (33, 49, 63: docs/planner.md) are not asserted; 26 and 29
  // are shared-heads plans, 35 and 62 head groups with their own-rows backward tails moved
  // (OwnTailBackward: the last partials travel behind compute).
  for (int P : {2, 3, 7, 12, 16, 24, 26, 29, 32, 35, 48, 62}) {
    SCOPED_TRACE(::testing::Message() << "P=" << P);
    EXPECT_LE(SweepRatios(P, 65536, true).worst(), 1.02);
  }
}

TEST(PlannerSweepTest, LongTailedDocumentsAreWithinThreePercentWhereReached) {
  const int64_t S = 262144;
  MaskSpec mask;
  mask.doc_offsets = {DocOffsetsOf(ParetoDocumentLengths(S, 1.2, 256, 65536, 1))};
  // P from the range the packed-document plan reaches with sequence plans alone, and one where
  // head groups (each a masked plan over all rows) carry it.
  for (int P : {2, 5, 9, 13, 17, 21, 25, 32}) {
    SCOPED_TRACE(::testing::Message() << "P=" << P);
    EXPECT_LE(SweepRatios(P, S, true, mask).worst(), 1.03);
  }
}

TEST(PlannerSweepTest, LongTailedDocumentsAtP33AreWithinThreePercentWithStraddledHeadGroups) {
  // 32 heads over 33 workers: whole-worker head groups are 1.031 at best (33 / 32).
  PlanRequest r;
  r.workers = 33;
  r.seq_len = 262144;
  r.mask_spec.causal = true;
  r.mask_spec.doc_offsets = {DocOffsetsOf(ParetoDocumentLengths(r.seq_len, 1.2, 256, 65536, 1))};
  const Plan plan = MakeStraddledHeadsPlan(r, 2);
  ASSERT_FALSE(plan.workers.empty());
  EXPECT_EQ(plan.num_workers(), 34);  // worker 16 in both groups
  absl::Status check = CheckPlan(plan, CheckOptions{r.shape}).status();
  EXPECT_TRUE(check.ok()) << check;
  absl::StatusOr<PlanCost> cost = EstimateCost(plan, CpuCostParams(r.shape));
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_LE(cost->forward.makespan_ratio, 1.03);
  EXPECT_LE(cost->backward.makespan_ratio, 1.03);
}

}  // namespace
}  // namespace dfa
