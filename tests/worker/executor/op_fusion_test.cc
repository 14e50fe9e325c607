// FuseStepOps: which ops of a step become one backend call, and with which mask and positions.
// Exactness of fused calls end to end is executor_simulation_test's job (every schedule, P 1..8).
#include "worker/executor/op_fusion.h"

#include <gtest/gtest.h>

#include <vector>

namespace dfa {
namespace {

struct Step {
  std::vector<ComputeOp> ops;
  std::vector<RowPlace> q, kv;
  // Adds q_rows x kv_rows with the rows' places in the two layouts.
  void Add(const std::vector<RowRange>& ql, RowRange qr, const std::vector<RowRange>& kl,
           RowRange kr) {
    ops.push_back({qr, kr});
    q.push_back({&ql, Local(ql, qr)});
    kv.push_back({&kl, Local(kl, kr)});
  }
  static int64_t Local(const std::vector<RowRange>& layout, RowRange r) {
    int64_t local = 0;
    for (const RowRange& s : layout) {
      if (s.Contains(r)) return local + (r.begin - s.begin);
      local += s.size();
    }
    ADD_FAILURE() << "rows outside the layout";
    return 0;
  }
  std::vector<FusedCall> Fuse(MaskKind mask) const { return FuseStepOps(ops, q, kv, mask); }
};

// Global row of local row `local` of a source storing `layout` back to back.
int64_t GlobalRow(const std::vector<RowRange>& layout, int64_t local) {
  for (const RowRange& r : layout) {
    if (local < r.size()) return r.begin + local;
    local -= r.size();
  }
  ADD_FAILURE() << "local row outside the layout";
  return -1;
}

// Every pair of the call's box: the call's mask sees it iff the plan's mask does and an op of
// the call covers it.
void ExpectExact(const Step& s, const FusedCall& c, MaskKind mask) {
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      const int64_t gq = GlobalRow(*c.q.layout, c.q.local + i);
      const int64_t gk = GlobalRow(*c.kv.layout, c.kv.local + j);
      const bool call_sees = c.mask == MaskKind::kFull || c.kv_row0 + j <= c.q_row0 + i;
      bool covered = false;
      for (int o : c.ops) {
        const ComputeOp& op = s.ops[o];
        covered = covered || (op.q_rows.begin <= gq && gq < op.q_rows.end &&
                              op.kv_rows.begin <= gk && gk < op.kv_rows.end);
      }
      const bool plan_sees = covered && (mask == MaskKind::kFull || gk <= gq);
      EXPECT_EQ(call_sees, plan_sees) << "q " << gq << " k " << gk;
    }
  }
}

TEST(OpFusionTest, ZigzagShardLocalStepIsOneCausalCallOnLocalPositions) {
  const std::vector<RowRange> owned = {{0, 4}, {12, 16}};
  Step s;
  s.Add(owned, {0, 4}, owned, {0, 4});
  s.Add(owned, {12, 16}, owned, {0, 4});
  s.Add(owned, {12, 16}, owned, {12, 16});
  const auto calls = s.Fuse(MaskKind::kCausal);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].ops, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(calls[0].mask, MaskKind::kCausal);
  EXPECT_EQ(calls[0].m, 8);
  EXPECT_EQ(calls[0].n, 8);
  EXPECT_EQ(calls[0].q.local, 0);
  EXPECT_EQ(calls[0].kv.local, 0);
  EXPECT_EQ(calls[0].q_row0, 0);
  EXPECT_EQ(calls[0].kv_row0, 0);
  ExpectExact(s, calls[0], MaskKind::kCausal);
}

TEST(OpFusionTest, AdjacentOwnedRangesFuseInAnyOpOrder) {
  const std::vector<RowRange> owned = {{4, 8}, {8, 12}};
  Step s;  // the lower-left block last: the first two alone are an L without it
  s.Add(owned, {4, 8}, owned, {4, 8});
  s.Add(owned, {8, 12}, owned, {8, 12});
  s.Add(owned, {8, 12}, owned, {4, 8});
  const auto calls = s.Fuse(MaskKind::kCausal);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].ops, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(calls[0].q_row0, 4);
  EXPECT_EQ(calls[0].kv_row0, 4);
  EXPECT_EQ(calls[0].m, 8);
}

