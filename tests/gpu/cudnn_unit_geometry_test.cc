// cudnn::PlanUnit (kernels/cuda/cudnn_unit_geometry.h) against the global causal rule, pair by
// pair, over all small offset combinations: the reduced cuDNN call must see exactly the visible
// (query, key) pairs, never a query row with nothing visible, and never a key no row can see.
// Pure CPU arithmetic: runs everywhere.
#include "kernels/cuda/cudnn_unit_geometry.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace dfa::cudnn {
namespace {

bool GlobalVisible(int64_t q_row0, int64_t i, int64_t kv_row0, int64_t j, bool causal) {
  return !causal || kv_row0 + j <= q_row0 + i;
}

// Does the reduced call let local (row i, key j) of the unit through?
bool CallVisible(const UnitGeometry& g, int64_t i, int64_t j) {
  if (i < g.row0 || i >= g.row0 + g.rows || j >= g.kv_rows) return false;
  const int64_t r = i - g.row0;
  return g.right_bound < 0 || j <= r + g.right_bound;
}

TEST(CudnnUnitGeometry, ReducedCallSeesExactlyTheVisiblePairs) {
  int checked = 0;
  for (bool causal : {true, false}) {
    for (int64_t m : {1, 2, 5, 9}) {
      for (int64_t n : {1, 3, 5, 8}) {
        for (int64_t q_row0 = 0; q_row0 <= 14; ++q_row0) {
          for (int64_t kv_row0 = 0; kv_row0 <= 14; ++kv_row0) {
            const UnitGeometry g = PlanUnit(q_row0, m, kv_row0, n, causal);
            SCOPED_TRACE(::testing::Message() << "q0=" << q_row0 << " m=" << m << " k0=" << kv_row0 << " n=" << n
                                              << " causal=" << causal);
            ASSERT_EQ(g.row0, g.empty_rows);
            ASSERT_EQ(g.empty_rows + g.rows, m);
            ASSERT_LE(g.kv_rows, n);
            for (int64_t i = 0; i < m; ++i) {
              bool row_sees_any = false;
              for (int64_t j = 0; j < n; ++j) {
                const bool want = GlobalVisible(q_row0, i, kv_row0, j, causal);
                ASSERT_EQ(CallVisible(g, i, j), want) << "pair (" << i << ", " << j << ")";
                row_sees_any |= want;
              }
              // Rows handed to cuDNN always see a key; the others are exactly the empty ones.
              ASSERT_EQ(i >= g.row0, row_sees_any) << "row " << i;
            }
            // Every key handed to cuDNN is seen by some row (the last one sees the most).
            if (g.rows > 0 && g.kv_rows > 0) {
              ASSERT_TRUE(CallVisible(g, g.row0 + g.rows - 1, g.kv_rows - 1));
            }
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 2 * 4 * 4 * 15 * 15);
}

TEST(CudnnUnitGeometry, CommonUnitsMapToPlainMasks) {
  // Diagonal square unit: ordinary top-left causal.
  UnitGeometry g = PlanUnit(1024, 512, 1024, 512, true);
  EXPECT_EQ(g.empty_rows, 0);
  EXPECT_EQ(g.rows, 512);
  EXPECT_EQ(g.kv_rows, 512);
  EXPECT_EQ(g.right_bound, 0);
  // Keys wholly in the past: no mask.
  g = PlanUnit(2048, 512, 0, 1024, true);
  EXPECT_EQ(g.right_bound, -1);
  EXPECT_EQ(g.kv_rows, 1024);
  // Keys wholly in the future: nothing to compute.
  g = PlanUnit(0, 512, 512, 512, true);
  EXPECT_EQ(g.rows, 0);
  EXPECT_EQ(g.empty_rows, 512);
  // A query sub-block below the diagonal of a longer key chunk: band with a positive bound.
  g = PlanUnit(256, 256, 0, 1024, true);
  EXPECT_EQ(g.kv_rows, 512);
  EXPECT_EQ(g.right_bound, 256);
}

}  // namespace
}  // namespace dfa::cudnn
