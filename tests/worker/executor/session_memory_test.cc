// Session memory (docs/memory.md): every worker of every schedule, P = 1..8, holds at most what
// admission charges (core/planner/worker_memory.h WorkerMemory::peak) and at least 98% of it,
// measured by the simulator's MemoryTrackingBackend (host memory: every byte the worker's
// storage, buffers and key chunks take); a chunked backward (step_tokens < shard) gives the
// gradients of an unchunked one; bf16 gradients, stored in the session dtype, keep the error of
// one rounding against fp64 for P = 1..8 (it does not grow with P).
#include <cmath>
#include <random>
#include <string>
#include <tuple>

#include "core/planner/plan_checker.h"
#include "core/planner/plan_coalescing.h"
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
using testing_util::WorstError;

SimulationInputs Inputs(const AttentionShape& shape, int64_t S, unsigned seed, bool bf16) {
  std::mt19937 rng(seed);
  const size_t nq = size_t(shape.batch) * S * shape.q_heads * shape.head_dim;
  const size_t nk = size_t(shape.batch) * S * shape.kv_heads * shape.head_dim;
  SimulationInputs in{Random(nq, rng), Random(nk, rng), Random(nk, rng), Random(nq, rng)};
  if (bf16) {
    for (auto* v : {&in.q, &in.k, &in.v, &in.dout}) {
      for (float& x : *v) x = BF16ToFloat(FloatToBF16(x));
    }
  }
  return in;
}

absl::StatusOr<Plan> SessionPlan(const std::string& schedule, int P, int64_t S,
                                 const AttentionShape& shape) {
  PlanRequest req;
  req.schedule = schedule;
  req.workers = P;
  req.seq_len = S;
  req.causal = true;
  if (schedule == "heads") req.shape = shape;
  ASSIGN_OR_RETURN(Plan plan, MakePlan(req));
  return CoalesceTransfers(plan, shape);  // as the coordinator runs it
}

using Param = std::tuple<std::string, int>;  // schedule, workers

class SessionMemoryTest : public ::testing::TestWithParam<Param> {};

void ExpectPeakIsTheCharge(const std::string& schedule, int P, const AttentionShape& shape) {
  const int64_t S = 96 * P + 40;
  absl::StatusOr<Plan> plan = SessionPlan(schedule, P, S, shape);
  ASSERT_TRUE(plan.ok()) << plan.status();
  SimulationOptions opt;
  opt.step_tokens = 32;
  absl::StatusOr<SimulationResult> sim = Simulate(*plan, shape, Inputs(shape, S, 11, true), opt);
  ASSERT_TRUE(sim.ok()) << sim.status();
  CheckOptions check;
  check.shape = shape;
  absl::StatusOr<CheckReport> report = CheckPlan(*plan, check);
  ASSERT_TRUE(report.ok());
  for (int w = 0; w < P; ++w) {
    absl::StatusOr<WorkerMemory> m =
        PlanWorkerMemory(*plan, w, LocalShape(shape, plan->workers[w]), *report, opt.step_tokens);
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->peak(), sim->predicted_bytes[w]);
    const double ratio = double(sim->peak_bytes[w]) / double(m->peak());
    EXPECT_LE(ratio, 1.0) << "worker " << w << " measured " << sim->peak_bytes[w]
                          << " charged " << m->peak() << " (storage " << m->storage.total
                          << "; buffers fwd " << sim->forward_peak_bytes[w] << " vs "
                          << m->forward_buffers << ", bwd " << sim->backward_peak_bytes[w]
                          << " vs " << m->backward_buffers << " + chunk " << m->key_chunk << ")";
    EXPECT_GE(ratio, 0.98) << "worker " << w << " measured " << sim->peak_bytes[w]
                           << " charged " << m->peak();
    int group = 0;  // workers holding this worker's heads (itself included)
    for (const WorkerPlan& u : plan->workers) group += u.kv_heads == plan->workers[w].kv_heads;
    if (P == 1 || (schedule == "heads" && group == 1)) {
      EXPECT_FALSE(m->layout.kv_accumulators) << "worker " << w << ": a chunked backward";
      EXPECT_GT(m->key_chunk, 0);
    }
  }
}

TEST_P(SessionMemoryTest, MeasuredPeakIsTheCharge) {
  const auto [schedule, P] = GetParam();
  if (schedule == "distflash" && P % 2 != 0) GTEST_SKIP() << "distflash is defined for even P";
  ExpectPeakIsTheCharge(schedule, P, AttentionShape{1, 8, 8, 16, DType::kBF16});
}

