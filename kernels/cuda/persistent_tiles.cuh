// The tile scheduler of the persistent kernels (the kIntervals TMA forward and pipe backward,
// sm_90a): grid = min(tiles, SMs), each CTA loops over tiles. Tiles are taken dynamically, in
// the dense grid's linear order, from a device counter (FlashAttention-3's scheduler for varlen):
// the tiles in flight stay a window of neighbours, as with one CTA per tile, so the K/V (forward)
// and Q/dO/dQ rows (backward) they share stay in L2; a static round-robin drifts apart and
// loses that (measured: docs/kernels-cuda.md).
// - CTA c starts with tile c; every later tile is gridDim.x + atomicAdd(counter, 1). A launch
//   makes exactly `tiles` fetches (one per tile a CTA takes, the last one past the end), which
//   return 0 .. tiles - 1; the fetch that returns tiles - 1 is the launch's last one and sets the
//   counter back to 0, so a counter is ready for the next launch without a memset. The CUDA
//   backend keeps a ring of counters, one per launch in flight (cuda_backend.cc).
// - Measured no faster than one CTA per tile (docs/kernels-cuda.md), so the kernel table does
//   not run these kernels; a KernelChoice (iv_ctas) does.
// - counter == nullptr: static order (tile c, c + gridDim.x, ...), used with one CTA per tile.
// - The thread that fetches publishes each tile id to the CTA's other roles through a 2-slot
//   ring in shared memory ("full" mbarrier: one arrival; "empty": one per reading warp); -1 ends
//   the loop.
#pragma once

#include <cstdint>

#include "kernels/cuda/sm90_tma.cuh"

namespace dfa::cuda {

struct TileRing {
  int* ids;         // [2]
  uint64_t* full;   // [2]
  uint64_t* empty;  // [2]
};

// One thread, before the CTA's __syncthreads: `readers` warps take each id.
__device__ inline void TileRingInit(const TileRing& r, uint32_t readers) {
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    MbarInit(r.full + s, 1);
    MbarInit(r.empty + s, readers);
  }
}

// The publishing thread: the CTA's j-th tile is w (-1: none left).
__device__ inline void TilePublish(const TileRing& r, int j, int w) {
  const int slot = j & 1;
  if (j >= 2) MbarWait(r.empty + slot, ((j >> 1) - 1) & 1);
  r.ids[slot] = w;
  MbarArrive(r.full + slot);  // release: the id's store
}

// Every lane of a reading warp: the CTA's j-th tile (-1: none left).
__device__ inline int TileTake(const TileRing& r, int j, int lane) {
  const int slot = j & 1;
  MbarWait(r.full + slot, (j >> 1) & 1);
  const int w = *reinterpret_cast<volatile const int*>(r.ids + slot);
  __syncwarp();
  if (lane == 0) MbarArrive(r.empty + slot);
  return w;
}

// The fetch for the tile after the current one: issued early, its result used by TileAfter (at
// the end of the current tile, so the atomic's latency is hidden).
__device__ inline int TileFetch(int* counter) {
  return counter != nullptr ? atomicAdd(counter, 1) : -1;
}

// The tile after w (>= tiles: none left), given TileFetch's result.
__device__ inline int TileAfter(int* counter, int fetched, int w, int tiles) {
  if (counter == nullptr) return w + static_cast<int>(gridDim.x);
  if (fetched == tiles - 1) atomicExch(counter, 0);  // the launch's last fetch
  return fetched + static_cast<int>(gridDim.x);
}

}  // namespace dfa::cuda
