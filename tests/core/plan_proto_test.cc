#include "core/planner/plan_checker.h"
#include "core/planner/plan_proto.h"
#include "core/planner/planner.h"
#include "gtest/gtest.h"

namespace dfa {
namespace {

bool SamePlan(const Plan& a, const Plan& b) {
  if (a.schedule != b.schedule || a.seq_len != b.seq_len || a.causal != b.causal ||
      a.num_workers() != b.num_workers()) {
    return false;
  }
  for (int w = 0; w < a.num_workers(); ++w) {
    const WorkerPlan &x = a.workers[w], &y = b.workers[w];
    if (x.owned != y.owned || x.kv_heads != y.kv_heads || x.forward.size() != y.forward.size() ||
        x.backward.size() != y.backward.size()) {
      return false;
    }
    for (auto [p, q] : {std::pair{&x.forward, &y.forward}, std::pair{&x.backward, &y.backward}}) {
      for (size_t t = 0; t < p->size(); ++t) {
        if ((*p)[t].sends != (*q)[t].sends || (*p)[t].recvs != (*q)[t].recvs ||
            (*p)[t].computes != (*q)[t].computes) {
          return false;
        }
      }
    }
  }
  return true;
}

TEST(PlanProtoTest, RoundTripsEverySchedule) {
  for (const char* s : {"ring", "distflash", "zigzag", "balanced"}) {
    auto plan = MakePlan({s, 4, 1000, true, {}});
    ASSERT_TRUE(plan.ok());
    v1::Plan proto;
    PlanToProto(*plan, &proto);
    EXPECT_EQ(proto.workers_size(), 4);
    auto back = PlanFromProto(proto);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(SamePlan(*plan, *back)) << s;
    EXPECT_TRUE(CheckPlan(*back).ok());
  }
}

// Transfer::lead travels (a striped ring whose pieces are posted a step early), and a bad one
// is refused by CheckPlan: a piece forwarded before it arrived.
TEST(PlanProtoTest, LeadRoundTripsAndForwardingTooEarlyIsRefused) {
  PlanRequest r{"balanced", 3, 600, true, {1, 1, 1}};
  Plan plan = MakeStripedRingPlan(r, {2, 2, 2}, /*kv_stationary_backward=*/true, /*lead=*/1);
  ASSERT_TRUE(CheckPlan(plan).ok()) << CheckPlan(plan).status();
  v1::Plan proto;
  PlanToProto(plan, &proto);
  auto back = PlanFromProto(proto);
  ASSERT_TRUE(back.ok()) << back.status();
  int leads = 0;
  for (size_t w = 0; w < plan.workers.size(); ++w) {
    for (size_t t = 0; t < plan.workers[w].forward.size(); ++t) {
      EXPECT_EQ(plan.workers[w].forward[t].recvs, back->workers[w].forward[t].recvs);
      for (const Transfer& x : plan.workers[w].forward[t].recvs) leads += x.lead;
    }
  }
  EXPECT_GT(leads, 0);
  // One piece per worker: each forwarded piece arrives at its sender only in the step before,
  // so posting it one step earlier forwards what is not there yet.
  Plan bad = MakeStripedRingPlan(r, {1, 1, 1}, true, 0);
  bool changed = false;
  for (size_t t = 2; t < bad.workers[1].forward.size() && !changed; ++t) {
    for (Transfer& x : bad.workers[1].forward[t].recvs) {
      if (x.tensor != PlanTensor::kKV || OwnerOf(bad, x.rows.begin) == x.peer) continue;
      x.lead = 1;  // the sender, worker 0, forwards a piece it receives at step t - 1
      for (Transfer& y : bad.workers[0].forward[t].sends) {
        if (y.peer == 1 && y.rows == x.rows) y.lead = 1;
      }
      changed = true;
      break;
    }
  }
  ASSERT_TRUE(changed);
  const absl::Status st = CheckPlan(bad).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("post step"), absl::string_view::npos) << st;
}

// Head groups travel: every worker's kv head range comes back; plans without ranges stay
// without (no kv_heads field set).
TEST(PlanProtoTest, KvHeadsRoundTrip) {
  PlanRequest r{"heads", 4, 1000, true, {}};
  r.shape = AttentionShape{1, 8, 4, 64, DType::kBF16};
  auto plan = MakePlan(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  v1::Plan proto;
  PlanToProto(*plan, &proto);
  EXPECT_TRUE(proto.workers(3).has_kv_heads());
  auto back = PlanFromProto(proto);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(SamePlan(*plan, *back));
  EXPECT_EQ(back->workers[0].kv_heads, (HeadRange{0, 1}));
  EXPECT_EQ(back->workers[3].kv_heads, (HeadRange{3, 4}));
  CheckOptions check;
  check.shape = r.shape;
  EXPECT_TRUE(CheckPlan(*back, check).ok()) << CheckPlan(*back, check).status();

  auto ring = MakePlan({"ring", 2, 100, true, {}});
  PlanToProto(*ring, &proto);
  EXPECT_FALSE(proto.workers(0).has_kv_heads());
  proto.mutable_workers(1)->mutable_kv_heads()->set_begin(3);
  proto.mutable_workers(1)->mutable_kv_heads()->set_end(2);
  auto bad = PlanFromProto(proto);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("workers[1].kv_heads"), absl::string_view::npos)
      << bad.status();
}

TEST(PlanProtoTest, RejectsBadFieldsByName) {
  auto plan = MakePlan({"ring", 2, 100, true, {}});
  v1::Plan proto;
  PlanToProto(*plan, &proto);
  proto.mutable_workers(1)->mutable_forward_steps(1)->mutable_recvs(0)->set_tensor(
      static_cast<v1::PlanTensor>(42));
  auto r = PlanFromProto(proto);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("workers[1].forward_steps[1].recvs[0].tensor"),
            absl::string_view::npos)
      << r.status();
}

}  // namespace
}  // namespace dfa
