// The GPU cost profile (cost_model.h, GpuCostParams) and the balanced search under it
// (planner.h, PlanRequest::profile = "gpu"): per-op merge traffic is charged exactly, and the
// search's pick is never modeled slower than the fixed schedules, with few ops at P = 2.
#include <algorithm>
#include <string>
#include <vector>

#include "core/planner/cost_model.h"
#include "core/planner/plan_checker.h"
#include "core/planner/planner.h"
#include "gtest/gtest.h"

namespace dfa {
namespace {

const AttentionShape kShape{1, 32, 32, 128, DType::kBF16};

PlanRequest Request(const std::string& schedule, int P, int64_t S, bool causal = true) {
  PlanRequest r;
  r.schedule = schedule;
  r.workers = P;
  r.seq_len = S;
  r.causal = causal;
  r.profile = "gpu";
  r.shape = kShape;
  return r;
}

struct Modeled {
  double seconds = 0;  // forward + backward makespan
  int max_ops = 0;     // most compute ops of one worker in one pass
};

Modeled Model(const PlanRequest& r) {
  absl::StatusOr<Plan> plan = MakePlan(r);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return {};
  EXPECT_TRUE(CheckPlan(*plan).ok()) << r.schedule;
  absl::StatusOr<PlanCost> c = EstimateCost(*plan, GpuCostParams(kShape));
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return {};
  Modeled m;
  m.seconds = c->forward.makespan_seconds + c->backward.makespan_seconds;
  for (const PassCost* pass : {&c->forward, &c->backward}) {
    for (const WorkerCost& w : pass->workers) m.max_ops = std::max(m.max_ops, w.compute_ops);
  }
  return m;
}

TEST(PlannerGpuTest, ProfilesHaveTheDocumentedFigures) {
  const CostParams cpu = CpuCostParams(kShape), def;
  EXPECT_EQ(cpu.flops_per_second, def.flops_per_second);
  EXPECT_EQ(cpu.latency_seconds, def.latency_seconds);
  EXPECT_EQ(cpu.op_overhead_seconds, 0);
  EXPECT_EQ(cpu.memory_bandwidth_bytes_per_second, 0);
  const CostParams gpu = GpuCostParams(kShape, {1, 2});
  EXPECT_EQ(gpu.flops_per_second, 600e12);
  EXPECT_EQ(gpu.bandwidth_bytes_per_second, 300e9);
  EXPECT_EQ(gpu.latency_seconds, 100e-6);
  EXPECT_EQ(gpu.op_overhead_seconds, 60e-6);
  EXPECT_EQ(gpu.memory_bandwidth_bytes_per_second, 3e12);
  EXPECT_EQ(gpu.speeds, (std::vector<double>{1, 2}));
  EXPECT_TRUE(CostParamsForProfile("gpu", kShape).ok());
  absl::StatusOr<CostParams> bad = CostParamsForProfile("tpu", kShape);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("profile"), std::string::npos);
  PlanRequest r = Request("balanced", 2, 1024);
  r.profile = "tpu";
  absl::Status s = ValidatePlanRequest(r);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("profile"), std::string::npos);
  r.profile = "gpu";
  r.shape.kv_heads = 5;
  s = ValidatePlanRequest(r);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("shape"), std::string::npos);
}

// Each op pays 2 x (its fp32 accumulate bytes) / memory bandwidth on top of FLOPs and overhead:
// forward q_rows x Hq x (D + 1) x 4 B; backward q_rows x Hq x D x 4 B + 2 x kv_rows x Hkv x D x 4
// B.
TEST(PlannerGpuTest, MergeTrafficIsChargedPerOpAndNotInTheIdeal) {
  const int P = 4;
  const int64_t S = 4096;
  absl::StatusOr<Plan> ring = MakePlan({"ring", P, S, true, {}});
  ASSERT_TRUE(ring.ok());
  const AttentionShape gqa{2, 8, 2, 64, DType::kBF16};
  CostParams p = CpuCostParams(gqa);
  p.bandwidth_bytes_per_second = 0;
  absl::StatusOr<PlanCost> base = EstimateCost(*ring, p);
  p.memory_bandwidth_bytes_per_second = 1e9;
  absl::StatusOr<PlanCost> merged = EstimateCost(*ring, p);
  ASSERT_TRUE(base.ok() && merged.ok());
  EXPECT_EQ(merged->forward.ideal_seconds, base->forward.ideal_seconds);
  const double rows = static_cast<double>(S) / P;
  for (int w = 0; w < P; ++w) {
    const int ops = w + 1;  // ring, causal: worker w computes its w + 1 chunks, one op each
    const double fwd = ops * 2 * rows * 2 * 8 * (64 + 1) * 4 / 1e9;
    const double bwd = ops * 2 * (rows * 2 * 8 * 64 * 4 + 2 * rows * 2 * 2 * 64 * 4) / 1e9;
    EXPECT_NEAR(merged->forward.workers[w].busy_seconds,
                base->forward.workers[w].busy_seconds + fwd, 1e-9);
    EXPECT_NEAR(merged->backward.workers[w].busy_seconds,
                base->backward.workers[w].busy_seconds + bwd, 1e-9);
  }
  p.memory_bandwidth_bytes_per_second = -1;
  absl::StatusOr<PlanCost> bad = EstimateCost(*ring, p);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("memory_bandwidth"), std::string::npos);
}

