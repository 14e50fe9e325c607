// OwnTailBackward (core/planner/plan_builder.h, own_tail.cc): a share of each worker's backward
// work on its own rows moved to the step whose partials end the pass. The moved plans of ring,
// zigzag and balanced (the derived and the K/V-stationary backwards), causal and full, dense and
// with packed documents, pass CheckPlan and run exactly in the executor's simulator against the
// fp64 reference; the moved computes sit after each worker's last partial-producing compute.
#include <random>
#include <string>
#include <vector>

#include "core/planner/doc_lengths.h"
#include "core/planner/plan_builder.h"
#include "core/planner/plan_checker.h"
#include "core/planner/planner.h"
#include "gtest/gtest.h"
#include "tests/worker/executor/simulation_test_util.h"
#include "worker/executor/simulator.h"

namespace dfa {
namespace {

using testing_util::ExpectMatchesMaskedReference;
using testing_util::Random;

// The last backward step with computes, per worker.
std::vector<int> LastComputeSteps(const Plan& plan) {
  std::vector<int> last;
  for (const WorkerPlan& w : plan.workers) {
    int t = -1;
    for (size_t s = 0; s < w.backward.size(); ++s) {
      if (!w.backward[s].computes.empty()) t = static_cast<int>(s);
    }
    last.push_back(t);
  }
  return last;
}

TEST(OwnTailTest, MovedPlansMatchTheReference) {
  const AttentionShape shape{1, 4, 2, 8, DType::kF32};
  // ("kvs": the striped ring with the K/V-stationary backward, dQ partials to the owners.)
  for (const std::string schedule : {"ring", "zigzag", "balanced", "kvs"}) {
    for (int P = 2; P <= 4; ++P) {
      const int64_t S = 40 * P + 6;
      for (bool causal : {true, false}) {
        for (bool documents : {false, true}) {
          MaskSpec mask;
          mask.causal = causal;
          if (documents) mask.doc_offsets = {DocOffsetsOf({7, 25 * P, 1, S - 25 * P - 8})};
          PlanRequest r;
          r.schedule = schedule == "kvs" ? "balanced" : schedule;
          r.workers = P;
          r.seq_len = S;
          r.causal = causal;
          r.shape = shape;
          r.mask_spec = mask;
          absl::StatusOr<Plan> made = schedule == "kvs"
                                          ? MakeStripedRingPlan(r, std::vector<int>(P, 2), true)
                                          : MakePlan(r);
          ASSERT_TRUE(made.ok()) << made.status();
          ASSERT_FALSE(made->workers.empty());
          const std::vector<int> before = LastComputeSteps(*made);
          for (double fraction : {0.25, 1.0}) {
            SCOPED_TRACE(::testing::Message()
                         << schedule << " P=" << P << (causal ? " causal" : " full")
                         << (documents ? " documents" : "") << " fraction " << fraction);
            Plan plan = *made;
            planner_internal::OwnTailBackward(plan, fraction);
            // Every worker with own-rows work now computes after its former last compute.
            const std::vector<int> after = LastComputeSteps(plan);
            int moved = 0;
            for (int w = 0; w < P; ++w) moved += after[w] == before[w] + 1;
            EXPECT_GE(moved, 1);
            CheckOptions check;
            check.shape = shape;
            const absl::StatusOr<CheckReport> report = CheckPlan(plan, check);
            ASSERT_TRUE(report.ok()) << report.status();
            std::mt19937 rng(53 + P);
            const size_t nq = size_t(S) * shape.q_heads * shape.head_dim;
            const size_t nk = size_t(S) * shape.kv_heads * shape.head_dim;
            SimulationInputs in{Random(nq, rng), Random(nk, rng), Random(nk, rng), Random(nq, rng)};
            absl::StatusOr<SimulationResult> sim = Simulate(plan, shape, in);
            ASSERT_TRUE(sim.ok()) << sim.status();
            ExpectMatchesMaskedReference(*sim, in, shape, mask, S);
          }
        }
      }
    }
  }
}

TEST(OwnTailTest, LeavesPlansWithVirtualRanksAlone) {
  PlanRequest r;
  r.workers = 3;
  r.seq_len = 120;
  r.shape = AttentionShape{1, 8, 8, 8, DType::kF32};
  const Plan plan = MakeStraddledHeadsPlan(r, 2);
  ASSERT_FALSE(plan.rank_workers.empty());
  Plan moved = plan;
  planner_internal::OwnTailBackward(moved, 0.5);
  EXPECT_EQ(LastComputeSteps(moved), LastComputeSteps(plan));
}

}  // namespace
}  // namespace dfa
