// Host test of the causal Hopper backward's tile order (kernels/cuda/bwd_tile_order.h): every
// order must be a bijection of the CTAs' linear ids onto the (key block, kv head x batch) tiles
// (else tiles would be skipped or run twice and dK / dV be wrong), grid order must be the
// launch grid's own order, and the chunked order must run, inside each chunk of head_batches,
// key block 0 of every head_batch first, then key block 1, ... No GPU needed.
#include "kernels/cuda/bwd_tile_order.h"

#include <gtest/gtest.h>

#include <vector>

namespace dfa::cuda {
namespace {

struct Shape {
  int key_blocks, head_batches, chunk;
};

// Shapes: 4K / 16K at 32 heads, GQA 8 kv heads x batch 2, chunks that do not divide the
// head_batches (3, 5), chunk 1, chunk larger than head_batches, one key block, one head.
const Shape kShapes[] = {{32, 32, 4}, {128, 32, 4}, {128, 32, 0}, {13, 16, 3},
                         {7, 5, 5},   {7, 5, 6},    {1, 9, 4},    {9, 1, 4},
                         {10, 17, 1}, {33, 12, 5},  {4, 64, 32},  {5, 7, 100}};

TEST(BwdTileOrderTest, EveryOrderIsABijectionOntoTheTiles) {
  for (const Shape& s : kShapes) {
    const int n = s.key_blocks * s.head_batches;
    std::vector<int> hits(n, 0);
    for (int lin = 0; lin < n; ++lin) {
      const BwdTile t = LongestFirstTile(lin, s.key_blocks, s.head_batches, s.chunk);
      ASSERT_GE(t.key_block, 0) << "lin " << lin;
      ASSERT_LT(t.key_block, s.key_blocks) << "lin " << lin;
      ASSERT_GE(t.head_batch, 0) << "lin " << lin;
      ASSERT_LT(t.head_batch, s.head_batches) << "lin " << lin;
      ++hits[t.key_block + s.key_blocks * t.head_batch];
    }
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(hits[i], 1) << "tile " << i << " of " << s.key_blocks << " x " << s.head_batches
                            << ", chunk " << s.chunk;
    }
  }
}

TEST(BwdTileOrderTest, ChunkZeroIsTheGridOrder) {
  for (const Shape& s : kShapes) {
    for (int lin = 0; lin < s.key_blocks * s.head_batches; ++lin) {
      const BwdTile t = LongestFirstTile(lin, s.key_blocks, s.head_batches, 0);
      EXPECT_EQ(t.key_block, lin % s.key_blocks);
      EXPECT_EQ(t.head_batch, lin / s.key_blocks);
    }
  }
}

TEST(BwdTileOrderTest, ChunksRunKeyBlocksInOrderAcrossTheirHeads) {
  for (const Shape& s : kShapes) {
    if (s.chunk <= 0) continue;
    int prev_chunk = -1, prev_key = -1, prev_head = -1;
    for (int lin = 0; lin < s.key_blocks * s.head_batches; ++lin) {
      const BwdTile t = LongestFirstTile(lin, s.key_blocks, s.head_batches, s.chunk);
      const int chunk = t.head_batch / s.chunk;
      ASSERT_GE(chunk, prev_chunk) << "chunks run one after the other";
      if (chunk == prev_chunk) {
        // Key blocks never decrease inside a chunk; within a key block the heads ascend.
        ASSERT_GE(t.key_block, prev_key) << "lin " << lin << ", chunk " << s.chunk;
        if (t.key_block == prev_key) {
          ASSERT_GT(t.head_batch, prev_head) << "lin " << lin;
        } else {
          ASSERT_EQ(t.head_batch, chunk * s.chunk)
              << "a key block starts at the chunk's first head";
        }
      } else {
        ASSERT_EQ(t.key_block, 0) << "a chunk starts with key block 0";
        ASSERT_EQ(t.head_batch, chunk * s.chunk);
      }
      prev_chunk = chunk, prev_key = t.key_block, prev_head = t.head_batch;
    }
  }
}

}  // namespace
}  // namespace dfa::cuda
