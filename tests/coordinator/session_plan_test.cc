// MakeSessionPlan picks the cost profile from the placed workers' backend: GPU ("cuda")
// sessions get the GPU profile's few-op plan, CPU sessions the CPU profile's plan as before.
#include "coordinator/session_plan.h"

#include <algorithm>

#include "core/planner/planner.h"
#include "coordinator/session_memory.h"
#include "gtest/gtest.h"

namespace dfa {
namespace {

v1::AttentionSpec Spec(int64_t seq_len) {
  v1::AttentionSpec spec;
  spec.set_batch(1);
  spec.set_q_heads(32);
  spec.set_kv_heads(32);
  spec.set_head_dim(128);
  spec.set_seq_len(seq_len);
  spec.set_causal(true);
  spec.set_dtype(v1::DTYPE_BF16);
  return spec;
}

int MaxForwardOps(const v1::Plan& plan) {
  int most = 0;
  for (const v1::WorkerPlan& w : plan.workers()) {
    int ops = 0;
    for (const v1::PlanStep& s : w.forward_steps()) ops += s.computes_size();
    most = std::max(most, ops);
  }
  return most;
}

TEST(SessionPlanTest, CudaWorkersGetTheGpuProfilesPlan) {
  const v1::AttentionSpec spec = Spec(16384);
  absl::StatusOr<SessionPlan> gpu = MakeSessionPlan(spec, "balanced", {1, 1}, "cuda");
  absl::StatusOr<SessionPlan> cpu = MakeSessionPlan(spec, "", {1, 1}, "cpu");
  absl::StatusOr<SessionPlan> dflt = MakeSessionPlan(spec, "balanced", {1, 1});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ASSERT_TRUE(cpu.ok() && dflt.ok());
  EXPECT_LE(MaxForwardOps(gpu->plan), 8);
  EXPECT_GT(MaxForwardOps(cpu->plan), MaxForwardOps(gpu->plan));
  EXPECT_EQ(dflt->plan.SerializeAsString(), cpu->plan.SerializeAsString());

  // The same plan the planner makes for the GPU profile with the session's shape.
  PlanRequest r;
  r.workers = 2;
  r.seq_len = 16384;
  r.profile = "gpu";
  r.shape = AttentionShape{1, 32, 32, 128, DType::kBF16};
  absl::StatusOr<Plan> direct = MakePlan(r);
  ASSERT_TRUE(direct.ok());
  int most = 0;
  for (const WorkerPlan& w : direct->workers) {
    int ops = 0;
    for (const PlanStep& s : w.forward) ops += static_cast<int>(s.computes.size());
    most = std::max(most, ops);
  }
  EXPECT_EQ(MaxForwardOps(gpu->plan), most);
  ASSERT_EQ(gpu->bytes_per_rank.size(), 2u);
}

// "heads": each rank holds all rows of half the heads, its bytes count only those heads;
// "auto" picks it for cuda workers at 16K; unknown names are refused naming the field.
TEST(SessionPlanTest, HeadsSplitsTheHeadsAndCountsTheLocalBytes) {
  const v1::AttentionSpec spec = Spec(16384);
  for (const char* schedule : {"heads", "auto"}) {
    absl::StatusOr<SessionPlan> p = MakeSessionPlan(spec, schedule, {1, 1}, "cuda");
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->plan.schedule(), "heads") << schedule;
    ASSERT_EQ(p->plan.workers_size(), 2);
    v1::AttentionSpec half = spec;
    half.set_q_heads(16);
    half.set_kv_heads(16);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(p->plan.workers(r).kv_heads().begin(), 16 * r);
      EXPECT_EQ(p->plan.workers(r).kv_heads().end(), 16 * r + 16);
      // All rows of half the heads, no transfers: the storage with a chunked backward (fp32 dQ
      // over O, no fp32 dK, dV) and one key chunk of fp32 dK, dV.
      const AttentionShape local = ShapeOf(half);
      EXPECT_EQ(p->bytes_per_rank[r],
                SessionStorageLayout(local, 16384, StorageLayout{false, false}).total +
                    KeyChunkBytes(local, std::min<int64_t>(16384, kDefaultStepTokens)))
          << r;
    }
  }
  absl::StatusOr<SessionPlan> cpu = MakeSessionPlan(spec, "heads", {1, 1}, "cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_TRUE(cpu->plan.workers(1).has_kv_heads());
  absl::StatusOr<SessionPlan> bad = MakeSessionPlan(spec, "ulysses", {1, 1}, "cuda");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("schedule"), absl::string_view::npos) << bad.status();
}

}  // namespace
}  // namespace dfa