TEST(OpFusionTest, FullyVisibleBoxBecomesAFullCall) {
  const std::vector<RowRange> owned = {{0, 4}, {12, 16}};
  const std::vector<RowRange> received = {{4, 12}};  // one coalesced K/V buffer
  Step s;
  s.Add(owned, {12, 16}, received, {4, 8});
  s.Add(owned, {12, 16}, received, {8, 12});
  const auto calls = s.Fuse(MaskKind::kCausal);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].mask, MaskKind::kFull);
  EXPECT_EQ(calls[0].q.local, 4);
  EXPECT_EQ(calls[0].kv.local, 0);
  EXPECT_EQ(calls[0].m, 4);
  EXPECT_EQ(calls[0].n, 8);
}

TEST(OpFusionTest, MissingVisibleBlockKeepsOpsApart) {
  const std::vector<RowRange> owned = {{0, 4}, {12, 16}};
  Step s;  // q[12,16) x kv[0,4) is visible but not in this step
  s.Add(owned, {0, 4}, owned, {0, 4});
  s.Add(owned, {12, 16}, owned, {12, 16});
  const auto calls = s.Fuse(MaskKind::kCausal);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[1].ops, (std::vector<int>{1}));
  EXPECT_EQ(calls[1].q_row0, 12);
  EXPECT_EQ(calls[1].kv_row0, 12);
  EXPECT_EQ(calls[1].q.local, 4);
  EXPECT_EQ(calls[1].mask, MaskKind::kCausal);
}

TEST(OpFusionTest, DifferentSourcesNeverFuse) {
  const std::vector<RowRange> owned = {{8, 12}};
  const std::vector<RowRange> a = {{0, 4}}, b = {{4, 8}};  // two separate buffers
  Step s;
  s.Add(owned, {8, 12}, a, {0, 4});
  s.Add(owned, {8, 12}, b, {4, 8});
  EXPECT_EQ(s.Fuse(MaskKind::kCausal).size(), 2u);
}

TEST(OpFusionTest, ShiftedMaskThatWouldSeeMorePairsIsRejected) {
  const std::vector<RowRange> q = {{4, 8}};
  const std::vector<RowRange> kv = {{0, 2}, {5, 7}};
  Step s;  // on local positions keys [5,7) would look as old as [2,4): all visible
  s.Add(q, {4, 8}, kv, {0, 2});
  s.Add(q, {4, 8}, kv, {5, 7});
  const auto calls = s.Fuse(MaskKind::kCausal);
  ASSERT_EQ(calls.size(), 2u);
  for (const FusedCall& c : calls) ExpectExact(s, c, MaskKind::kCausal);
  // Without a mask the same box is exact.
  const auto full = s.Fuse(MaskKind::kFull);
  ASSERT_EQ(full.size(), 1u);
  EXPECT_EQ(full[0].mask, MaskKind::kFull);
  EXPECT_EQ(full[0].n, 4);
}

TEST(OpFusionTest, NoShiftFitsTwoDiagonalsAtDifferentOffsets) {
  // Keys [4,6) and [10,12) both cut queries [4,12)'s diagonal, at local distances that no one
  // shift reproduces (the middle keys [6,10) are missing from the step): kept apart.
  const std::vector<RowRange> q = {{4, 12}};
  const std::vector<RowRange> kv = {{4, 6}, {10, 12}};
  Step s;
  s.Add(q, {4, 12}, kv, {4, 6});
  s.Add(q, {4, 12}, kv, {10, 12});
  const auto calls = s.Fuse(MaskKind::kCausal);
  EXPECT_EQ(calls.size(), 2u);
  for (const FusedCall& c : calls) ExpectExact(s, c, MaskKind::kCausal);
}

