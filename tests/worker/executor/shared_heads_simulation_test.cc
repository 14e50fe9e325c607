// Shared-heads plans (plan.h "Virtual ranks": a worker runs a rank of whole heads and a rank of
// the heads shared by sequence) run by the simulator, one executor per rank, against the fp64
// reference, forward and backward: every split SharedHeadsSplits offers at P = 2..5 (one-worker
// whole groups with their computes cut per step, whole groups of two workers whose sequence
// plan is spread over the shared plan's steps, one and several shared groups, straddled shared
// groups: a worker in two of them, three ranks), causal and full, and the plan "balanced" picks
// at P = 6, S = 6144.
#include <algorithm>
#include <cmath>
#include <random>
#include <tuple>

#include "core/planner/plan_checker.h"
#include "core/planner/planner.h"
#include "gtest/gtest.h"
#include "kernels/reference/reference_attention.h"
#include "tests/worker/executor/simulation_test_util.h"
#include "worker/executor/simulator.h"

namespace dfa {
namespace {

using testing_util::HostView;
using testing_util::Random;
using testing_util::ReferenceProblem;
using testing_util::WorstError;

// Simulates `plan` at `shape` and compares it with the fp64 reference; returns the bytes its
// forward sent.
int64_t ExpectExact(const Plan& plan, const AttentionShape& shape, int64_t S, bool causal) {
  CheckOptions check;
  check.shape = shape;
  const absl::StatusOr<CheckReport> report = CheckPlan(plan, check);
  EXPECT_TRUE(report.ok()) << report.status();
  if (!report.ok()) return 0;
  std::mt19937 rng(77 + static_cast<unsigned>(S));
  const size_t nq = size_t(shape.batch) * S * shape.q_heads * shape.head_dim;
  const size_t nk = size_t(shape.batch) * S * shape.kv_heads * shape.head_dim;
  SimulationInputs in{Random(nq, rng), Random(nk, rng), Random(nk, rng), Random(nq, rng)};
  SimulationOptions opt;
  opt.step_tokens = 5;
  absl::StatusOr<SimulationResult> sim = Simulate(plan, shape, in, opt);
  EXPECT_TRUE(sim.ok()) << sim.status();
  if (!sim.ok()) return 0;
  reference::Problem pr =
      ReferenceProblem(in, shape, shape.batch, S, causal ? MaskKind::kCausal : MaskKind::kFull);
  absl::StatusOr<reference::ForwardResult> ref = reference::Forward(pr);
  EXPECT_TRUE(ref.ok()) << ref.status();
  absl::StatusOr<reference::Gradients> grads =
      reference::Backward(pr, HostView(in.dout, shape.batch, S, shape.q_heads, shape.head_dim));
  EXPECT_TRUE(grads.ok()) << grads.status();
  if (!ref.ok() || !grads.ok()) return 0;
  EXPECT_LE(WorstError(sim->out, ref->out, 1e-5, 1e-4), 1.0) << "output";
  EXPECT_LE(WorstError(sim->lse, ref->lse, 1e-5, 1e-4), 1.0) << "lse";
  EXPECT_LE(WorstError(sim->dq, grads->dq, 1e-4, 1e-3), 1.0) << "dq";
  EXPECT_LE(WorstError(sim->dk, grads->dk, 1e-4, 1e-3), 1.0) << "dk";
  EXPECT_LE(WorstError(sim->dv, grads->dv, 1e-4, 1e-3), 1.0) << "dv";
  int64_t sent = 0;
  for (const PassStats& s : sim->forward) sent += s.bytes_sent;
  return sent;
}

// Some worker runs two ranks.
bool SomeWorkerRunsTwoRanks(const Plan& plan) {
  std::vector<int> ranks(plan.physical_workers(), 0);
  for (int r = 0; r < plan.num_workers(); ++r) ++ranks[plan.WorkerOfRank(r)];
  for (int n : ranks) {
    if (n > 1) return true;
  }
  return false;
}

class SharedHeadsSimulationTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(SharedHeadsSimulationTest, EverySplitMatchesTheReference) {
  const auto [P, causal] = GetParam();
  // GQA: 16 query heads over 8 kv heads; 23 rows per worker, S not a multiple of P.
  const AttentionShape shape{1, 16, 8, 8, DType::kF32};
  const int64_t S = 23 * P + 2;
  PlanRequest req;
  req.workers = P;
  req.seq_len = S;
  req.causal = causal;
  req.shape = shape;
  const std::vector<SharedHeadsSplit> splits = SharedHeadsSplits(req);
  ASSERT_FALSE(splits.empty()) << "P " << P;
  bool whole_pair = false, several_shared = false, straddled = false;
  for (const SharedHeadsSplit& split : splits) {
    const Plan plan = MakeSharedHeadsPlan(req, split);
    ASSERT_FALSE(plan.workers.empty()) << "P " << P;
    EXPECT_EQ(plan.physical_workers(), P);
    EXPECT_TRUE(SomeWorkerRunsTwoRanks(plan));
    for (const std::vector<int>& m : split.groups.members) whole_pair |= m.size() > 1;
    several_shared |= split.shared.members.size() > 1;
    straddled |= !split.shared_work.empty();
    SCOPED_TRACE(testing::Message() << "P " << P << " whole groups " << split.groups.members.size()
                                    << " shared groups " << split.shared.members.size());
    // The shared heads' ranks exchange K/V (and the backward's partials).
    EXPECT_GT(ExpectExact(plan, shape, S, causal), 0);
  }
  if (P >= 3) {
    EXPECT_TRUE(whole_pair) << "P " << P;
  }
  if (P == 4) {  // 4 whole heads, 2 + 2 shared
    EXPECT_TRUE(several_shared) << "P " << P;
  }
  if (P == 3 || P == 5) {  // 8 heads over 3 or 5 workers: straddled shared groups
    EXPECT_TRUE(straddled) << "P " << P;
  }
}

INSTANTIATE_TEST_SUITE_P(P2To5, SharedHeadsSimulationTest,
                         ::testing::Combine(::testing::Values(2, 3, 4, 5), ::testing::Bool()));

// What "balanced" returns at P = 6, S = 6144 with the session's 32 heads (each worker 5 whole
// heads, the last 2 shared) runs exactly too; simulated at 8 of the 128 dims per head.
TEST(SharedHeadsSimulationBalancedTest, BalancedPickAtP6MatchesTheReference) {
  PlanRequest req;
  req.workers = 6;
  req.seq_len = 6144;
  req.session_shape = req.shape;
  absl::StatusOr<Plan> plan = MakePlan(req);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_FALSE(plan->rank_workers.empty()) << "expected a shared-heads plan";
  EXPECT_TRUE(SomeWorkerRunsTwoRanks(*plan));
  // Its split (5 whole heads per worker) at S = 138 and 8 dims per head, simulated in seconds.
  int whole_ranks = 0;
  for (const WorkerPlan& w : plan->workers) {
    const bool all_rows = w.owned.size() == 1 && w.owned[0].size() == req.seq_len;
    whole_ranks += all_rows && w.kv_heads.size() == 5;
  }
  EXPECT_EQ(whole_ranks, 6);
  const AttentionShape small{1, 32, 32, 8, DType::kF32};
  PlanRequest small_req = req;
  small_req.seq_len = 6 * 23;
  small_req.shape = small;
  small_req.session_shape = small;
  for (const SharedHeadsSplit& s : SharedHeadsSplits(small_req)) {
    if (s.groups.members.size() != 6 || s.groups.kv_heads[0] != 5) continue;
    const Plan small_plan = MakeSharedHeadsPlan(small_req, s);
    ASSERT_FALSE(small_plan.workers.empty());
    EXPECT_GT(ExpectExact(small_plan, small, small_req.seq_len, true), 0);
    return;
  }
  FAIL() << "no split with 5 whole heads per worker at P = 6";
}

}  // namespace
}  // namespace dfa
