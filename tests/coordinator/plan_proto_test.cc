#include "coordinator/planner/plan_checker.h"
#include "coordinator/planner/plan_proto.h"
#include "coordinator/planner/planner.h"
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
    if (x.owned != y.owned || x.forward.size() != y.forward.size() ||
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
