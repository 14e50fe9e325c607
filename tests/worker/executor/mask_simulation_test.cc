// Masked plans (packed documents, sliding windows) run by the executor in the simulator: every
// schedule the planner makes under a MaskSpec, P = 1..5, forward and backward against the fp64
// reference reading the MaskSpec's definition. Exercises the executor's kIntervals path: units
// called with the interval arrays at global positions, fusion only over one global range per
// side, calls with no visible pair skipped, FLOPs counted on visible pairs.
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/planner/plan_checker.h"
#include "core/planner/plan_coalescing.h"
#include "core/planner/planner.h"
#include "core/planner/worker_memory.h"
#include "gtest/gtest.h"
#include "tests/worker/executor/simulation_test_util.h"
#include "worker/executor/simulator.h"

namespace dfa {
namespace {

using testing_util::ExpectMatchesMaskedReference;
using testing_util::Random;

struct MaskCase {
  const char* name;
  bool causal;
  std::vector<int64_t> lengths;  // documents (empty: one)
  int64_t left, right;
};

const MaskCase kCases[] = {
    {"docs_causal", true, {1, 70, 1, 1, 90, 37}, -1, -1},
    {"docs_window_causal", true, {33, 100, 67}, 25, -1},
    {"window_causal", true, {}, 40, -1},
    {"docs_window_full", false, {120, 1, 79}, 16, 9},
    {"docs_full", false, {50, 150}, -1, -1},
};
constexpr int64_t kSeq = 200;

using Param = std::tuple<std::string, int, int>;  // schedule, P, case
class MaskSimulationTest : public ::testing::TestWithParam<Param> {};

TEST_P(MaskSimulationTest, MatchesReferenceUnderTheMask) {
  const auto& [schedule, P, ci] = GetParam();
  const MaskCase& c = kCases[ci];
  MaskSpec mask;
  mask.causal = c.causal;
  mask.window_left = c.left;
  mask.window_right = c.right;
  if (!c.lengths.empty()) {
    std::vector<int64_t> off{0};
    for (int64_t l : c.lengths) off.push_back(off.back() + l);
    mask.doc_offsets = {off};
  }
  ASSERT_TRUE(ValidateMask(mask, 1, kSeq).ok());
  const AttentionShape shape{1, 4, 2, 16, DType::kF32};
  PlanRequest req;
  req.schedule = schedule;
  req.workers = P;
  req.seq_len = kSeq;
  req.causal = c.causal;
  req.mask_spec = mask;
  if (schedule == "heads") req.shape = shape;
  absl::StatusOr<Plan> plan = MakePlan(req);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->mask(), MaskKind::kIntervals);
  CheckOptions check;
  check.shape = shape;
  ASSERT_TRUE(CheckPlan(*plan, check).ok()) << CheckPlan(*plan, check).status();
  *plan = CoalesceTransfers(*plan, shape);

  std::mt19937 rng(77 + P + 10 * ci);
  const size_t nq = size_t(kSeq) * shape.q_heads * shape.head_dim;
  const size_t nk = size_t(kSeq) * shape.kv_heads * shape.head_dim;
  SimulationInputs in{Random(nq, rng), Random(nk, rng), Random(nk, rng), Random(nq, rng)};
  SimulationOptions opt;
  opt.step_tokens = 7;
  // Receives cut to a quarter of the shard per step (CutTransfers): parts of units the mask
  // hides are dropped, and the cut plan passes CheckPlan under the mask.
  opt.transfer_cut = TransferCut{4, 2, 1 << 20};
  {
    const absl::StatusOr<CheckReport> cut_ok =
        CheckPlan(CutTransfers(*plan, opt.transfer_cut), check);
    ASSERT_TRUE(cut_ok.ok()) << cut_ok.status();
  }
  absl::StatusOr<SimulationResult> sim = Simulate(*plan, shape, in, opt);
  ASSERT_TRUE(sim.ok()) << sim.status();

  ExpectMatchesMaskedReference(*sim, in, shape, mask, kSeq);
  if (::testing::Test::HasFatalFailure()) return;

  // FLOPs on visible pairs: the workers' forward counts sum to 4·B·Hq·D·pairs.
  double flops = 0;
  for (const PassStats& s : sim->forward) flops += s.flops;
  const double pairs = static_cast<double>(VisiblePairs(mask, 0, kSeq, 0, kSeq, 0, kSeq));
  EXPECT_NEAR(flops, 4.0 * shape.q_heads * shape.head_dim * pairs, 1e-6 * flops);
}

std::string Name(const ::testing::TestParamInfo<Param>& info) {
  return std::get<0>(info.param) + "_P" + std::to_string(std::get<1>(info.param)) + "_" +
         kCases[std::get<2>(info.param)].name;
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, MaskSimulationTest,
    ::testing::Combine(::testing::Values("ring", "zigzag", "balanced", "heads"),
                       ::testing::Range(1, 6), ::testing::Range(0, 5)),
    Name);
// distflash pairs workers: even P only.
INSTANTIATE_TEST_SUITE_P(DistFlash, MaskSimulationTest,
                         ::testing::Combine(::testing::Values("distflash"),
                                            ::testing::Values(2, 4), ::testing::Range(0, 5)),
                         Name);

}  // namespace
}  // namespace dfa
