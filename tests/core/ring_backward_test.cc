// The K/V-stationary backward of the striped ring and the cut ring (docs/planner.md, "K/V-
// stationary backward and the cut ring"): valid plans, balanced compute for any speeds, fewer
// bytes than the derived backward, and what they bring to the balanced search.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "core/planner/cost_model.h"
#include "core/planner/plan_builder.h"
#include "core/planner/plan_checker.h"
#include "core/planner/planner.h"
#include "gtest/gtest.h"

namespace dfa {
namespace {

const AttentionShape kShape{1, 32, 32, 128, DType::kBF16};

// Speeds: 0 alternating 1,2; 1 random in [0.5, 2) (planner_test's LCG); 2 cycling 1..4.
std::vector<double> Speeds(int kind, int P) {
  std::vector<double> s;
  uint32_t x = 12345u + static_cast<uint32_t>(P);
  for (int w = 0; w < P; ++w) {
    if (kind == 0) s.push_back(1.0 + w % 2);
    if (kind == 1) {
      x = x * 1664525u + 1013904223u;
      s.push_back(0.5 + 1.5 * (x >> 8) / double(1 << 24));
    }
    if (kind == 2) s.push_back(1.0 + w % 4);
  }
  return s;
}

CostParams Real(const std::vector<double>& speeds) { return CpuCostParams(kShape, speeds); }

CostParams ComputeOnly(const std::vector<double>& speeds) {
  CostParams p = Real(speeds);
  p.bandwidth_bytes_per_second = 0;
  return p;
}

int64_t MaxBackwardBytesReceived(const Plan& plan) {
  int64_t most = 0;
  for (const WorkerPlan& w : plan.workers) {
    int64_t got = 0;
    for (const PlanStep& st : w.backward) {
      for (const Transfer& x : st.recvs) got += TransferBytes(kShape, x.tensor, x.rows.size());
    }
    most = std::max(most, got);
  }
  return most;
}

TEST(RingBackwardTest, KvStationaryBackwardIsValidAndMovesNoDkvPartials) {
  for (int P : {1, 2, 3, 5, 8, 13}) {
    for (bool causal : {true, false}) {
      const std::vector<double> speeds = Speeds(0, P);
      PlanRequest req{"balanced", P, 4096, causal, speeds};
      std::vector<int> pieces;
      for (int w = 0; w < P; ++w) pieces.push_back(1 + w % 2);
      Plan plan = MakeStripedRingPlan(req, pieces, /*kv_stationary_backward=*/true);
      planner_internal::EqualizeSteps(plan);
      absl::StatusOr<CheckReport> r = CheckPlan(plan);
      ASSERT_TRUE(r.ok()) << "P=" << P << ": " << r.status();
      // Same forward as the plain striped ring; the backward has no K/V or dK/dV on the wire.
      Plan plain = MakeStripedRingPlan(req, pieces);
      for (int w = 0; w < P; ++w) {
        ASSERT_EQ(plan.workers[w].forward.size(), plain.workers[w].forward.size());
        for (const PlanStep& st : plan.workers[w].backward) {
          for (const Transfer& x : st.recvs) {
            EXPECT_TRUE(x.tensor == PlanTensor::kGradIn || x.tensor == PlanTensor::kDqPartial);
          }
        }
      }
      absl::StatusOr<PlanCost> c = EstimateCost(plan, ComputeOnly(speeds));
      ASSERT_TRUE(c.ok());
      EXPECT_LE(c->backward.compute_makespan_ratio, 1.01) << "P=" << P;
    }
  }
}

TEST(RingBackwardTest, KvStationaryBackwardHalvesTheStripedBackwardAtLargeP) {
  // Speeds 1,2 at P = 48, causal, S = 256K: the derived backward (K/V + fp32 dK/dV to the
  // owners) is bandwidth-bound (1.16), the K/V-stationary one is not.
  const int P = 48;
  const std::vector<double> speeds = Speeds(0, P);
  PlanRequest req{"balanced", P, 262144, true, speeds};
  std::vector<int> pieces;
  for (int w = 0; w < P; ++w) pieces.push_back(1 + w % 2);
  Plan derived = MakeStripedRingPlan(req, pieces);
  planner_internal::EqualizeSteps(derived);
  DeriveBackwardSteps(derived);
  Plan kvs = MakeStripedRingPlan(req, pieces, /*kv_stationary_backward=*/true);
  planner_internal::EqualizeSteps(kvs);
  absl::StatusOr<PlanCost> cd = EstimateCost(derived, Real(speeds));
  absl::StatusOr<PlanCost> ck = EstimateCost(kvs, Real(speeds));
  ASSERT_TRUE(cd.ok() && ck.ok());
  EXPECT_LT(3 * MaxBackwardBytesReceived(kvs), 2 * MaxBackwardBytesReceived(derived));
  EXPECT_LE(ck->backward.makespan_ratio, 1.02);
  EXPECT_GT(cd->backward.makespan_ratio, ck->backward.makespan_ratio + 0.05);
  std::printf("P=48 speeds 1,2 striped backward: derived %.4f, K/V-stationary %.4f\n",
              cd->backward.makespan_ratio, ck->backward.makespan_ratio);
}

TEST(RingBackwardTest, CutRingIsValidAndBalancedForAnySpeeds) {
  for (int P : {2, 3, 4, 7, 16, 33}) {
    for (int kind : {0, 1, 2}) {
      for (bool causal : {true, false}) {
        for (const CutRingOptions& o : {CutRingOptions{2, 1, true}, CutRingOptions{2, 3, false},
                                        CutRingOptions{3, 2, true}}) {
          const std::vector<double> speeds = Speeds(kind, P);
          PlanRequest req{"balanced", P, 16 * 1024 + 3, causal, speeds};
          ASSERT_TRUE(CutRingApplies(req, o));
          Plan plan = MakeCutRingPlan(req, o);
          ASSERT_FALSE(plan.workers.empty()) << "P=" << P << " kind=" << kind;
          if (!o.kv_stationary_backward) DeriveBackwardSteps(plan);
          absl::StatusOr<CheckReport> r = CheckPlan(plan);
          ASSERT_TRUE(r.ok()) << "P=" << P << " kind=" << kind << ": " << r.status();
          // Steps cut by work: every worker's compute is its speed share, whatever the speeds.
          absl::StatusOr<PlanCost> c = EstimateCost(plan, ComputeOnly(speeds));
          ASSERT_TRUE(c.ok());
          EXPECT_LE(c->forward.compute_makespan_ratio, 1.01) << "P=" << P << " kind=" << kind;
          EXPECT_LE(c->backward.compute_makespan_ratio, 1.01) << "P=" << P << " kind=" << kind;
        }
      }
    }
  }
  PlanRequest tiny{"balanced", 8, 60, true, {}};
  EXPECT_FALSE(CutRingApplies(tiny, CutRingOptions{}));  // needs seq_len >= 8 * workers
  PlanRequest one{"balanced", 1, 4096, true, {}};
  EXPECT_FALSE(CutRingApplies(one, CutRingOptions{}));
}

TEST(RingBackwardTest, CutRingBalancesRandomSpeedsWhereTheStripedRingCannot) {
  // Random speeds at P = 48, causal, S = 256K: the striped ring's rounded piece counts make
  // unequal steps (forward 1.14 at best); the cut ring is within 2% both ways.
  const int P = 48;
  const std::vector<double> speeds = Speeds(1, P);
  PlanRequest req{"balanced", P, 262144, true, speeds};
  Plan cut = MakeCutRingPlan(req, CutRingOptions{1.25, 2, true});
  ASSERT_FALSE(cut.workers.empty());
  absl::StatusOr<PlanCost> c = EstimateCost(cut, Real(speeds));
  ASSERT_TRUE(c.ok());
  EXPECT_LE(c->forward.makespan_ratio, 1.02);
  EXPECT_LE(c->backward.makespan_ratio, 1.02);
  const double slowest = *std::min_element(speeds.begin(), speeds.end());
  std::vector<int> pieces;
  for (double s : speeds) pieces.push_back(std::max(1, static_cast<int>(std::lround(s / slowest))));
  Plan striped = MakeStripedRingPlan(req, pieces, /*kv_stationary_backward=*/true);
  planner_internal::EqualizeSteps(striped);
  absl::StatusOr<PlanCost> cs = EstimateCost(striped, Real(speeds));
  ASSERT_TRUE(cs.ok());
  EXPECT_GT(cs->forward.makespan_ratio, 1.05);
  std::printf("P=48 random speeds: striped %.4f / %.4f, cut ring %.4f / %.4f\n",
              cs->forward.makespan_ratio, cs->backward.makespan_ratio, c->forward.makespan_ratio,
              c->backward.makespan_ratio);
}

TEST(RingBackwardTest, InterleavedRingOrderSpreadsPartialsIntoFastOwners) {
  // The order is a permutation alternating the slower and the faster half.
  const std::vector<double> speeds = {4, 1, 3, 2, 1};
  const std::vector<int> order = planner_internal::InterleavedRingOrder(speeds);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 4, 0, 3}));  // speeds 1, 3, 1, 4, 2
  // Cycling speeds 1..4 at P = 31, causal, S = 256K: in index order runs of slow workers return
  // dQ partials to one fast owner in the same step (backward 1.026); interleaved: within 1%.
  const int P = 31;
  const std::vector<double> cyc = Speeds(2, P);
  auto build = [&](const std::vector<int>& ring) {
    PlanRequest slots{"balanced", P, 262144, true, cyc};
    std::vector<int> pieces(P);
    for (int k = 0; k < P; ++k) {
      slots.speeds[k] = cyc[ring[k]];
      pieces[k] = static_cast<int>(2 * cyc[ring[k]]);
    }
    Plan plan = MakeStripedRingPlan(slots, pieces, /*kv_stationary_backward=*/true);
    planner_internal::EqualizeSteps(plan);
    planner_internal::PermuteWorkers(plan, ring);
    return plan;
  };
  std::vector<int> identity(P);
  for (int w = 0; w < P; ++w) identity[w] = w;
  const Plan plain = build(identity);
  const Plan spread = build(planner_internal::InterleavedRingOrder(cyc));
  absl::StatusOr<CheckReport> r = CheckPlan(spread);
  ASSERT_TRUE(r.ok()) << r.status();
  // Relabelled, not rebuilt: each worker still owns rows proportional to its own speed.
  double total_speed = 0;
  for (double s : cyc) total_speed += s;
  for (int w = 0; w < P; ++w) {
    int64_t rows = 0;
    for (const RowRange& o : spread.workers[w].owned) rows += o.size();
    EXPECT_NEAR(double(rows) / 262144, cyc[w] / total_speed, 1e-4) << w;
  }
  absl::StatusOr<PlanCost> cp = EstimateCost(plain, Real(cyc));
  absl::StatusOr<PlanCost> cs = EstimateCost(spread, Real(cyc));
  ASSERT_TRUE(cp.ok() && cs.ok());
  EXPECT_GT(cp->backward.makespan_ratio, 1.02);
  EXPECT_LE(cs->backward.makespan_ratio, 1.01);
  EXPECT_LE(cs->forward.makespan_ratio, 1.01);
  std::printf("P=31 speeds 1..4 K/V-stationary backward: index order %.4f, interleaved %.4f\n",
              cp->backward.makespan_ratio, cs->backward.makespan_ratio);
}

}  // namespace
}  // namespace dfa
