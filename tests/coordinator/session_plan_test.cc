// MakeSessionPlan picks the cost profile from the placed workers' backend: GPU ("cuda")
// sessions get the GPU profile's few-op plan, CPU sessions the CPU profile's plan as before.
#include "coordinator/session_plan.h"

#include <algorithm>

#include "coordinator/planner/planner.h"
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

}  // namespace
}  // namespace dfa