TEST(OpFusionTest, FullMaskNeedsTheWholeRectangle) {
  const std::vector<RowRange> owned = {{0, 4}, {4, 8}};
  Step s;
  s.Add(owned, {0, 4}, owned, {0, 4});
  s.Add(owned, {4, 8}, owned, {4, 8});
  EXPECT_EQ(s.Fuse(MaskKind::kFull).size(), 2u);
  s.Add(owned, {0, 4}, owned, {4, 8});
  s.Add(owned, {4, 8}, owned, {0, 4});
  const auto calls = s.Fuse(MaskKind::kFull);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].m * calls[0].n, 64);
}

TEST(OpFusionTest, NoDiagonalBandCalls) {
  // Queries [12,16) against keys [0,4) and [12,16) of a zigzag shard: exact as one call only
  // with keys at positions 8 + j (a diagonal band cuDNN runs slowly): kept as two calls.
  const std::vector<RowRange> owned = {{0, 4}, {12, 16}};
  Step s;
  s.Add(owned, {12, 16}, owned, {0, 4});
  s.Add(owned, {12, 16}, owned, {12, 16});
  const auto calls = s.Fuse(MaskKind::kCausal);
  ASSERT_EQ(calls.size(), 2u);
  for (const FusedCall& c : calls) ExpectExact(s, c, MaskKind::kCausal);
}

TEST(OpFusionTest, OverlappingOpsAreNeverMerged) {
  const std::vector<RowRange> owned = {{0, 8}};
  Step s;  // an invalid plan computing [0,4)x[0,4) twice must not be hidden by a fused call
  s.Add(owned, {0, 4}, owned, {0, 4});
  s.Add(owned, {0, 4}, owned, {0, 4});
  EXPECT_EQ(s.Fuse(MaskKind::kCausal).size(), 2u);
}

}  // namespace
}  // namespace dfa

namespace dfa {
namespace {

// kIntervals: calls keep the global positions (one global range per side) and the interval
// mask; ops fuse when they hold every visible pair of the box under the documents.
TEST(OpFusionIntervalsTest, FusesOnlyOverOneGlobalRangePerSide) {
  MaskSpec mask;
  mask.causal = true;
  mask.doc_offsets = {{0, 4, 16}};  // documents [0, 4) and [4, 16)
  const UnitPairs pairs(mask, 16);
  const std::vector<RowRange> zigzag = {{0, 4}, {12, 16}};
  Step s;
  s.Add(zigzag, {0, 4}, zigzag, {0, 4});
  s.Add(zigzag, {12, 16}, zigzag, {12, 16});
  // Causal would fuse these (a zigzag shard's local step: kCausal at local positions, test
  // above); under intervals the rows are two global ranges: two calls at global positions.
  auto calls = FuseStepOps(s.ops, s.q, s.kv, MaskKind::kIntervals, &pairs);
  ASSERT_EQ(calls.size(), 2u);
  for (const FusedCall& c : calls) EXPECT_EQ(c.mask, MaskKind::kIntervals);
  EXPECT_EQ(calls[1].q_row0, 12);
  EXPECT_EQ(calls[1].kv_row0, 12);

  // One global range: [0, 4) x [0, 4) and [4, 8) x [4, 8) leave out [4, 8) x [0, 4), which the
  // documents hide: one call over [0, 8) x [0, 8).
  const std::vector<RowRange> owned = {{0, 8}};
  Step t;
  t.Add(owned, {0, 4}, owned, {0, 4});
  t.Add(owned, {4, 8}, owned, {4, 8});
  calls = FuseStepOps(t.ops, t.q, t.kv, MaskKind::kIntervals, &pairs);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].mask, MaskKind::kIntervals);
  EXPECT_EQ(calls[0].m, 8);
  EXPECT_EQ(calls[0].n, 8);
  EXPECT_EQ(calls[0].q_row0, 0);
  // Without the documents the left-out block holds causal pairs: no fusion.
  MaskSpec window;
  window.causal = true;
  window.window_left = 6;
  const UnitPairs wpairs(window, 16);
  calls = FuseStepOps(t.ops, t.q, t.kv, MaskKind::kIntervals, &wpairs);
  EXPECT_EQ(calls.size(), 2u);
  // No pair counter: never fused.
  EXPECT_EQ(FuseStepOps(t.ops, t.q, t.kv, MaskKind::kIntervals).size(), 2u);
}

}  // namespace
}  // namespace dfa