// (a) P = 2: the measured case. Few large ops (zigzag-like), never modeled slower than zigzag or
// ring. The CPU profile's pick (balance first: 512-key pieces) is modeled slower here.
TEST(PlannerGpuTest, TwoGpusPickFewOpsAndAreNoSlowerThanZigzagOrRing) {
  for (int64_t S : {int64_t{16384}, int64_t{32768}, int64_t{262144}}) {
    const Modeled b = Model(Request("balanced", 2, S));
    const Modeled z = Model(Request("zigzag", 2, S));
    const Modeled r = Model(Request("ring", 2, S));
    EXPECT_LE(b.seconds, z.seconds * (1 + 1e-12)) << "S=" << S;
    EXPECT_LE(b.seconds, r.seconds * (1 + 1e-12)) << "S=" << S;
    EXPECT_LE(b.max_ops, 8) << "S=" << S;
    PlanRequest cpu = Request("balanced", 2, S);
    cpu.profile = "cpu";
    cpu.shape = PlanRequest().shape;
    const Modeled c = Model(cpu);
    EXPECT_GT(c.max_ops, b.max_ops) << "S=" << S;
    EXPECT_GE(c.seconds, b.seconds) << "S=" << S;
  }
}

// (b) P = 4, 8: the pick is never modeled slower than any fixed schedule.
TEST(PlannerGpuTest, FourAndEightGpusNoSlowerThanEveryFixedSchedule) {
  for (int P : {4, 8}) {
    for (int64_t S : {int64_t{16384}, int64_t{131072}}) {
      for (bool causal : {true, false}) {
        const Modeled b = Model(Request("balanced", P, S, causal));
        for (const char* other : {"zigzag", "ring", "distflash"}) {
          const Modeled o = Model(Request(other, P, S, causal));
          EXPECT_LE(b.seconds, o.seconds * (1 + 1e-12))
              << other << " P=" << P << " S=" << S << " causal=" << causal;
        }
      }
    }
  }
}

// Head groups under the GPU profile: with the session's shape given (as the coordinator and
// `dfa plan` give it), "balanced" also ranks head-group plans by their true time, so at a small
// sequence over many GPUs (wire- and message-bound as one sequence plan) it is never modeled
// slower than "heads" or than its own sequence-only pick, and is faster than the latter at
// S = 16K, P = 16.
TEST(PlannerGpuTest, BalancedRanksHeadGroupsByTrueTime) {
  const AttentionShape gqa{1, 32, 8, 128, DType::kBF16};
  auto seconds = [&](PlanRequest r) {
    absl::StatusOr<Plan> plan = MakePlan(r);
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) return 0.0;
    CheckOptions check;
    check.shape = gqa;
    EXPECT_TRUE(CheckPlan(*plan, check).ok()) << r.schedule << " P=" << r.workers;
    absl::StatusOr<PlanCost> c = EstimateCost(*plan, GpuCostParams(gqa));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? c->forward.makespan_seconds + c->backward.makespan_seconds : 0.0;
  };
  for (int P : {4, 16}) {
    PlanRequest sequence = Request("balanced", P, 16384);
    sequence.shape = gqa;
    PlanRequest grouped = sequence;
    grouped.session_shape = gqa;
    PlanRequest heads = sequence;
    heads.schedule = "heads";
    const double s = seconds(sequence), g = seconds(grouped), h = seconds(heads);
    EXPECT_LE(g, s * (1 + 1e-12)) << "P=" << P;
    EXPECT_LE(g, h * (1 + 1e-12)) << "P=" << P;
    if (P == 16) {
      EXPECT_LT(g, 0.5 * s) << "P=16: sequence-only " << s << " s, grouped " << g;
    }
  }
}

// Unequal speeds and odd P: the GPU search still makes valid plans.
TEST(PlannerGpuTest, UnequalSpeedsAndOddPMakeValidPlans) {
  for (int P : {1, 3, 5}) {
    PlanRequest r = Request("balanced", P, 8192 + 7);
    for (int w = 0; w < P; ++w) r.speeds.push_back(1.0 + 0.5 * w);
    absl::StatusOr<Plan> plan = MakePlan(r);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_TRUE(CheckPlan(*plan).ok()) << "P=" << P;
  }
}

}  // namespace
}  // namespace dfa
