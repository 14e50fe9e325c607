// CoalesceTransfers merges adjacent K/V and grad_in transfers of a step (and nothing else), and
// the merged plan still passes CheckPlan. Exactness of merged plans is executor_simulation_test's.
#include "core/planner/plan_coalescing.h"

#include <gtest/gtest.h>

#include "core/planner/plan_checker.h"
#include "core/planner/planner.h"

namespace dfa {
namespace {

int Count(const std::vector<Transfer>& list, PlanTensor t) {
  int n = 0;
  for (const Transfer& x : list) n += x.tensor == t;
  return n;
}

Plan Balanced2(int64_t seq) {
  PlanRequest req;
  req.schedule = "zigzag";
  req.workers = 2;
  req.seq_len = seq;
  req.causal = true;
  absl::StatusOr<Plan> plan = MakePlan(req);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

TEST(PlanCoalescingTest, ZigzagChunksTravelAsOneMessage) {
  const Plan plan = Balanced2(16384);
  // Worker 1 owns [4096, 12288) as two chunks: worker 0 receives them in two K/V transfers.
  ASSERT_EQ(plan.workers[0].forward.size(), 2u);
  ASSERT_EQ(Count(plan.workers[0].forward[1].recvs, PlanTensor::kKV), 2);
  const Plan merged = CoalesceTransfers(plan, AttentionShape{1, 32, 32, 128, DType::kBF16});
  ASSERT_TRUE(CheckPlan(merged).ok()) << CheckPlan(merged).status();
  const std::vector<Transfer>& recvs = merged.workers[0].forward[1].recvs;
  ASSERT_EQ(Count(recvs, PlanTensor::kKV), 1);
  for (const Transfer& x : recvs) {
    if (x.tensor == PlanTensor::kKV) {
      EXPECT_EQ(x.rows, (RowRange{4096, 12288}));
    }
  }
  EXPECT_EQ(Count(merged.workers[1].forward[1].sends, PlanTensor::kKV), 1);
  // Worker 0's chunks [0, 4096) and [12288, 16384) are not adjacent: still two messages.
  EXPECT_EQ(Count(merged.workers[1].forward[1].recvs, PlanTensor::kKV), 2);
  // Computes are untouched; the partials of merged buffers travel merged.
  for (size_t w = 0; w < plan.workers.size(); ++w) {
    for (size_t t = 0; t < plan.workers[w].backward.size(); ++t) {
      const PlanStep& a = plan.workers[w].backward[t];
      const PlanStep& b = merged.workers[w].backward[t];
      EXPECT_EQ(a.computes, b.computes);
      for (PlanTensor p : {PlanTensor::kDqPartial, PlanTensor::kDkvPartial}) {
        EXPECT_LE(Count(b.sends, p), Count(a.sends, p));
      }
    }
  }
}

TEST(PlanCoalescingTest, BatchAboveOneIsLeftAlone) {
  const Plan plan = Balanced2(1024);
  const Plan same = CoalesceTransfers(plan, AttentionShape{2, 4, 4, 64, DType::kBF16});
  for (size_t w = 0; w < plan.workers.size(); ++w) {
    for (size_t t = 0; t < plan.workers[w].forward.size(); ++t) {
      EXPECT_EQ(plan.workers[w].forward[t].recvs, same.workers[w].forward[t].recvs);
    }
  }
}

}  // namespace
}  // namespace dfa
