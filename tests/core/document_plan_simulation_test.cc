// The packed-document plan (MakeDocumentPlan, core/planner/document_schedule.cc) run by the
// executor in the simulator: long documents striped over their own workers, short ones packed
// whole or cut (over the workers outside the rings, the ring workers too, inside groups, or
// binned: keys in pieces on a ring's steps), the derived and the
// K/V-stationary backwards, forward and backward against the fp64 reference under the mask.
#include <cmath>
#include <random>
#include <vector>

#include "core/planner/doc_lengths.h"
#include "core/planner/plan_checker.h"
#include "core/planner/plan_coalescing.h"
#include "core/planner/planner.h"
#include "gtest/gtest.h"
#include "tests/worker/executor/simulation_test_util.h"
#include "worker/executor/simulator.h"

namespace dfa {
namespace {

using testing_util::ExpectMatchesMaskedReference;
using testing_util::Random;

TEST(DocumentPlanSimulationTest, MatchesReferenceUnderTheMask) {
  const AttentionShape shape{1, 4, 2, 16, DType::kF32};
  for (int P = 2; P <= 5; ++P) {
    const int64_t S = 60 * P + 40;
    // A long document over several workers, a second one, short ones of 1..13 tokens.
    std::vector<int64_t> lengths = {9, 30 * P, 3, 12 * P + 7};
    for (int64_t left = S - 30 * P - 12 * P - 19, k = 0; left > 0; ++k) {
      const int64_t pattern[] = {1, 7, 3, 13, 2, 5};
      lengths.push_back(std::min(left, pattern[k % 6]));
      left -= lengths.back();
    }
    for (bool causal : {true, false}) {
      MaskSpec mask;
      mask.causal = causal;
      mask.doc_offsets = {DocOffsetsOf(lengths)};
      PlanRequest r;
      r.workers = P;
      r.seq_len = S;
      r.causal = causal;
      r.mask_spec = mask;
      r.shape = shape;
      // Short documents packed, grouped, packed over the ring workers too, binned.
      for (int placement = 0; placement < 4; ++placement) {
        for (bool kvs : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "P=" << P << (causal ? " causal" : " full")
                                            << " placement " << placement << " kvs " << kvs);
          Plan plan = MakeDocumentPlan(r, DocumentOptions{1.0, 2, 0, 0.5, kvs, placement == 1,
                                                          placement == 2, placement == 3});
          ASSERT_FALSE(plan.workers.empty());
          if (!HasBackwardSteps(plan)) DeriveBackwardSteps(plan);
          CheckOptions check;
          check.shape = shape;
          ASSERT_TRUE(CheckPlan(plan, check).ok()) << CheckPlan(plan, check).status();
          plan = CoalesceTransfers(plan, shape);
          std::mt19937 rng(91 + P);
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

}  // namespace
}  // namespace dfa
