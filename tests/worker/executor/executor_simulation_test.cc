// Every schedule, run by the simulator (P threads, PlanExecutor + InprocTransport + CPU
// backend), matches single-device fp64 attention, forward and backward: P = 1..8 (odd too),
// sequence lengths not divisible by P, GQA/MQA, batch > 1, causal and full; "heads" splits the
// heads over head groups (each worker simulated with its head slice); "balanced_heads" runs the
// balanced search's head groups of unequal worker counts.
#include <cmath>
#include <random>
#include <string>
#include <tuple>

#include "core/planner/plan_coalescing.h"
#include "core/planner/plan_checker.h"
#include "core/planner/plan_builder.h"
#include "core/planner/planner.h"
#include "core/planner/worker_memory.h"
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

using Param = std::tuple<std::string, int, bool>;  // schedule, workers, causal

class SimulationTest : public ::testing::TestWithParam<Param> {};

TEST_P(SimulationTest, MatchesSingleDeviceAttention) {
  const auto [schedule, P, causal] = GetParam();
  if (schedule == "distflash" && P % 2 != 0) GTEST_SKIP() << "distflash is defined for even P";
  AttentionShape shape;
  shape.batch = P % 2 + 1;                 // batch 2 for odd P: exercises strided packing
  shape.q_heads = 4;
  shape.kv_heads = P % 3 == 0 ? 1 : 2;     // MQA and GQA
  shape.head_dim = 8;
  shape.dtype = DType::kF32;
  const int64_t S = 9 * P + 7;              // not a multiple of P (except P = 7: 70)
  PlanRequest req;
  req.schedule = schedule;
  req.workers = P;
  req.seq_len = S;
  req.causal = causal;
  if ((schedule == "balanced" || schedule == "balanced_gpu") && P >= 3) {  // unequal speeds too
    for (int w = 0; w < P; ++w) req.speeds.push_back(1.0 + 0.5 * (w % 3));
  }
  if (schedule == "heads") {
    // Head groups: q_heads 8 over kv_heads 2, 4 or 8 (g = 2 groups of P/2 at P = 2, 4; 3 groups
    // with 2, 1, 1 heads at P = 3, 6; 4 groups at P = 8; every worker its own group at P = 5,
    // 7), unequal speeds from P = 3 (heads follow the groups' speeds).
    static constexpr int kKvHeads[] = {0, 2, 2, 4, 2, 8, 4, 8, 4};
    shape.q_heads = 8;
    shape.kv_heads = kKvHeads[P];
    req.shape =
        AttentionShape{shape.batch, shape.q_heads, shape.kv_heads, shape.head_dim, shape.dtype};
    if (P >= 3) {
      for (int w = 0; w < P; ++w) req.speeds.push_back(1.0 + 0.5 * (w % 3));
    }
  }
  if (schedule == "heads_dealt") {
    // Head groups of workers dealt by speed (slow first half, fast second half: consecutive
    // groups would put the slow ones together), 2 kv heads, even P.
    if (P % 2 != 0) GTEST_SKIP() << "two equal-speed-sum groups need even P";
    req.schedule = "heads";
    shape.q_heads = 8;
    shape.kv_heads = 2;
    req.shape =
        AttentionShape{shape.batch, shape.q_heads, shape.kv_heads, shape.head_dim, shape.dtype};
    for (int w = 0; w < P; ++w) req.speeds.push_back(w < P / 2 ? 1.0 : 2.0);
  }
  if (schedule == "balanced_gpu") {  // the GPU profile's search (least true time)
    req.schedule = "balanced";
    req.profile = "gpu";
    req.shape =
        AttentionShape{shape.batch, shape.q_heads, shape.kv_heads, shape.head_dim, shape.dtype};
  }
  absl::StatusOr<Plan> plan;
  if (schedule == "striped" || schedule == "striped_bb") {
    // The striped ring with unequal speeds and 1-3 pieces per worker; striped_bb: its backward's
    // transfers then spread by BalanceTransfers (grad_in earlier, dQ/dK/dV partials later).
    req.schedule = "balanced";
    std::vector<int> pieces;
    for (int w = 0; w < P; ++w) {
      req.speeds.push_back(1.0 + 0.5 * (w % 3));
      pieces.push_back(1 + w % 3);
    }
    plan = MakeStripedRingPlan(req, pieces);
    planner_internal::EqualizeSteps(*plan);
    DeriveBackwardSteps(*plan);
    if (schedule == "striped_bb") {
      CostParams params;
      params.speeds = req.speeds;
      planner_internal::BalanceTransfers(*plan, params, 1 + P % 2, /*forward=*/false);
    }
  } else if (schedule == "tiled" || schedule == "tiled_pf") {
    // 2-D tiles, unequal speeds, 1-3 groups, small K pieces; tiled_pf: head peers first and
    // transfers moved by BalanceTransfers (Q/KV earlier, partials later).
    req.schedule = "balanced";
    for (int w = 0; w < P; ++w) req.speeds.push_back(1.0 + 0.5 * (w % 3));
    TiledOptions options{std::min(P, 1 + P % 3), 0.25, 1 + P % 2, 3, 6, 2, 3};
    if (schedule == "tiled_pf") {
      options.peers_first = true;
      options.balance_window = 1 + P % 3;
      options.speed_groups = 0.6 * (P % 3);  // speed-sorted groups, relabelled (P % 3 > 0)
    }
    ASSERT_TRUE(TiledPlanApplies(req, options));
    plan = MakeTiledPlan(req, options);
    planner_internal::EqualizeSteps(*plan);
    DeriveBackwardSteps(*plan);
  } else if (schedule == "striped_lead") {
    // Pieces posted a step early (Transfer::lead): 2-4 pieces per worker, unequal speeds; the
    // K/V-stationary backward (grad_in posted early too) for even P, the derived one otherwise.
    req.schedule = "balanced";
    std::vector<int> pieces;
    for (int w = 0; w < P; ++w) {
      req.speeds.push_back(1.0 + 0.5 * (w % 3));
      pieces.push_back(2 + w % 3);
    }
    plan = MakeStripedRingPlan(req, pieces, /*kv_stationary_backward=*/P % 2 == 0, /*lead=*/1);
    planner_internal::EqualizeSteps(*plan);
    if (P % 2 != 0) DeriveBackwardSteps(*plan);
    if (P > 1) {
      int leads = 0;
      for (const WorkerPlan& w : plan->workers) {
        for (const PlanStep& s : w.forward) {
          for (const Transfer& x : s.recvs) leads += x.lead;
        }
      }
      EXPECT_GT(leads, 0) << "no transfer was posted early";
    }
  } else if (schedule == "balanced_heads") {
    // What "balanced" (cpu) returns where no sequence plan is within 2%: 2 head groups of
    // unequal worker counts for odd P (3 -> 2 + 1, 5 -> 3 + 2, 7 -> 4 + 3), summed speeds
    // following their head counts (SpeedBalancedHeadGroups), each a balanced plan at its local
    // heads; GQA (8 query heads over 4 kv heads), unequal speeds.
    if (P < 3) GTEST_SKIP() << "two groups with a sequence plan need P >= 3";
    shape.q_heads = 8;
    shape.kv_heads = 4;
    req.schedule = "balanced";
    req.shape =
        AttentionShape{shape.batch, shape.q_heads, shape.kv_heads, shape.head_dim, shape.dtype};
    for (int w = 0; w < P; ++w) req.speeds.push_back(1.0 + 0.5 * (w % 3));
    const HeadGroupSplit groups = SpeedBalancedHeadGroups(req, 2);
    ASSERT_EQ(groups.members.size(), 2u);
    if (P % 2 != 0) {
      EXPECT_NE(groups.members[0].size(), groups.members[1].size());
    }
    plan = MakeHeadsPlan(req, groups);
    ASSERT_FALSE(plan->workers.empty());
    plan->schedule = "balanced";
    for (const WorkerPlan& w : plan->workers) EXPECT_FALSE(w.kv_heads.empty());
  } else if (schedule == "ring_kvs") {
    // K/V-stationary backwards (query pieces travel, dQ partials home, dK/dV stay): the cut ring
    // (steps cut by work, tiny pieces) for even P, the striped ring with 1-3 pieces otherwise.
    // The simulator runs with req.speeds (the plan's balance does not matter for exactness).
    req.schedule = "balanced";
    for (int w = 0; w < P; ++w) req.speeds.push_back(1.0 + 0.5 * (w % 3));
    if (P % 2 == 0) {
      const CutRingOptions options{2.0 + P % 4 / 2, 2, true};
      ASSERT_TRUE(CutRingApplies(req, options));
      plan = MakeCutRingPlan(req, options);
      ASSERT_FALSE(plan->workers.empty());
    } else {
      // P >= 5: the ring visits the workers slow/fast interleaved (a relabelled plan).
      std::vector<int> order;
      for (int w = 0; w < P; ++w) order.push_back(w);
      if (P >= 5) order = planner_internal::InterleavedRingOrder(req.speeds);
      PlanRequest slots = req;
      std::vector<int> pieces;
      for (int k = 0; k < P; ++k) {
        slots.speeds[k] = req.speeds[order[k]];
        pieces.push_back(1 + order[k] % 3);
      }
      plan = MakeStripedRingPlan(slots, pieces, /*kv_stationary_backward=*/true);
      planner_internal::EqualizeSteps(*plan);
      planner_internal::PermuteWorkers(*plan, order);
    }
  } else {
    plan = MakePlan(req);
  }
  ASSERT_TRUE(plan.ok()) << plan.status();
  const AttentionShape full{shape.batch, shape.q_heads, shape.kv_heads, shape.head_dim,
                            shape.dtype};
  CheckOptions check;
  check.shape = full;
  ASSERT_TRUE(CheckPlan(*plan, check).ok()) << CheckPlan(*plan, check).status();
  // Workers that share their heads with others exchange data; a lone head group does not.
  bool shared_heads = false;
  for (int w = 0; w < P; ++w) {
    for (int u = 0; u < P; ++u) {
      shared_heads |= u != w && plan->workers[u].kv_heads == plan->workers[w].kv_heads;
    }
  }
  if (schedule == "heads" && HeadGroupCount(req) > 1) {
    for (const WorkerPlan& w : plan->workers) EXPECT_FALSE(w.kv_heads.empty());
  }
  if (schedule == "heads_dealt" && P >= 4) {  // worker 0 (slow) shares its heads with a fast one
    bool fast_partner = false;
    for (int w = P / 2; w < P; ++w) {
      fast_partner |= plan->workers[w].kv_heads == plan->workers[0].kv_heads;
    }
    EXPECT_TRUE(fast_partner) << "P " << P;
  }
  // The coordinator runs every session plan with adjacent transfers merged (batch 1 only).
  *plan = CoalesceTransfers(*plan, full);

  std::mt19937 rng(1234 + P);
  const size_t nq = size_t(shape.batch) * S * shape.q_heads * shape.head_dim;
  const size_t nk = size_t(shape.batch) * S * shape.kv_heads * shape.head_dim;
  SimulationInputs in{Random(nq, rng), Random(nk, rng), Random(nk, rng), Random(nq, rng)};
  // Key chunks of 5 rows: plans whose workers own their keys alone (P = 1, head groups of one
  // worker) run their backward chunk by chunk (worker/executor/pass_accumulators.h).
  SimulationOptions opt;
  opt.step_tokens = 5;
  // Receives cut to a quarter of the receiver's shard per step (at least 2 rows): every
  // schedule runs as CutTransfers makes it (core/planner/worker_memory.h), which must pass
  // CheckPlan as it is.
  opt.transfer_cut = TransferCut{4, 2, 1 << 20};
  {
    CheckOptions cut_check;
    cut_check.shape = full;
    const absl::StatusOr<CheckReport> cut_ok =
        CheckPlan(CutTransfers(*plan, opt.transfer_cut), cut_check);
    ASSERT_TRUE(cut_ok.ok()) << cut_ok.status();
  }
  absl::StatusOr<SimulationResult> sim = Simulate(*plan, shape, in, opt);
  ASSERT_TRUE(sim.ok()) << sim.status();
  // Streamed (inputs gated: D formed range by range; outputs announced as their rows finish,
  // each announced row unchanged to the end): bitwise the same results.
  {
    SimulationOptions streamed = opt;
    streamed.streamed = true;
    absl::StatusOr<SimulationResult> s2 = Simulate(*plan, shape, in, streamed);
    ASSERT_TRUE(s2.ok()) << s2.status();
    EXPECT_EQ(s2->out, sim->out) << "streamed output";
    EXPECT_EQ(s2->lse, sim->lse) << "streamed lse";
    EXPECT_EQ(s2->dq, sim->dq) << "streamed dq";
    EXPECT_EQ(s2->dk, sim->dk) << "streamed dk";
    EXPECT_EQ(s2->dv, sim->dv) << "streamed dv";
  }

  reference::Problem pr =
      ReferenceProblem(in, shape, shape.batch, S, causal ? MaskKind::kCausal : MaskKind::kFull);
  absl::StatusOr<reference::ForwardResult> ref = reference::Forward(pr);
  ASSERT_TRUE(ref.ok()) << ref.status();
  absl::StatusOr<reference::Gradients> grads =
      reference::Backward(pr, HostView(in.dout, shape.batch, S, shape.q_heads, shape.head_dim));
  ASSERT_TRUE(grads.ok()) << grads.status();

  EXPECT_LE(WorstError(sim->out, ref->out, 1e-5, 1e-4), 1.0) << "output";
  EXPECT_LE(WorstError(sim->lse, ref->lse, 1e-5, 1e-4), 1.0) << "lse";
  EXPECT_LE(WorstError(sim->dq, grads->dq, 1e-4, 1e-3), 1.0) << "dq";
  EXPECT_LE(WorstError(sim->dk, grads->dk, 1e-4, 1e-3), 1.0) << "dk";
  EXPECT_LE(WorstError(sim->dv, grads->dv, 1e-4, 1e-3), 1.0) << "dv";
  // The executor's byte counts agree with the plan's transfers.
  int64_t sent = 0, received = 0;
  for (const PassStats& s : sim->forward) {
    sent += s.bytes_sent;
    received += s.bytes_received;
  }
  EXPECT_EQ(sent, received);
  if (shared_heads) {
    EXPECT_GT(sent, 0);
  } else {
    EXPECT_EQ(sent, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllSchedules, SimulationTest,
    ::testing::Combine(::testing::Values("ring", "distflash", "zigzag", "balanced", "striped",
                                         "striped_bb", "tiled", "tiled_pf", "balanced_gpu",
                                         "ring_kvs", "striped_lead", "heads", "heads_dealt",
                                         "balanced_heads"),
                       ::testing::Range(1, 9), ::testing::Bool()),
    [](const ::testing::TestParamInfo<Param>& info) {
      return std::get<0>(info.param) + "_P" + std::to_string(std::get<1>(info.param)) +
             (std::get<2>(info.param) ? "_causal" : "_full");
    });

// bf16 inputs: partials stay fp32, so the error is that of the rounded inputs, not growing with P.
TEST(SimulationBf16Test, BalancedP5MatchesReferenceOnRoundedInputs) {
  AttentionShape shape;
  shape.batch = 1;
  shape.q_heads = 4;
  shape.kv_heads = 2;
  shape.head_dim = 16;
  shape.dtype = DType::kBF16;
  const int64_t S = 61;
  absl::StatusOr<Plan> plan = MakePlan({"balanced", 5, S, true, {}});
  ASSERT_TRUE(plan.ok());
  std::mt19937 rng(7);
  const size_t nq = size_t(S) * 4 * 16, nk = size_t(S) * 2 * 16;
  SimulationInputs in{Random(nq, rng), Random(nk, rng), Random(nk, rng), Random(nq, rng)};
  for (auto* v : {&in.q, &in.k, &in.v, &in.dout}) {
    for (float& x : *v) x = BF16ToFloat(FloatToBF16(x));
  }
  absl::StatusOr<SimulationResult> sim = Simulate(*plan, shape, in);
  ASSERT_TRUE(sim.ok()) << sim.status();
  // Streamed: D range by range (a bf16 O row is half a dQ row), outputs announced early.
  SimulationOptions streamed;
  streamed.streamed = true;
  absl::StatusOr<SimulationResult> s2 = Simulate(*plan, shape, in, streamed);
  ASSERT_TRUE(s2.ok()) << s2.status();
  EXPECT_EQ(s2->out, sim->out);
  EXPECT_EQ(s2->dq, sim->dq);
  EXPECT_EQ(s2->dk, sim->dk);
  EXPECT_EQ(s2->dv, sim->dv);
  reference::Problem pr;
  pr.q = HostView(in.q, 1, S, 4, 16);
  pr.k = HostView(in.k, 1, S, 2, 16);
  pr.v = HostView(in.v, 1, S, 2, 16);
  pr.scale = 0.25;
  absl::StatusOr<reference::ForwardResult> ref = reference::Forward(pr);
  ASSERT_TRUE(ref.ok());
  // O is stored in bf16: one rounding of the final value (2^-8 relative).
  EXPECT_LE(WorstError(sim->out, ref->out, 1e-3, 8e-3), 1.0);
  EXPECT_LE(WorstError(sim->lse, ref->lse, 1e-4, 1e-4), 1.0);
}

}  // namespace
}  // namespace dfa
