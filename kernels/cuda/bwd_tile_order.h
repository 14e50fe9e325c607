// Tile order of the causal Hopper backward (flash_bwd_sm90_pipe.cuh, BwdPipeSched::chunk): which
// tile (key block, kv head x batch) the CTA of linear block id `lin` runs. Integer arithmetic
// only, so the host tests (tests/gpu/bwd_tile_order_test.cc) check the device's mapping.
#pragma once

#if defined(__CUDACC__)
#define DFA_BWD_TILE_HD __host__ __device__
#else
#define DFA_BWD_TILE_HD
#endif

namespace dfa::cuda {

struct BwdTile {
  int key_block;   // 0 .. key_blocks - 1
  int head_batch;  // kv head + kv_heads * batch index, 0 .. head_batches - 1
};

// The tile of CTA `lin` (0 <= lin < key_blocks * head_batches, that product < 2^31, chunk <
// 2^31 / key_blocks) of a grid of key_blocks x head_batches CTAs. chunk <= 0: grid order (key
// blocks fastest). chunk > 0: longest-first for causal masks, whose CTAs' work falls with the
// key block: the head_batches in chunks of `chunk` (the last one shorter when chunk does not
// divide head_batches), inside a chunk key block 0 of every head_batch first, then key block 1,
// ... Either order is a bijection of the linear ids onto the tiles.
DFA_BWD_TILE_HD inline BwdTile LongestFirstTile(int lin, int key_blocks, int head_batches,
                                                int chunk) {
  if (chunk <= 0) return {lin % key_blocks, lin / key_blocks};
  const int c0 = lin / (chunk * key_blocks) * chunk;  // first head_batch of lin's chunk
  const int csize = head_batches - c0 < chunk ? head_batches - c0 : chunk;
  const int r = lin - c0 * key_blocks;  // position inside the chunk
  return {r / csize, c0 + r % csize};
}

}  // namespace dfa::cuda

#undef DFA_BWD_TILE_HD
