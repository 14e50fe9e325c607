// The planner under document and window masks (PlanRequest::mask_spec): every schedule's plan is
// exact (checked here by brute force over every (batch row, query, key), independently of
// CheckPlan), plans no unit the mask hides, and the cost model counts visible pairs only;
// CheckPlan refuses masked plans that double, miss or waste units; `balanced` divides the
// visible pairs by speed.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <string>
#include <vector>

#include "core/planner/cost_model.h"
#include "core/planner/doc_lengths.h"
#include "core/planner/plan_checker.h"
#include "core/planner/planner.h"
#include "gtest/gtest.h"

namespace dfa {
namespace {

// Whether query i of batch row b sees key j, straight from the definition in core/mask.h.
bool Sees(const MaskSpec& m, int b, int64_t i, int64_t j) {
  const std::vector<int64_t>& off = m.OffsetsOf(b);
  auto doc = [&](int64_t p) {
    int d = 0;
    while (off.size() >= 2 && d + 2 < static_cast<int>(off.size()) && off[d + 1] <= p) ++d;
    return d;
  };
  if (doc(i) != doc(j)) return false;
  if (m.causal && j > i) return false;
  if (m.window_left >= 0 && j < i - m.window_left) return false;
  if (m.window_right >= 0 && j > i + m.window_right) return false;
  return true;
}

struct MaskCase {
  std::string name;
  bool causal;
  std::vector<std::vector<int64_t>> lengths;  // per batch row (empty: no documents)
  int64_t left = -1, right = -1;
};

MaskSpec SpecOf(const MaskCase& c) {
  MaskSpec m;
  m.causal = c.causal;
  for (const std::vector<int64_t>& row : c.lengths) m.doc_offsets.push_back(DocOffsetsOf(row));
  m.window_left = c.left;
  m.window_right = c.right;
  return m;
}

// Lengths summing to S: the pattern repeated (cut at the end).
std::vector<int64_t> Lengths(int64_t S, const std::vector<int64_t>& pattern) {
  std::vector<int64_t> out;
  int64_t left = S;
  for (size_t k = 0; left > 0; ++k) {
    out.push_back(std::min(left, pattern[k % pattern.size()]));
    left -= out.back();
  }
  return out;
}

std::vector<MaskCase> Cases(int64_t S) {
  return {
      {"docs_causal", true, {Lengths(S, {13, 1, 40, 7, 3, 90, 2})}},
      {"docs_full", false, {Lengths(S, {31, 5, 1, 64, 9})}},
      {"one_token_docs", true, {Lengths(S, {1})}},
      {"window_causal", true, {}, 11, 0},
      {"window_full", false, {}, 6, 3},
      {"docs_window_causal", true, {Lengths(S, {50, 3, 120, 17})}, 9, 0},
      {"docs_window_full", false, {Lengths(S, {25, 70, 2})}, 4, 8},
      {"per_row_docs", true, {Lengths(S, {20, 3, 60}), Lengths(S, {7, 100, 1})}},
  };
}

// Every visible pair of every batch row computed exactly once per pass in each head group,
// every op with a visible pair: by brute force.
void ExpectExact(const Plan& plan, const MaskSpec& mask, int rows) {
  const int64_t S = plan.seq_len;
  std::vector<std::pair<int, int>> groups;
  for (const WorkerPlan& w : plan.workers) groups.emplace_back(w.kv_heads.begin, w.kv_heads.end);
  std::sort(groups.begin(), groups.end());
  groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
  for (const auto& group : groups) for (bool fwd : {true, false}) {
    SCOPED_TRACE(::testing::Message() << (fwd ? "forward" : "backward") << " heads ["
                                      << group.first << ", " << group.second << ")");
    std::vector<std::vector<int>> count(rows, std::vector<int>(S * S, 0));
    for (const WorkerPlan& w : plan.workers) {
      if (std::make_pair(w.kv_heads.begin, w.kv_heads.end) != group) continue;
      for (const PlanStep& s : fwd ? w.forward : w.backward) {
        for (const ComputeOp& c : s.computes) {
          bool any = false;
          for (int b = 0; b < rows; ++b) {
            for (int64_t i = c.q_rows.begin; i < c.q_rows.end; ++i) {
              for (int64_t j = c.kv_rows.begin; j < c.kv_rows.end; ++j) {
                if (Sees(mask, b, i, j)) {
                  ++count[b][i * S + j];
                  any = true;
                }
              }
            }
          }
          EXPECT_TRUE(any) << "unit q[" << c.q_rows.begin << "," << c.q_rows.end << ") x kv["
                           << c.kv_rows.begin << "," << c.kv_rows.end << ") sees nothing";
        }
      }
    }
    int wrong = 0;
    for (int b = 0; b < rows; ++b) {
      for (int64_t i = 0; i < S; ++i) {
        for (int64_t j = 0; j < S; ++j) {
          const int want = Sees(mask, b, i, j) ? 1 : 0;
          if (want == 1 && count[b][i * S + j] != 1 && ++wrong <= 3) {
            ADD_FAILURE() << "row " << b << " pair (" << i << ", " << j << ") computed "
                          << count[b][i * S + j] << " times";
          }
        }
      }
    }
    EXPECT_EQ(wrong, 0);
  }
}

TEST(PlannerMaskTest, EveryScheduleIsExactUnderDocumentsAndWindows) {
  for (int P : {1, 2, 3, 5, 8}) {
    const int64_t S = 23 * P + 37;
    for (const MaskCase& c : Cases(S)) {
      const int rows = static_cast<int>(std::max<size_t>(1, c.lengths.size()));
      for (const char* schedule : {"ring", "distflash", "zigzag", "balanced", "heads"}) {
        if (std::string(schedule) == "distflash" && P % 2 != 0) continue;
        SCOPED_TRACE(::testing::Message() << "P=" << P << " " << c.name << " " << schedule);
        PlanRequest r;
        r.schedule = schedule;
        r.workers = P;
        r.seq_len = S;
        r.causal = c.causal;
        r.mask_spec = SpecOf(c);
        r.shape = AttentionShape{rows, 8, 4, 16, DType::kBF16};
        r.session_shape = r.shape;
        if (std::string(schedule) == "balanced" && P >= 3) {
          for (int w = 0; w < P; ++w) r.speeds.push_back(1.0 + 0.5 * (w % 3));
        }
        absl::StatusOr<Plan> plan = MakePlan(r);
        ASSERT_TRUE(plan.ok()) << plan.status();
        EXPECT_FALSE(plan->dense());
        EXPECT_EQ(plan->mask(), MaskKind::kIntervals);
        absl::StatusOr<CheckReport> check = CheckPlan(*plan, CheckOptions{r.shape});
        ASSERT_TRUE(check.ok()) << check.status();
        ExpectExact(*plan, plan->Mask(), rows);
      }
    }
  }
}

// The packed-document plan (MakeDocumentPlan: long documents striped on their own workers, the
// short ones packed whole or cut contiguously) in every variant the balanced search tries, equal
// and unequal speeds, causal and full: exact by brute force and CheckPlan-valid, with the
// K/V-stationary ring backwards and the derived ones.
TEST(PlannerMaskTest, DocumentPlansAreExact) {
  for (int P = 2; P <= 8; ++P) {
    const int64_t S = 40 * P + 100;
    // Two long documents (one over several workers), then short ones of 1..13 tokens.
    std::vector<int64_t> lengths = {16 * P + 20, 7 * P + 9};
    for (int64_t left = S - lengths[0] - lengths[1], k = 0; left > 0; ++k) {
      const int64_t pattern[] = {1, 7, 3, 13, 2, 5};
      lengths.push_back(std::min(left, pattern[k % 6]));
      left -= lengths.back();
    }
    std::rotate(lengths.begin(), lengths.begin() + 1, lengths.begin() + 4);  // long ones inside
    for (bool causal : {true, false}) {
      for (bool unequal : {false, true}) {
        PlanRequest r;
        r.workers = P;
        r.seq_len = S;
        r.causal = causal;
        r.mask_spec.causal = causal;
        r.mask_spec.doc_offsets = {DocOffsetsOf(lengths)};
        r.shape = AttentionShape{1, 8, 4, 16, DType::kBF16};
        if (unequal) {
          for (int w = 0; w < P; ++w) r.speeds.push_back(1.0 + 0.5 * (w % 3));
        }
        ASSERT_TRUE(DocumentPlanApplies(r));
        int made = 0;
        for (double long_fraction : {0.5, 1.0, 4.0}) {
          for (int pieces : {1, 2}) {
            for (bool kvs : {false, true}) {
              for (double tail : {0.0, 0.5}) {
                // Short documents packed, grouped, packed over the ring workers too, binned
                // (the last three at the search's long_fraction and tail only: test time).
                for (int placement = 0; placement < 4; ++placement) {
                  if (placement > 0 && (long_fraction != 1.0 || tail != 0.5)) continue;
                  SCOPED_TRACE(::testing::Message()
                               << "P=" << P << (causal ? " causal" : " full")
                               << (unequal ? " unequal" : " equal") << " long " << long_fraction
                               << " pieces " << pieces << " kvs " << kvs << " tail " << tail
                               << " placement " << placement);
                  Plan plan = MakeDocumentPlan(
                      r, DocumentOptions{long_fraction, pieces, pieces - 1, tail, kvs,
                                         placement == 1, placement == 2, placement == 3});
                  if (plan.workers.empty()) continue;
                  ++made;
                  if (!HasBackwardSteps(plan)) DeriveBackwardSteps(plan);
                  absl::StatusOr<CheckReport> check = CheckPlan(plan, CheckOptions{r.shape});
                  ASSERT_TRUE(check.ok()) << check.status();
                  ExpectExact(plan, plan.Mask(), 1);
                  if (long_fraction == 1.0) {  // the longest document is split: a ring
                    const int64_t begin = lengths[0] + lengths[1];  // (after the rotation)
                    std::vector<int> owners;
                    for (int64_t row = begin; row < begin + 16 * P + 20; ++row) {
                      owners.push_back(OwnerOf(plan, row));
                    }
                    std::sort(owners.begin(), owners.end());
                    owners.erase(std::unique(owners.begin(), owners.end()), owners.end());
                    EXPECT_GE(owners.size(), 2u);
                  }
                }
              }
            }
          }
        }
        EXPECT_GT(made, 0) << "P=" << P;
      }
    }
  }
  // Not for windows, per-row documents or one document.
  PlanRequest r;
  r.workers = 2;
  r.seq_len = 100;
  r.mask_spec.causal = true;
  r.mask_spec.doc_offsets = {{0, 60, 100}};
  EXPECT_TRUE(DocumentPlanApplies(r));
  r.mask_spec.window_left = 8;
  EXPECT_FALSE(DocumentPlanApplies(r));
  r.mask_spec.window_left = -1;
  r.mask_spec.doc_offsets = {{0, 60, 100}, {0, 30, 100}};
  EXPECT_FALSE(DocumentPlanApplies(r));
  r.mask_spec.doc_offsets = {{0, 100}};
  EXPECT_FALSE(DocumentPlanApplies(r));
}

TEST(PlannerMaskTest, CostModelCountsVisiblePairsOnly) {
  const int64_t S = 300;
  for (const MaskCase& c : Cases(S)) {
    SCOPED_TRACE(c.name);
    const int rows = static_cast<int>(std::max<size_t>(1, c.lengths.size()));
    const MaskSpec mask = SpecOf(c);
    int64_t visible = 0;
    for (int b = 0; b < rows; ++b) {
      for (int64_t i = 0; i < S; ++i) {
        for (int64_t j = 0; j < S; ++j) visible += Sees(mask, b, i, j) ? 1 : 0;
      }
    }
    PlanRequest r;
    r.workers = 3;
    r.seq_len = S;
    r.causal = c.causal;
    r.mask_spec = mask;
    r.shape = AttentionShape{rows, 4, 4, 32, DType::kBF16};
    absl::StatusOr<Plan> plan = MakePlan(r);
    ASSERT_TRUE(plan.ok()) << plan.status();
    CostParams params = CpuCostParams(r.shape);
    params.bandwidth_bytes_per_second = 0;  // compute only
    absl::StatusOr<PlanCost> cost = EstimateCost(*plan, params);
    ASSERT_TRUE(cost.ok()) << cost.status();
    // Ideal = all visible pairs' FLOPs at the summed speed (3 workers of speed 1).
    const double flops = 4.0 * r.shape.q_heads * r.shape.head_dim * static_cast<double>(visible);
    EXPECT_NEAR(cost->forward.ideal_seconds, flops / params.flops_per_second / 3,
                1e-9 * cost->forward.ideal_seconds);
    EXPECT_NEAR(cost->backward.ideal_seconds, 2.5 * flops / params.flops_per_second / 3,
                1e-9 * cost->backward.ideal_seconds);
    // UnitPairs: the mean over batch rows.
    EXPECT_DOUBLE_EQ(UnitPairs(*plan)({0, S}, {0, S}), static_cast<double>(visible) / rows);
  }
}

// A masked plan with one op doubled, one dropped, and one op that sees nothing added: refused,
// naming what is wrong.
TEST(PlannerMaskTest, CheckerRefusesDoubledMissedAndHiddenUnits) {
  const int64_t S = 400;
  PlanRequest r;
  r.workers = 2;
  r.seq_len = S;
  r.causal = true;
  r.mask_spec.causal = true;
  r.mask_spec.doc_offsets = {{0, 100, 250, 400}};
  r.mask_spec.window_left = 60;
  r.mask_spec.window_right = 0;
  r.schedule = "ring";
  absl::StatusOr<Plan> base = MakePlan(r);
  ASSERT_TRUE(base.ok()) << base.status();
  ASSERT_TRUE(CheckPlan(*base).ok());
  // Worker 0's first forward op.
  ASSERT_FALSE(base->workers[0].forward[0].computes.empty());
  {
    Plan p = *base;
    p.workers[0].forward[0].computes.push_back(p.workers[0].forward[0].computes[0]);
    absl::Status s = CheckPlan(p).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("2 times"), std::string::npos) << s;
  }
  {
    Plan p = *base;
    p.workers[0].forward[0].computes.erase(p.workers[0].forward[0].computes.begin());
    absl::Status s = CheckPlan(p).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("never attend"), std::string::npos) << s;
  }
  {
    // Rows 150..160 (document [100, 250)) against keys 0..50 (document [0, 100)): hidden.
    Plan p = *base;
    p.workers[0].forward[0].computes.push_back(ComputeOp{{150, 160}, {0, 50}});
    absl::Status s = CheckPlan(p).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("no visible pair"), std::string::npos) << s;
    EXPECT_NE(s.message().find("worker 0 forward step 0"), std::string::npos) << s;
  }
  {
    // Keys outside the window but inside the document: also hidden, refused.
    Plan p = *base;
    p.workers[0].forward[0].computes.push_back(ComputeOp{{240, 250}, {100, 120}});
    EXPECT_FALSE(CheckPlan(p).ok());
  }
}

