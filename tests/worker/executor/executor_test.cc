#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>

#include "core/planner/planner.h"
#include "gtest/gtest.h"
#include "worker/transport/inproc_transport.h"
#include "worker/executor/plan_executor.h"
#include "worker/executor/session_storage.h"
#include "worker/executor/simulator.h"

namespace dfa {
namespace {

std::unique_ptr<AttentionBackend> Cpu() {
  auto b = CreateBackend("cpu", BackendOptions{1, 0});
  EXPECT_TRUE(b.ok()) << b.status();
  return std::move(*b);
}

// A hand-made plan for one worker owning [0, seq): one forward step per entry of `steps` (its
// compute ops), and one backward step computing the whole square.
Plan OneWorkerPlan(int64_t seq, bool causal, std::vector<std::vector<ComputeOp>> steps) {
  Plan plan;
  plan.schedule = "hand";
  plan.seq_len = seq;
  plan.causal = causal;
  plan.workers.resize(1);
  plan.workers[0].owned = {{0, seq}};
  for (auto& ops : steps) {
    PlanStep st;
    st.computes = std::move(ops);
    plan.workers[0].forward.push_back(st);
  }
  PlanStep bwd;
  bwd.computes = {{{0, seq}, {0, seq}}};
  plan.workers[0].backward = {bwd};
  return plan;
}

TEST(SessionStorageTest, BytesAndLocalRows) {
  auto backend = Cpu();
  AttentionShape shape{2, 4, 2, 8, DType::kBF16};
  auto st = SessionStorage::Create(backend.get(), shape, {{0, 5}, {20, 23}});
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ((*st)->rows(), 8);
  // q, dout bf16 (2*8*4*8*2 each), k, v bf16, lse, delta f32, and the work region: the wider
  // of O bf16 + its fp32 accumulator and fp32 dQ, dK, dV (every block a multiple of 256 here).
  const int64_t qe = 2 * 8 * 4 * 8, ke = 2 * 8 * 2 * 8, st_el = 2 * 4 * 8;
  EXPECT_EQ((*st)->bytes(), 2 * qe * 2 + 2 * ke * 2 + 2 * st_el * 4 +
                                std::max(qe * 2 + qe * 4, qe * 4 + 2 * ke * 4));
  EXPECT_NE((*st)->o_acc().data, nullptr);
  EXPECT_NE((*st)->dk_acc().data, nullptr);
  // A single-writer forward and a chunked backward: the work region is fp32 dQ over O.
  auto narrow = SessionStorage::Create(backend.get(), shape, {{0, 5}, {20, 23}},
                                       StorageLayout{false, false});
  ASSERT_TRUE(narrow.ok()) << narrow.status();
  EXPECT_EQ((*narrow)->bytes(), 2 * qe * 2 + 2 * ke * 2 + 2 * st_el * 4 + qe * 4);
  EXPECT_EQ((*narrow)->o_acc().data, nullptr);
  EXPECT_EQ((*narrow)->dk_acc().data, nullptr);
  EXPECT_EQ((*narrow)->dq_acc().data, (*narrow)->o().data);
  // The gradients end in the inputs' slots.
  EXPECT_EQ((*narrow)->dq().data, (*narrow)->q().data);
  EXPECT_EQ((*narrow)->dk().data, (*narrow)->k().data);
  EXPECT_EQ((*narrow)->dv().data, (*narrow)->v().data);
  EXPECT_EQ(*(*st)->LocalRow({21, 23}), 6);
  EXPECT_EQ(*(*st)->LocalRow({0, 5}), 0);
  EXPECT_FALSE((*st)->LocalRow({4, 21}).ok());
}

TEST(SessionStorageTest, RejectsBadShapesAndRanges) {
  auto backend = Cpu();
  EXPECT_EQ(SessionStorage::Create(backend.get(), AttentionShape{1, 3, 2, 8, DType::kF32}, {{0, 4}})
                .status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(SessionStorage::Create(backend.get(), AttentionShape{}, {{4, 8}, {0, 2}}).ok());
  EXPECT_FALSE(SessionStorage::Create(backend.get(), AttentionShape{}, {}).ok());
}

TEST(PlanExecutorTest, RejectsStorageThatDoesNotMatchThePlan) {
  auto backend = Cpu();
  auto plan = MakePlan({"ring", 2, 16, true, {}});
  ASSERT_TRUE(plan.ok());
  auto hub = *CreateInprocHub(2);
  auto t = *CreateInprocTransport(hub, 0);
  auto st = *SessionStorage::Create(backend.get(), AttentionShape{1, 1, 1, 8, DType::kF32}, {{0, 7}});
  PlanExecutor ex(backend.get(), t.get(), st.get());
  EXPECT_EQ(ex.RunForward(*plan).status().code(), absl::StatusCode::kInvalidArgument);
}

// A head-split worker's storage must hold exactly its plan's kv heads (plan.h "Head groups");
// the simulator refuses a range outside the session's heads.
TEST(PlanExecutorTest, RejectsStorageWithOtherHeadsThanThePlan) {
  auto backend = Cpu();
  PlanRequest r{"heads", 2, 16, true, {}};
  r.shape = AttentionShape{1, 4, 2, 8, DType::kF32};
  auto plan = MakePlan(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->workers[1].kv_heads, (HeadRange{1, 2}));
  auto hub = *CreateInprocHub(2);
  auto t = *CreateInprocTransport(hub, 1);
  // All heads (2 kv heads) where the plan gives worker 1 one.
  auto st = *SessionStorage::Create(backend.get(), AttentionShape{1, 4, 2, 8, DType::kF32}, {{0, 16}});
  PlanExecutor ex(backend.get(), t.get(), st.get());
  const absl::Status s = ex.RunForward(*plan).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("worker 1: the plan's kv_heads [1, 2)"), absl::string_view::npos) << s;

  SimulationInputs in;
  in.q.assign(16 * 4 * 8, 0.5f);
  in.k.assign(16 * 2 * 8, 0.5f);
  in.v.assign(16 * 2 * 8, 0.5f);
  Plan wide = *plan;
  wide.workers[1].kv_heads = {1, 3};
  auto sim = Simulate(wide, AttentionShape{1, 4, 2, 8, DType::kF32}, in);
  EXPECT_EQ(sim.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(sim.status().message().find("plan.workers[1].kv_heads"), absl::string_view::npos)
      << sim.status();
}

TEST(PlanExecutorTest, CancelFlagStopsThePass) {
  auto backend = Cpu();
  auto plan = MakePlan({"ring", 2, 16, true, {}});
  ASSERT_TRUE(plan.ok());
  auto hub = *CreateInprocHub(2);
  auto t = *CreateInprocTransport(hub, 1);
  auto st = *SessionStorage::Create(backend.get(), AttentionShape{1, 1, 1, 8, DType::kF32},
                                    plan->workers[1].owned);
  std::atomic<bool> cancel{true};
  ExecutorOptions opt;
  opt.cancel = &cancel;
  PlanExecutor ex(backend.get(), t.get(), st.get(), opt);
  EXPECT_EQ(ex.RunForward(*plan).status().code(), absl::StatusCode::kCancelled);
}

TEST(PlanExecutorTest, LostPeerTimesOutInsteadOfHanging) {
  auto backend = Cpu();
  auto plan = MakePlan({"ring", 2, 16, true, {}});
  ASSERT_TRUE(plan.ok());
  auto hub = *CreateInprocHub(2);
  auto t = *CreateInprocTransport(hub, 1);  // worker 0 never runs
  auto st = *SessionStorage::Create(backend.get(), AttentionShape{1, 1, 1, 8, DType::kF32},
                                    plan->workers[1].owned);
  ExecutorOptions opt;
  opt.step_timeout = absl::Milliseconds(50);
  PlanExecutor ex(backend.get(), t.get(), st.get(), opt);
  EXPECT_EQ(ex.RunForward(*plan).status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(PlanExecutorTest, ReportsStepStatsThatAddUp) {
  auto plan = MakePlan({"distflash", 4, 64, true, {}});
  ASSERT_TRUE(plan.ok());
  AttentionShape shape{1, 2, 1, 8, DType::kF32};
  const size_t nq = 64 * 2 * 8, nk = 64 * 8;
  SimulationInputs in{std::vector<float>(nq, 0.5f), std::vector<float>(nk, 0.25f),
                      std::vector<float>(nk, 1.f), std::vector<float>(nq, 1.f)};
  auto sim = Simulate(*plan, shape, in);
  ASSERT_TRUE(sim.ok()) << sim.status();
  for (int w = 0; w < 4; ++w) {
    const PassStats& f = sim->forward[w];
    ASSERT_EQ(f.steps.size(), plan->workers[w].forward.size());
    int64_t units = 0, launches = 0, merges = 0;
    for (size_t t = 0; t < f.steps.size(); ++t) {
      units += f.steps[t].units;
      launches += f.steps[t].forward_launches;
      merges += f.steps[t].merge_launches;
      EXPECT_EQ(f.steps[t].units, int64_t(plan->workers[w].forward[t].computes.size()));
    }
    EXPECT_EQ(units, launches);
    EXPECT_GE(f.busy_seconds, 0);
    EXPECT_GT(f.flops, 0);
    // Owners of the last chunks receive partials from helpers (Algorithm 2, t < P/2).
    if (w == 3) {
      EXPECT_EQ(merges, 1);
    }
  }
  // Constant V rows of 1: every output is exactly 1.
  for (float o : sim->out) ASSERT_NEAR(o, 1.f, 1e-6);
}

// The first call on a row writes it (no zeroing per pass); a call that covers rows of which only
// some hold a partial initialises the others first. A hand plan (P = 1, full mask, batch 2) whose
// second op covers written and unwritten rows must give the one-op plan's output.
TEST(PlanExecutorTest, CallsOverPartlyWrittenRowsInitialiseTheRest) {
  const Plan pieces =
      OneWorkerPlan(16, false, {{{{8, 16}, {0, 8}}}, {{{0, 16}, {8, 16}}}, {{{0, 8}, {0, 8}}}});
  const Plan whole = OneWorkerPlan(16, false, {{{{0, 16}, {0, 16}}}});
  AttentionShape shape{2, 2, 1, 8, DType::kF32};
  const size_t nq = 2 * 16 * 2 * 8, nk = 2 * 16 * 8;
  SimulationInputs in;
  for (size_t i = 0; i < nq; ++i) in.q.push_back(static_cast<float>((i * 37) % 11) / 11 - 0.5f);
  for (size_t i = 0; i < nk; ++i) in.k.push_back(static_cast<float>((i * 53) % 13) / 13 - 0.5f);
  for (size_t i = 0; i < nk; ++i) in.v.push_back(static_cast<float>((i * 29) % 7) / 7 - 0.5f);
  in.dout.assign(nq, 0.25f);
  auto a = Simulate(pieces, shape, in);
  auto b = Simulate(whole, shape, in);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(a->out.size(), b->out.size());
  for (size_t i = 0; i < a->out.size(); ++i) ASSERT_NEAR(a->out[i], b->out[i], 1e-5) << i;
  for (size_t i = 0; i < a->lse.size(); ++i) ASSERT_NEAR(a->lse[i], b->lse[i], 1e-5) << i;
}

// A bf16 forward whose rows each get one call and no partial (one worker, one op: the executor
// writes O in bf16 straight into storage, no fp32 accumulator) equals the same pass done in
// pieces through the accumulator (merges in fp32, one rounding at the end) to bf16 rounding.
TEST(PlanExecutorTest, SingleWriterBf16ForwardMatchesAccumulatedPieces) {
  AttentionShape shape{2, 4, 2, 16, DType::kBF16};
  const size_t nq = 2 * 24 * 4 * 16, nk = 2 * 24 * 2 * 16;
  SimulationInputs in;
  for (size_t i = 0; i < nq; ++i) in.q.push_back(static_cast<float>((i * 37) % 11) / 11 - 0.5f);
  for (size_t i = 0; i < nk; ++i) in.k.push_back(static_cast<float>((i * 53) % 13) / 13 - 0.5f);
  for (size_t i = 0; i < nk; ++i) in.v.push_back(static_cast<float>((i * 29) % 7) / 7 - 0.5f);
  in.dout.assign(nq, 0.25f);
  for (bool causal : {true, false}) {
    // Disjoint query ranges, one op each: single writer (the second op's rows see all keys).
    const Plan direct = OneWorkerPlan(24, causal, {{{{0, 10}, {0, 24}}}, {{{10, 24}, {0, 24}}}});
    const Plan pieces = OneWorkerPlan(24, causal, {{{{0, 24}, {0, 12}}}, {{{0, 24}, {12, 24}}}});
    auto a = Simulate(direct, shape, in);
    auto b = Simulate(pieces, shape, in);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_EQ(a->out.size(), b->out.size());
    for (size_t i = 0; i < a->out.size(); ++i) {
      ASSERT_NEAR(a->out[i], b->out[i], 1e-2 * (1 + std::abs(b->out[i]))) << i << " causal " << causal;
    }
    for (size_t i = 0; i < a->lse.size(); ++i) ASSERT_NEAR(a->lse[i], b->lse[i], 1e-4) << i;
    for (size_t i = 0; i < a->dq.size(); ++i) {
      ASSERT_NEAR(a->dq[i], b->dq[i], 2e-2 * (1 + std::abs(b->dq[i]))) << i;
    }
  }
}

}  // namespace
}  // namespace dfa