// Batch 2 (sends packed through staging buffers, K/V messages not coalesced) and GQA.
TEST_P(SessionMemoryTest, MeasuredPeakIsTheChargeAtBatch2Gqa) {
  const auto [schedule, P] = GetParam();
  if (schedule == "distflash" && P % 2 != 0) GTEST_SKIP() << "distflash is defined for even P";
  ExpectPeakIsTheCharge(schedule, P, AttentionShape{2, 8, 2, 16, DType::kBF16});
}

INSTANTIATE_TEST_SUITE_P(Schedules, SessionMemoryTest,
                         ::testing::Combine(::testing::Values("balanced", "zigzag", "ring",
                                                              "distflash", "heads"),
                                            ::testing::Range(1, 9)),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::get<0>(info.param) + "_P" +
                                  std::to_string(std::get<1>(info.param));
                         });

// One worker: the backward in key chunks of 7, 16 and 64 rows (the last: one chunk) gives the
// gradients of fp32 dK, dV accumulated over all keys, within fp32 rounding; batch 2, GQA.
TEST(ChunkedBackwardTest, ChunksGiveTheGradientsOfOneAccumulator) {
  const AttentionShape shape{2, 4, 2, 8, DType::kF32};
  const int64_t S = 61;
  for (bool causal : {true, false}) {
    absl::StatusOr<Plan> plan = MakePlan({"balanced", 1, S, causal, {}});
    ASSERT_TRUE(plan.ok());
    const SimulationInputs in = Inputs(shape, S, 5, false);
    SimulationOptions whole;
    whole.step_tokens = S;
    absl::StatusOr<SimulationResult> a = Simulate(*plan, shape, in, whole);
    ASSERT_TRUE(a.ok()) << a.status();
    for (int64_t step : {7, 16, 64}) {
      SimulationOptions opt;
      opt.step_tokens = step;
      absl::StatusOr<SimulationResult> b = Simulate(*plan, shape, in, opt);
      ASSERT_TRUE(b.ok()) << b.status();
      for (auto [x, y, name] : {std::tuple{&a->dq, &b->dq, "dq"}, {&a->dk, &b->dk, "dk"},
                                {&a->dv, &b->dv, "dv"}}) {
        const std::vector<double> want(x->begin(), x->end());
        EXPECT_LE(WorstError(*y, want, 1e-6, 1e-5), 1.0) << name << " step " << step;
      }
      EXPECT_EQ(a->out, b->out);
    }
  }
}

// bf16, balanced, P = 1..8: the gradients, accumulated in fp32 and rounded once into the
// session dtype (what a download of fp32 gradients gave before), are within one bf16 rounding
// of fp64 attention on the same (rounded) inputs, and the error does not grow with P.
double MaxRelError(const std::vector<float>& got, const std::vector<double>& want) {
  double worst = 0, scale = 0;
  for (double x : want) scale = std::max(scale, std::abs(x));
  for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
  return worst / scale;
}

TEST(SessionDtypeGradientsTest, Bf16ErrorDoesNotGrowWithP) {
  const AttentionShape shape{1, 4, 2, 16, DType::kBF16};
  const int64_t S = 67;
  const SimulationInputs in = Inputs(shape, S, 9, true);
  reference::Problem pr;
  SimulationInputs ref_in = in;
  pr.q = HostView(ref_in.q, 1, S, 4, 16);
  pr.k = HostView(ref_in.k, 1, S, 2, 16);
  pr.v = HostView(ref_in.v, 1, S, 2, 16);
  pr.mask = MaskKind::kCausal;
  pr.scale = 0.25;
  absl::StatusOr<reference::Gradients> grads =
      reference::Backward(pr, HostView(ref_in.dout, 1, S, 4, 16));
  ASSERT_TRUE(grads.ok());
  double first[3] = {0, 0, 0};
  for (int P = 1; P <= 8; ++P) {
    absl::StatusOr<Plan> plan = MakePlan({"balanced", P, S, true, {}});
    ASSERT_TRUE(plan.ok());
    SimulationOptions opt;
    opt.step_tokens = 16;
    absl::StatusOr<SimulationResult> sim = Simulate(*plan, shape, in, opt);
    ASSERT_TRUE(sim.ok()) << sim.status();
    const double err[3] = {MaxRelError(sim->dq, grads->dq), MaxRelError(sim->dk, grads->dk),
                           MaxRelError(sim->dv, grads->dv)};
    for (int i = 0; i < 3; ++i) {
      // One bf16 rounding of the largest gradient is 2^-9 of it; the fp32 sums add ~1e-6.
      EXPECT_LE(err[i], 1.0 / 256) << "gradient " << i << " P " << P;
      if (P == 1) first[i] = err[i];
      EXPECT_LE(err[i], first[i] * 1.5 + 1e-5) << "gradient " << i << " P " << P;
    }
  }
}

}  // namespace
}  // namespace dfa