TEST(PlannerMaskTest, RequestsWithBadMasksAreRefusedNamingTheField) {
  PlanRequest r;
  r.workers = 2;
  r.seq_len = 100;
  r.mask_spec.causal = true;
  r.mask_spec.doc_offsets = {{0, 60, 50, 100}};
  absl::Status s = ValidatePlanRequest(r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("mask_spec.doc_offsets[0][2]"), std::string::npos) << s;
  r.mask_spec.doc_offsets = {{0, 60, 90}};
  s = ValidatePlanRequest(r);
  EXPECT_NE(s.message().find("mask_spec.doc_offsets[0][2]"), std::string::npos) << s;
  r.mask_spec.doc_offsets = {{0, 60, 100}};
  r.mask_spec.causal = false;  // differs from r.causal (true)
  s = ValidatePlanRequest(r);
  EXPECT_NE(s.message().find("mask_spec.causal"), std::string::npos) << s;
  r.mask_spec.causal = true;
  r.mask_spec.window_left = -5;
  s = ValidatePlanRequest(r);
  EXPECT_NE(s.message().find("mask_spec.window_left"), std::string::npos) << s;
  r.mask_spec.window_left = 10;
  EXPECT_TRUE(ValidatePlanRequest(r).ok());
}

// `balanced` gives every worker visible pairs in proportion to its speed (compute only, free
// communication), for documents and windows alike, and the contiguous shards receive only the
// keys their queries see.
TEST(PlannerMaskTest, BalancedDividesVisiblePairsBySpeed) {
  const int64_t S = 64 * 1024;
  const std::vector<MaskCase> cases = {
      {"pareto_docs", true, {ParetoDocumentLengths(S, 1.2, 256, 16384, 7)}},
      {"window", true, {}, 2048, 0},
      {"docs_window_full", false, {ParetoDocumentLengths(S, 1.2, 64, 8192, 3)}, 512, 512}};
  for (const MaskCase& c : cases) {
    for (int P : {2, 3, 7, 16}) {
      SCOPED_TRACE(::testing::Message() << c.name << " P=" << P);
      PlanRequest r;
      r.workers = P;
      r.seq_len = S;
      r.causal = c.causal;
      r.mask_spec = SpecOf(c);
      for (int w = 0; w < P; ++w) r.speeds.push_back(1.0 + (w % 2));
      Plan plan = MakeSpeedProportionalPlan(r);
      DeriveBackwardSteps(plan);
      ASSERT_TRUE(CheckPlan(plan).ok());
      CostParams params = CpuCostParams(r.shape, r.speeds);
      params.bandwidth_bytes_per_second = 0;
      absl::StatusOr<PlanCost> cost = EstimateCost(plan, params);
      ASSERT_TRUE(cost.ok());
      EXPECT_LT(cost->forward.compute_makespan_ratio, 1.01);
      EXPECT_LT(cost->backward.compute_makespan_ratio, 1.01);
      // No worker receives more keys than its queries see.
      const UnitPairs pairs(plan);
      for (int w = 0; w < P; ++w) {
        for (const PlanStep& s : plan.workers[w].forward) {
          for (const Transfer& x : s.recvs) {
            EXPECT_EQ(pairs.KeysSeen(plan.workers[w].owned[0], x.rows), x.rows);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace dfa

namespace dfa {
namespace {

// The masked targets of docs/planner.md ("Masked plans"), in the cost model with communication:
// S = 256K, causal, 32 x 128 heads, bf16, profile cpu, equal speeds; forward and backward within
// 3% of ideal. A few P of each (the search takes ~1 s per P at 256K; dfa-plan-sweep prints all
// of P = 1..64): windows of 4K and 32K keys, and the long-tailed documents
// (ParetoDocumentLengths(S, 1.2, 256, 64K, seed 1): one 64K document holds 75% of the work) at
// a few P (planner_sweep_test samples P up to 64).
double WorstRatio(const MaskSpec& mask, int P) {
  const int64_t S = 262144;
  PlanRequest r;
  r.workers = P;
  r.seq_len = S;
  r.causal = mask.causal;
  r.mask_spec = mask;
  r.session_shape = r.shape;
  absl::StatusOr<Plan> plan = MakePlan(r);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return 1e9;
  EXPECT_TRUE(CheckPlan(*plan, CheckOptions{r.shape}).ok());
  absl::StatusOr<PlanCost> cost = EstimateCost(*plan, CpuCostParams(r.shape));
  EXPECT_TRUE(cost.ok());
  return std::max(cost->forward.makespan_ratio, cost->backward.makespan_ratio);
}

TEST(PlannerMaskTargetTest, WindowsAreWithinThreePercentAt256K) {
  // (The full P = 1..64 tables: dfa-plan-sweep --window W, docs/planner.md.)
  for (const auto& [window, P] : {std::pair<int64_t, int>{4096, 16}, {4096, 64}, {32768, 3},
                                  {32768, 47}}) {
    MaskSpec mask;
    mask.causal = true;
    mask.window_left = window;
    mask.window_right = 0;
    EXPECT_LE(WorstRatio(mask, P), 1.03) << "window " << window << " P=" << P;
  }
}

TEST(PlannerMaskTargetTest, LongTailedDocumentsAreWithinThreePercent) {
  // P = 3, 7, 10 and P the packed-document plan needs its rest spread over the ring workers'
  // free shares for (11, 15: the long and the middle document's rings rounded up to whole
  // workers would need more than P) or its sub-plans in head groups for (22: 2 groups of 11;
  // 35: 3 groups of 11 and 12 workers; the rings at full heads are communication-bound there).
  // The full P = 1..64 table: dfa-plan-sweep --docs pareto (docs/planner.md, "Masked plans").
  MaskSpec mask;
  mask.causal = true;
  mask.doc_offsets = {DocOffsetsOf(ParetoDocumentLengths(262144, 1.2, 256, 65536, 1))};
  for (int P : {3, 7, 10, 11, 15, 22, 35}) {
    EXPECT_LE(WorstRatio(mask, P), 1.03) << "P=" << P;
  }
}

}  // namespace
}  // namespace dfa
