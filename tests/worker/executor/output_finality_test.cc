// When a pass's owned output rows are final (worker/executor/output_finality.h), on the plans
// of every sequence schedule as the executor runs them (CutTransfers): each owned row is
// announced at most once, no later step touches a row announced at step t, and under
// distflash the first worker's forward rows are final after its first step. Prints, per
// schedule, the share of owned rows final before the last step (the rows a download can take
// while the job runs).
// (A chunked backward's keys are announced at its end whatever the plan says: not covered.)
#include "worker/executor/output_finality.h"

#include <cstdio>
#include <string>
#include <vector>

#include "core/planner/planner.h"
#include "core/planner/worker_memory.h"
#include "gtest/gtest.h"

namespace dfa::executor_internal {
namespace {

Plan RunPlan(const std::string& schedule, int P, int64_t S) {
  PlanRequest req;
  req.schedule = schedule;
  req.workers = P;
  req.seq_len = S;
  req.causal = true;
  auto plan = MakePlan(req);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? CutTransfers(*plan, TransferCut{}) : Plan{};
}

// Whether step s of worker w touches global rows of `r` on `side` (the rules of the header).
bool Touches(const PlanStep& s, bool forward, bool keys, const RowRange& r) {
  auto meets = [&](const RowRange& x) { return x.begin < r.end && r.begin < x.end; };
  for (const ComputeOp& op : s.computes) {
    if (meets(keys ? op.kv_rows : op.q_rows)) return true;
  }
  for (const Transfer& t : s.recvs) {
    const PlanTensor want = keys      ? PlanTensor::kDkvPartial
                            : forward ? PlanTensor::kOutPartial
                                      : PlanTensor::kDqPartial;
    if (t.tensor == want && meets(t.rows)) return true;
  }
  if (!forward) {
    for (const Transfer& t : s.sends) {
      if (t.tensor == (keys ? PlanTensor::kKV : PlanTensor::kGradIn) && meets(t.rows)) return true;
    }
  }
  return false;
}

TEST(OutputFinalityTest, RowsAreAnnouncedOnceAndNeverTouchedAfter) {
  for (const char* schedule : {"ring", "distflash", "zigzag", "balanced"}) {
    for (int P : {2, 4, 8}) {
      const Plan plan = RunPlan(schedule, P, 64 * P + 16);
      for (bool forward : {true, false}) {
        int64_t owned_rows = 0, early = 0, early_keys = 0;
        for (int w = 0; w < plan.num_workers(); ++w) {
          const WorkerPlan& wp = plan.workers[w];
          const auto& steps = forward ? wp.forward : wp.backward;
          const OutputFinality f = FinalRowsByStep(plan, w, forward);
          int64_t n = 0;
          for (const RowRange& o : wp.owned) n += o.size();
          owned_rows += n;
          for (bool keys : {false, true}) {
            if (forward && keys) continue;
            const auto& by_step = keys ? f.keys : f.queries;
            ASSERT_EQ(by_step.size(), steps.size());
            std::vector<int> seen(static_cast<size_t>(n), 0);
            for (size_t t = 0; t < by_step.size(); ++t) {
              for (const RowRange& local : by_step[t]) {
                for (int64_t i = local.begin; i < local.end; ++i) ++seen[static_cast<size_t>(i)];
                const RowRange g = GlobalRows(wp.owned, local);
                EXPECT_EQ(g.size(), local.size());
                for (size_t u = t + 1; u < steps.size(); ++u) {
                  EXPECT_FALSE(Touches(steps[u], forward, keys, g))
                      << schedule << " P=" << P << " worker " << w << " rows [" << g.begin << ", "
                      << g.end << ") announced at step " << t << ", touched at " << u;
                }
                if (t + 1 < by_step.size()) (keys ? early_keys : early) += local.size();
              }
            }
            for (int c : seen) EXPECT_LE(c, 1) << schedule << " P=" << P << " worker " << w;
          }
        }
        std::printf("%-9s P=%d %-8s rows final before the last step: queries %5.1f%%", schedule, P,
                    forward ? "forward" : "backward",
                    100.0 * static_cast<double>(early) / static_cast<double>(owned_rows));
        if (!forward) {
          std::printf(", keys %5.1f%%",
                      100.0 * static_cast<double>(early_keys) / static_cast<double>(owned_rows));
        }
        std::printf("\n");
      }
    }
  }
}

TEST(OutputFinalityTest, DistFlashFirstWorkersForwardRowsAreFinalAfterItsFirstStep) {
  const Plan plan = RunPlan("distflash", 2, 512);
  int first = 0;
  for (int w = 0; w < plan.num_workers(); ++w) {
    if (plan.workers[w].owned[0].begin == 0) first = w;
  }
  const OutputFinality f = FinalRowsByStep(plan, first, /*forward=*/true);
  ASSERT_GE(f.queries.size(), 2u);
  int64_t rows = 0;
  for (const RowRange& r : f.queries[0]) rows += r.size();
  EXPECT_EQ(rows, plan.workers[first].owned[0].size());
}

}  // namespace
}  // namespace dfa::executor_internal
