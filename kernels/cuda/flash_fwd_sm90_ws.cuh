// Hopper forward unit, warp-specialised (FlashAttention-3's recipe, sm_90a): the default forward
// on Hopper (kernel_dispatch.h). Same contract and epilogue as flash_fwd_sm90.cuh (FwdParams).
//
// CTA = 1 + kConsumers warpgroups, kBlockM = 64 x kConsumers query rows of one (batch, head):
// - warpgroup 0, the producer, gives its registers back (setmaxnreg.dec to 24); one thread
//   issues every load as a TMA bulk tensor copy (cp.async.bulk.tensor, 128B swizzle, which is the
//   SW128 layout of sm90_common.cuh): Q once, then K and V key blocks (last to first, like the
//   other kernels) into a ring of kStages shared stages. Each stage has a "full" mbarrier (armed
//   with the byte count, completed by the copy engine) and an "empty" one (4 x kConsumers
//   arrivals: lane 0 of every consumer warp, once its wgmma has read the stage).
// - warpgroups 1 .. kConsumers, the consumers (setmaxnreg.inc to 240 with 2 consumers, 160 with
//   3), own 64 query rows each and run the loop of flash_fwd_sm90.cuh: S(j) = Q K(j)^T issued
//   together with O += P(j-1) V(j-1), softmax of S(j) (base 2, scale folded) while P V still
//   runs. O is rescaled between the S and the P V issue (off the softmax -> next S path) and
//   only when some row of the warp changed its maximum; the mask runs on the first n_masked
//   blocks only (per-row column limits, selects); descriptors are 32-bit uniform adds (the
//   profile behind these choices: docs/kernels-cuda.md). Ping-pong: named barriers hand the
//   "issue GEMMs" turn from one consumer to the next (round robin), so one warpgroup's softmax
//   runs while another's GEMMs keep the tensor cores busy.
// Rows past m or n are zero-filled by the copy engine (out-of-bounds box elements), the mask
// sets their scores to -inf exactly as in the other kernels.
// kIntervals (template flag kIv, mask_tiles.cuh): the walk covers only the key blocks of the
// tile's visible range, and the mask runs on the partial blocks at both of its ends. Its tiles
// are short (documents, windows), so its kernel is persistent (one CTA per SM taking tiles from
// a counter; the next tile's loads run under this one's last GEMMs and epilogue).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda/flash_params.h"
#include "kernels/cuda/mask_tiles.cuh"
#include "kernels/cuda/sm90_common.cuh"
#include "kernels/cuda/sm90_tensor_maps.cuh"
#include "kernels/cuda/sm90_tma.cuh"

namespace dfa::cuda {

// The TMA descriptors of one launch (kernel parameter, __grid_constant__).
struct FwdTmaMaps {
  CUtensorMap q, k, v;
};

// kQBufs: Q buffers (the persistent kernel loads the next tile's Q while this one's is in use).
template <int kD, int kBlockN, int kStages, int kConsumers, int kQBufs = 1>
struct FwdWsTraits {
  static_assert(kConsumers == 2 || kConsumers == 3, "2 or 3 consumer warpgroups");
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kQElems = kBlockM * kD;
  static constexpr int kKVElems = kBlockN * kD;
  // Q, K stages, V stages, then the second Q buffer.
  static constexpr int kBarOffset = (kQBufs * kQElems + 2 * kStages * kKVElems) * 2;  // bytes
  // Barriers: q_full, K/V stages, then (persistent kIv) q_full of buffer 1, q_empty[2],
  // tile_full[2], tile_empty[2], and the two tile ids of the ring; + alignment.
  static constexpr int kSmemBytes = kBarOffset + 8 * (1 + 4 * kStages) + 8 * 7 + 8 + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
  // 24 x 128 + kConsumerRegs x 128 x kConsumers <= 64K registers of the SM.
  static constexpr int kProducerRegs = 24, kConsumerRegs = kConsumers == 2 ? 240 : 160;
};

// Named barriers: 0 is __syncthreads; 1 + c the GEMM turn of consumer c; 4 + c pins the
// softmax of consumer c before its P V wait (see flash_fwd_sm90.cuh).
constexpr int kTurnBarrier = 1;
constexpr int kPinBarrier = 4;

// floor(a / b) for b > 0.
__host__ __device__ inline int64_t FwdWsFloorDiv(int64_t a, int64_t b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

// How many of the n_blocks key blocks of a query tile, walked last to first (block
// n_blocks - 1 - it at iteration it), need the mask: block j does when it reaches past the n
// keys, (j + 1) * block_n > n, or (causal) past the diagonal of the tile's first row,
// kv_row0 + j * block_n + block_n - 1 > q_row0 + m_begin (diag = q_row0 + m_begin - kv_row0).
// Both conditions hold exactly for j >= some J, so the answer is n_blocks - J, clamped.
__host__ __device__ inline int FwdWsMaskedBlocks(int64_t n, bool causal, int64_t diag, int block_n,
                                                 int n_blocks) {
  int64_t j = n / block_n;
  if (causal) {
    const int64_t jc = FwdWsFloorDiv(diag - block_n + 1, block_n) + 1;
    j = j < jc ? j : jc;
  }
  const int64_t masked = int64_t{n_blocks} - j;
  return static_cast<int>(masked < 0 ? 0 : (masked > n_blocks ? n_blocks : masked));
}

// Shared-memory matrix descriptors (128-byte swizzle, SBO 1024 B, as MakeSmemDesc) split in a
// low word (start address / 16 in bits 0-13, LBO / 16 in 16-29) and the constant high word, so
// that k-steps and stages are 32-bit adds to the low word (addresses stay below 256 KB).
__device__ inline uint32_t FwdWsDescLo(const void* smem, uint32_t lbo_bytes) {
  return ((SmemAddr(smem) & 0x3FFFF) >> 4) | (((lbo_bytes >> 4) & 0x3FFF) << 16);
}
__device__ inline uint64_t FwdWsDesc(uint32_t lo) {
  constexpr uint32_t kHi = (1024 >> 4) | (1u << 30);  // SBO 1024 B; layout type 1 (bit 62)
  return (uint64_t{kHi} << 32) | lo;
}

// One query tile of the forward: query block mb (kBlockM rows) of head h, batch row b.
struct FwdWsTile {
  int mb = 0, h = 0, b = 0;
};
// The persistent kIv kernel numbers its tiles as the dense grid runs them: query blocks fastest,
// from the last to the first (a document's last rows see the most keys), then heads, then batch
// rows, so that the tiles in flight at one time share their head's K and V in L2 (heads fastest
// would stream every head's K/V from memory: 0.86x of the grid's speed on one 64K document).
__host__ __device__ inline FwdWsTile FwdWsTileAt(int tile, int q_heads, int m_blocks) {
  FwdWsTile t;
  t.mb = m_blocks - 1 - tile % m_blocks;
  const int r = tile / m_blocks;
  t.h = r % q_heads;
  t.b = r / q_heads;
  return t;
}

// kIv: the kIntervals mask (mask_tiles.cuh): the key blocks come from the tile's intervals and
// the mask runs on the partial blocks at both ends of the walk; false compiles the dense kernel.
// kIv is also persistent: one CTA per SM walks tiles taken from a counter (p.tile_counter,
// zero at launch): the producer thread takes the next tile once it has issued every load of
// the current one and hands it to the consumers through a 2-slot ring in shared memory
// (tile_full / tile_empty mbarriers), so the next tile's Q and first K/V blocks load while the
// consumers finish this one (two Q buffers; one is free again once both consumers' last S of
// its tile is done: q_empty). The K/V stage ring, the Q buffers and the GEMM turns run on across
// tiles (kv_base, q_uses).
template <typename T, int kD, int kBlockN, int kStages, int kConsumers, bool kIv>
__global__ void __launch_bounds__(128 * (kConsumers + 1), 1)
    FlashFwdSm90WsKernel(const __grid_constant__ FwdParams p,
                         const __grid_constant__ FwdTmaMaps maps) {
#ifdef DFA_WGMMA
  using Tr = ElemTraits<T>;
  using Cfg = FwdWsTraits<kD, kBlockN, kStages, kConsumers, kIv ? 2 : 1>;
  constexpr int kBlockM = Cfg::kBlockM;
  constexpr int kNS = kBlockN / 2;  // S accumulator floats per thread
  constexpr int kNO = kD / 2;       // O accumulator floats per thread
  constexpr int kPanels = kD / 64;
  constexpr bool kPersistent = kIv;
  extern __shared__ __align__(1024) char smem_ws[];
  char* base = smem_ws + ((1024 - (SmemAddr(smem_ws) & 1023)) & 1023);
  T* s_q = reinterpret_cast<T*>(base);
  T* s_k = s_q + Cfg::kQElems;             // kStages stages
  T* s_v = s_k + kStages * Cfg::kKVElems;  // kStages stages
  uint64_t* q_full = reinterpret_cast<uint64_t*>(base + Cfg::kBarOffset);
  uint64_t* k_full = q_full + 1;
  uint64_t* k_empty = k_full + kStages;
  uint64_t* v_full = k_empty + kStages;
  uint64_t* v_empty = v_full + kStages;
  T* s_q1 = s_v + kStages * Cfg::kKVElems;  // persistent only, as the barriers below
  uint64_t* q_full1 = v_empty + kStages;
  uint64_t* q_empty = q_full1 + 1;        // 2 buffers
  uint64_t* tile_full = q_empty + 2;      // 2 slots
  uint64_t* tile_empty = tile_full + 2;   // 2 slots
  int* s_tile = reinterpret_cast<int*>(tile_empty + 2);

  const int tid = threadIdx.x;
  const int wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int m_blocks = static_cast<int>((p.m + kBlockM - 1) / kBlockM);
  const int n_tiles = m_blocks * p.q_heads * p.batch;
  // The tile's place and its key blocks (the same on both sides of the producer/consumer split).
  struct TileWork {
    FwdWsTile t;
    int hk = 0;
    int64_t m_begin = 0;
    int m_valid = 0;
    int n_blocks = 0;
    int n_first = 0;  // kIv: first key block of the walk (the dense walk ends at block 0)
    IvBlockRange iv_range;
  };
  auto tile_work = [&](const FwdWsTile& t) {
    TileWork w;
    w.t = t;
    w.hk = t.h / (p.q_heads / p.kv_heads);
    w.m_begin = int64_t{t.mb} * kBlockM;
    w.m_valid = static_cast<int>(Min64(kBlockM, p.m - w.m_begin));
    if constexpr (kIv) {
      w.iv_range = IvKeyBlocks(p.iv, t.b, p.q_row0 + w.m_begin, p.q_row0 + w.m_begin + w.m_valid - 1,
                               p.kv_row0, p.n, kBlockN);
      w.n_first = w.iv_range.first;
      w.n_blocks = w.iv_range.count;
    } else {
      int64_t n_end = p.n;
      if (p.causal) n_end = Min64(n_end, p.q_row0 + w.m_begin + w.m_valid - 1 - p.kv_row0 + 1);
      w.n_blocks = n_end > 0 ? static_cast<int>((n_end + kBlockN - 1) / kBlockN) : 0;
    }
    return w;
  };
  FwdWsTile grid_tile;  // the dense kernel's one tile
  grid_tile.mb = p.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;  // long rows first
  grid_tile.h = blockIdx.y;
  grid_tile.b = blockIdx.z;
  TileWork grid_work;  // the dense kernel's tile, computed once for both sides
  if constexpr (!kPersistent) grid_work = tile_work(grid_tile);

  if (tid == 0) {
    MbarInit(q_full, 1);
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      MbarInit(k_full + s, 1);
      MbarInit(v_full + s, 1);
      MbarInit(k_empty + s, 4 * kConsumers);
      MbarInit(v_empty + s, 4 * kConsumers);
    }
    if constexpr (kPersistent) {
      MbarInit(q_full1, 1);
      MbarInit(q_empty + 0, 4 * kConsumers);
      MbarInit(q_empty + 1, 4 * kConsumers);
      for (int s = 0; s < 2; ++s) {
        MbarInit(tile_full + s, 1);
        MbarInit(tile_empty + s, 4 * kConsumers);
      }
    }
    FenceMbarInit();
  }
  __syncthreads();

  if (wg == 0) {  // producer
    SetMaxNRegDec<Cfg::kProducerRegs>();
    if (warp == 0 && lane == 0) {
      constexpr uint32_t kQBytes = Cfg::kQElems * 2, kKVBytes = Cfg::kKVElems * 2;
      uint32_t kv_base = 0, q_uses = 0;  // key blocks and Q loads of the earlier tiles
      int next_tile = static_cast<int>(blockIdx.x);  // persistent: the tile after this one
      for (int k = 0;; ++k) {
        FwdWsTile t = grid_tile;
        if constexpr (kPersistent) {
          const int tile = next_tile;
          const int slot = k & 1;
          MbarWait(tile_empty + slot, ((k >> 1) & 1) ^ 1);
          s_tile[slot] = tile;
          MbarArrive(tile_full + slot);  // release: the consumers see s_tile
          if (tile >= n_tiles) break;
          // Taken now, read after this tile's loads: the atomic's latency is off the path.
          next_tile = static_cast<int>(gridDim.x) + atomicAdd(p.tile_counter, 1);
          t = FwdWsTileAt(tile, p.q_heads, m_blocks);
        }
        const TileWork w = kPersistent ? tile_work(t) : grid_work;
        if (w.n_blocks > 0) {
          // Persistent: Q buffer q_uses % 2, free once the tile before last has done its S.
          const uint32_t qb = kPersistent ? (q_uses & 1) : 0;
          if (kPersistent && q_uses >= 2) MbarWait(q_empty + qb, ((q_uses >> 1) & 1) ^ 1);
          T* q_dst = qb ? s_q1 : s_q;
          uint64_t* q_bar = qb ? q_full1 : q_full;
          MbarArriveExpectTx(q_bar, kQBytes);
#pragma unroll
          for (int pn = 0; pn < kPanels; ++pn)
            TmaLoad4d(q_dst + pn * kBlockM * 64, &maps.q, q_bar, pn * 64, t.h,
                      static_cast<int>(w.m_begin), t.b);
          ++q_uses;
          // Walk position `it` = key block n_blocks - 1 - it, in stage (kv_base + it) % kStages.
          auto load = [&](int it, T* s_tiles, uint64_t* full, uint64_t* empty,
                          const CUtensorMap* m) {
            const uint32_t g = kv_base + static_cast<uint32_t>(it);
            const uint32_t s = g % kStages;
            MbarWait(empty + s, ((g / kStages) & 1) ^ 1);
            MbarArriveExpectTx(full + s, kKVBytes);
            const int n0 = (w.n_first + w.n_blocks - 1 - it) * kBlockN;
#pragma unroll
            for (int pn = 0; pn < kPanels; ++pn)
              TmaLoad4d(s_tiles + s * Cfg::kKVElems + pn * kBlockN * 64, m, full + s, pn * 64,
                        w.hk, n0, t.b);
          };
          load(0, s_k, k_full, k_empty, &maps.k);
          for (int it = 0; it < w.n_blocks; ++it) {
            if (it + 1 < w.n_blocks) load(it + 1, s_k, k_full, k_empty, &maps.k);
            load(it, s_v, v_full, v_empty, &maps.v);
          }
          kv_base += static_cast<uint32_t>(w.n_blocks);
        }
        if constexpr (!kPersistent) break;
      }
    }
    return;
  }

  // Consumers.
  SetMaxNRegInc<Cfg::kConsumerRegs>();
  // Read through a lane-0 shuffle so that ptxas sees it as warp-uniform: the descriptor
  // arithmetic below then stays in uniform registers.
  const int cw = __shfl_sync(0xffffffffu, wg, 0) - 1;  // consumer index 0 / 1
  const int g = lane >> 2, t = lane & 3;
  const int row_base = cw * 64 + warp * 16 + g;  // this thread's rows: row_base, row_base + 8
  const float scale_log2 = p.scale * kLog2e;
  auto release = [&](uint64_t* bar) {
    if (lane == 0) MbarArrive(bar);
  };

  // Consumer 0 takes the first GEMM turn: the last consumer hands it over before its own first
  // wait. The turns then go round the consumers without a break, across tiles too (every
  // consumer issues each tile's n_blocks GEMM pairs); consumer 0 takes the last hand-over after
  // the last tile.
  if (cw == kConsumers - 1) NamedBarrierArrive(kTurnBarrier + 0, 256);
  const int my_turn = kTurnBarrier + cw, next_turn = kTurnBarrier + (cw + 1) % kConsumers;

  // Persistent: tile k's id from slot k & 1 of the ring (false: no tile left), its key blocks,
  // and this thread's rows' visible keys. The next tile's are read before this tile's epilogue,
  // so their loads run under it.
  auto next_tile = [&](int k, TileWork* w, IvRow* rows) {
    const int slot = k & 1;
    MbarWait(tile_full + slot, (k >> 1) & 1);
    const int id = s_tile[slot];
    __syncwarp();
    release(tile_empty + slot);
    if (id >= n_tiles) return false;
    *w = tile_work(FwdWsTileAt(id, p.q_heads, m_blocks));
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = row_base + hf * 8;
      rows[hf] = IvQueryRow(p.iv, w->t.b, p.q_row0 + w->m_begin + r, p.kv_row0, p.n,
                            r < w->m_valid);
    }
    return true;
  };
  if constexpr (kPersistent) {
    // Cross-tile pipeline: the next tile's S(0) is issued in the same GEMM turn as this tile's
    // last P V, its softmax runs while that P V is on the tensor cores, and this tile's epilogue
    // runs after it (before the next tile's first P V), so no tile starts or ends with the
    // tensor cores idle for this warpgroup.
    struct Cur {  // what the loop needs of a tile; the epilogue recomputes the rest from `id`
      int id = 0, n_blocks = 0, n_first = 0, top = 0, bottom = 0;
      IvRow rows[2];
      uint32_t qb = 0, kv0 = 0;  // Q buffer, first K/V ring position
    };
    float acc_o[kNO];
    float row_max[2], row_sum[2];
    float s[kNS], pr[kNS];
    uint32_t a[kBlockN / 16][4];
    float corr[2] = {1.f, 1.f};
    const uint32_t k_lo = FwdWsDescLo(s_k, 16);
    const uint32_t v_lo = FwdWsDescLo(s_v, kBlockN * 64 * 2);
    constexpr uint32_t kStageLo = Cfg::kKVElems * 2 / 16;
    auto q_lo_of = [&](uint32_t qb) { return FwdWsDescLo((qb ? s_q1 : s_q) + cw * 64 * 64, 16); };
    auto stage_of = [](uint32_t g) { return g % kStages; };
    auto parity_of = [](uint32_t g) { return (g / kStages) & 1; };
    auto issue_s = [&](uint32_t q_lo, uint32_t stage) {
      const uint32_t ks_lo = k_lo + stage * kStageLo;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        const uint64_t dq = FwdWsDesc(q_lo + ((kk >> 2) * kBlockM * 64 + (kk & 3) * 16) * 2 / 16);
        const uint64_t dk = FwdWsDesc(ks_lo + ((kk >> 2) * kBlockN * 64 + (kk & 3) * 16) * 2 / 16);
        WgmmaSS<T, kBlockN, 0, 0>::Run(s, dq, dk, kk > 0 ? 1 : 0);
      }
      WgmmaCommit();
    };
    auto issue_pv = [&](uint32_t stage) {
      const uint32_t vs_lo = v_lo + stage * kStageLo;
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        const uint64_t dv = FwdWsDesc(vs_lo + kk * 16 * 64 * 2 / 16);
        WgmmaRS<T, kD, 1>::Run(acc_o, a[kk], dv, 1);
      }
      WgmmaCommit();
    };
    auto softmax = [&](const Cur& c, int it) {
      const int nb = c.n_blocks;
      if (it < c.top || it >= nb - c.bottom) {
        const int n0 = (c.n_first + nb - 1 - it) * kBlockN;
        int lo[2], hi[2];
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          lo[hf] = c.rows[hf].lo - n0 - 2 * t;
          hi[hf] = c.rows[hf].hi - n0 - 2 * t;
        }
#pragma unroll
        for (int i = 0; i < kNS; ++i) {
          const int col = (i >> 2) * 8 + (i & 1);
          s[i] = (col >= lo[(i >> 1) & 1]) & (col < hi[(i >> 1) & 1]) ? s[i] : -INFINITY;
        }
      }
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float v[kBlockN / 8];
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j)
          v[j] = fmaxf(s[4 * j + 2 * hf], s[4 * j + 2 * hf + 1]);
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = fmaxf(v[j], v[j + 8]);
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] = fmaxf(v[j], v[j + 4]);
        v[0] = fmaxf(v[0], v[2]);
        v[1] = fmaxf(v[1], v[3]);
        v[0] = fmaxf(v[0], v[1]);
        const float mx = fmaxf(QuadMax(v[0]) * scale_log2, row_max[hf]);
        const float ref = mx == -INFINITY ? 0.f : mx;
        corr[hf] = FastExp2(row_max[hf] - ref);
        row_max[hf] = mx;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pv = FastExp2(s[4 * j + 2 * hf + e] * scale_log2 - ref);
            pr[4 * j + 2 * hf + e] = pv;
            sum += pv;
          }
        row_sum[hf] = row_sum[hf] * corr[hf] + sum;
      }
    };
    auto rescale_o = [&]() {
      if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
        for (int dt = 0; dt < kD / 8; ++dt) {
          acc_o[4 * dt + 0] *= corr[0];
          acc_o[4 * dt + 1] *= corr[0];
          acc_o[4 * dt + 2] *= corr[1];
          acc_o[4 * dt + 3] *= corr[1];
        }
      }
    };
    auto pack_p = [&]() {
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        a[kk][0] = Tr::Pack(pr[8 * kk + 0], pr[8 * kk + 1]);
        a[kk][1] = Tr::Pack(pr[8 * kk + 2], pr[8 * kk + 3]);
        a[kk][2] = Tr::Pack(pr[8 * kk + 4], pr[8 * kk + 5]);
        a[kk][3] = Tr::Pack(pr[8 * kk + 6], pr[8 * kk + 7]);
      }
    };
    auto reset = [&]() {
#pragma unroll
      for (int i = 0; i < kNO; ++i) acc_o[i] = 0.f;
      row_max[0] = row_max[1] = -INFINITY;
      row_sum[0] = row_sum[1] = 0.f;
    };
    auto fetch = [&](int k, Cur* c) {
      const int slot = k & 1;
      MbarWait(tile_full + slot, (k >> 1) & 1);
      const int id = s_tile[slot];
      __syncwarp();
      release(tile_empty + slot);
      if (id >= n_tiles) return false;
      const TileWork w = tile_work(FwdWsTileAt(id, p.q_heads, m_blocks));
      c->id = id;
      c->n_blocks = w.n_blocks;
      c->n_first = w.n_first;
      c->top = w.iv_range.top;
      c->bottom = w.iv_range.bottom;
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = row_base + hf * 8;
        c->rows[hf] = IvQueryRow(p.iv, w.t.b, p.q_row0 + w.m_begin + r, p.kv_row0, p.n,
                                 r < w.m_valid);
      }
      return true;
    };
    // O = acc / l and LSE of tile `id` from acc_o and the row statistics rm / rs.
    auto epilogue = [&](int id, const float* rm, const float* rs) {
      const FwdWsTile tl = FwdWsTileAt(id, p.q_heads, m_blocks);
      TileWork w;
      w.m_begin = int64_t{tl.mb} * kBlockM;
      w.m_valid = static_cast<int>(Min64(kBlockM, p.m - w.m_begin));
      const int h = tl.h, b = tl.b;
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const float l = QuadSum(rs[hf]);
        const int r = row_base + hf * 8;
        if (r >= w.m_valid) continue;
        const int64_t row = w.m_begin + r;
        float lse_b = l > 0.f ? rm[hf] * kLn2 + logf(l) : -INFINITY;
        float wa = 0.f, wb = l > 0.f ? 1.f / l : 0.f;
        float* lse_ptr = p.lse + b * p.lse_batch_stride + h * p.lse_head_stride + row;
        if (p.accumulate) {
          const float lse_a = *lse_ptr;
          const float mx = fmaxf(lse_a, lse_b);
          if (mx == -INFINITY) {
            lse_b = -INFINITY;
            wb = 0.f;
          } else {
            const float ea = __expf(lse_a - mx), eb = __expf(lse_b - mx);
            const float inv = 1.f / (ea + eb);
            wa = ea * inv;
            wb *= eb * inv;
            lse_b = mx + logf(ea + eb);
          }
        }
        if (t == 0) *lse_ptr = lse_b;
        const int64_t o_off = b * p.o_batch_stride + row * p.o_row_stride + int64_t{h} * kD + 2 * t;
        if (p.out_f32) {
          float* o = static_cast<float*>(p.out) + o_off;
#pragma unroll
          for (int dt = 0; dt < kD / 8; ++dt) {
            float2 v = make_float2(acc_o[4 * dt + 2 * hf] * wb, acc_o[4 * dt + 2 * hf + 1] * wb);
            if (p.accumulate) {
              const float2 old = *reinterpret_cast<const float2*>(o + dt * 8);
              v.x += old.x * wa;
              v.y += old.y * wa;
            }
            *reinterpret_cast<float2*>(o + dt * 8) = v;
          }
        } else {
          T* o = static_cast<T*>(p.out) + o_off;
#pragma unroll
          for (int dt = 0; dt < kD / 8; ++dt) {
            *reinterpret_cast<uint32_t*>(o + dt * 8) =
                Tr::Pack(acc_o[4 * dt + 2 * hf] * wb, acc_o[4 * dt + 2 * hf + 1] * wb);
          }
        }
      }
    };

    uint32_t kv_pos = 0, q_uses = 0;  // K/V ring position and Q loads of the tiles before `cur`
    Cur cur, nxt;
    int k = 0;
    bool have = fetch(0, &cur);
    bool started = false;  // cur's S(0) is done, its softmax taken and P(0) packed
    while (have) {
      const int n = cur.n_blocks;
      if (n == 0) {  // rows that see nothing: O = 0, LSE = -inf; nothing loaded
        reset();
        epilogue(cur.id, row_max, row_sum);
        have = fetch(++k, &cur);
        started = false;
        continue;
      }
      if (!started) {
        cur.qb = q_uses & 1;
        cur.kv0 = kv_pos;
        reset();
        MbarWait(cur.qb ? q_full1 : q_full, (q_uses >> 1) & 1);
        MbarWait(k_full + stage_of(cur.kv0), parity_of(cur.kv0));
        NamedBarrierSync(my_turn, 256);
        WgmmaFence();
        issue_s(q_lo_of(cur.qb), stage_of(cur.kv0));
        NamedBarrierArrive(next_turn, 256);
        WgmmaWait<0>();
        FenceRegs<kNS>(s);
        release(k_empty + stage_of(cur.kv0));
        if (n == 1) release(q_empty + cur.qb);
        softmax(cur, 0);
        pack_p();
      }
      const uint32_t q_lo = q_lo_of(cur.qb);
      for (int it = 1; it < n; ++it) {
        const uint32_t gk = cur.kv0 + it, gv = gk - 1;
        MbarWait(k_full + stage_of(gk), parity_of(gk));
        MbarWait(v_full + stage_of(gv), parity_of(gv));
        FenceRegs<kNO>(acc_o);
        FenceRegs<kBlockN / 4>(&a[0][0]);
        NamedBarrierSync(my_turn, 256);
        WgmmaFence();
        issue_s(q_lo, stage_of(gk));
        if (it >= 2) rescale_o();
        FenceRegs<kNO>(acc_o);
        FenceRegs<kBlockN / 4>(&a[0][0]);
        WgmmaFence();
        issue_pv(stage_of(gv));
        NamedBarrierArrive(next_turn, 256);
        WgmmaWait<1>();
        FenceRegs<kNS>(s);
        release(k_empty + stage_of(gk));
        if (it == n - 1) release(q_empty + cur.qb);
        softmax(cur, it);
        FenceRegs<kNS>(pr);
        FenceRegs<2>(row_sum);
        NamedBarrierSync(kPinBarrier + cw, 128);
        WgmmaWait<0>();
        FenceRegs<kNO>(acc_o);
        FenceRegs<kBlockN / 4>(&a[0][0]);
        release(v_empty + stage_of(gv));
        pack_p();
      }
      const uint32_t gv = cur.kv0 + n - 1;
      const bool have_next = fetch(k + 1, &nxt);
      if (have_next && nxt.n_blocks > 0) {
        // The last P V of cur in one turn with the S(0) of nxt.
        nxt.qb = (q_uses + 1) & 1;
        nxt.kv0 = cur.kv0 + n;
        MbarWait(nxt.qb ? q_full1 : q_full, ((q_uses + 1) >> 1) & 1);
        MbarWait(k_full + stage_of(nxt.kv0), parity_of(nxt.kv0));
        MbarWait(v_full + stage_of(gv), parity_of(gv));
        FenceRegs<kNO>(acc_o);
        FenceRegs<kBlockN / 4>(&a[0][0]);
        NamedBarrierSync(my_turn, 256);
        WgmmaFence();
        issue_s(q_lo_of(nxt.qb), stage_of(nxt.kv0));
        if (n >= 2) rescale_o();
        FenceRegs<kNO>(acc_o);
        FenceRegs<kBlockN / 4>(&a[0][0]);
        WgmmaFence();
        issue_pv(stage_of(gv));
        NamedBarrierArrive(next_turn, 256);
        WgmmaWait<1>();
        FenceRegs<kNS>(s);
        release(k_empty + stage_of(nxt.kv0));
        if (nxt.n_blocks == 1) release(q_empty + nxt.qb);
        const float rm[2] = {row_max[0], row_max[1]}, rs[2] = {row_sum[0], row_sum[1]};
        row_max[0] = row_max[1] = -INFINITY;
        row_sum[0] = row_sum[1] = 0.f;
        softmax(nxt, 0);
        FenceRegs<kNS>(pr);
        FenceRegs<2>(row_sum);
        NamedBarrierSync(kPinBarrier + cw, 128);
        WgmmaWait<0>();
        FenceRegs<kNO>(acc_o);
        FenceRegs<kBlockN / 4>(&a[0][0]);
        release(v_empty + stage_of(gv));
        pack_p();
        // The epilogue's address arithmetic must not be hoisted above the P V wait (it would
        // hold registers while the wgmmas own theirs, and ptxas then serialises every wgmma):
        // its tile id is opaque until here.
        int id = cur.id;
        asm volatile("" : "+r"(id));
        epilogue(id, rm, rs);
#pragma unroll
        for (int i = 0; i < kNO; ++i) acc_o[i] = 0.f;
        started = true;
      } else {
        MbarWait(v_full + stage_of(gv), parity_of(gv));
        FenceRegs<kNO>(acc_o);
        FenceRegs<kBlockN / 4>(&a[0][0]);
        if (n >= 2) rescale_o();
        FenceRegs<kNO>(acc_o);
        FenceRegs<kBlockN / 4>(&a[0][0]);
        WgmmaFence();
        issue_pv(stage_of(gv));
        WgmmaWait<0>();
        FenceRegs<kNO>(acc_o);
        FenceRegs<kBlockN / 4>(&a[0][0]);
        release(v_empty + stage_of(gv));
        epilogue(cur.id, row_max, row_sum);
        started = false;
      }
      kv_pos = cur.kv0 + n;
      ++q_uses;
      cur = nxt;
      have = have_next;
      ++k;
    }
    if (cw == 0) NamedBarrierSync(kTurnBarrier + 0, 256);
    return;
  }

  uint32_t kv_base = 0, q_uses = 0;  // as the producer's
  TileWork w = grid_work;
  IvRow iv_row[2];
  bool have_tile = true;
  if constexpr (kPersistent) have_tile = next_tile(0, &w, iv_row);
  for (int k = 0; have_tile; ++k) {
    const int h = w.t.h, b = w.t.b;
    const int64_t m_begin = w.m_begin;
    const int m_valid = w.m_valid, n_blocks = w.n_blocks, n_first = w.n_first;

    float acc_o[kNO];
#pragma unroll
    for (int i = 0; i < kNO; ++i) acc_o[i] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};

    if (n_blocks > 0) {
      // Iterations 0 .. n_masked - 1 (the last key blocks) need the mask; computed once in 64
      // bits so that the loop compares 32-bit counters only.
      // kIv: iterations [0, n_masked) and [n_unmasked_end, n_blocks) need the mask, and each
      // thread's two rows keep their visible key columns [lo, hi) (unit-local) in registers.
      const int n_masked =
          kIv ? w.iv_range.top
              : FwdWsMaskedBlocks(p.n, p.causal, p.q_row0 + m_begin - p.kv_row0, kBlockN,
                                  n_blocks);
      const int n_unmasked_end = kIv ? n_blocks - w.iv_range.bottom : n_blocks;
      auto mask_at = [&](int it) { return it < n_masked || (kIv && it >= n_unmasked_end); };
      // kIv: which ends of the rows' intervals cut block `it`: hi (the last blocks, `top`) and / or
      // lo (the first, `bottom`); a block outside one run lies inside that bound for every row
      // (lo and hi are non-decreasing), so its compare is left out.
      auto cuts_hi = [&](int it) { return it < n_masked; };
      auto cuts_lo = [&](int it) { return it >= n_unmasked_end; };
      float s[kNS], pr[kNS];  // scores, probabilities
      uint32_t a[kBlockN / 16][4];
      float corr[2] = {1.f, 1.f};
      // Low words of the matrix descriptors at k-step 0 of stage 0 (the high word is the same
      // constant for all three); a k-step or a stage adds a compile-time / uniform offset.
      const uint32_t qb = kPersistent ? (q_uses & 1) : 0;  // this tile's Q buffer
      const uint32_t q_lo = FwdWsDescLo((qb ? s_q1 : s_q) + cw * 64 * 64, 16);
      const uint32_t k_lo = FwdWsDescLo(s_k, 16);
      const uint32_t v_lo = FwdWsDescLo(s_v, kBlockN * 64 * 2);
      constexpr uint32_t kStageLo = Cfg::kKVElems * 2 / 16;
      auto issue_s = [&](uint32_t stage) {  // S = Q K^T for this warpgroup's 64 query rows
        const uint32_t ks_lo = k_lo + stage * kStageLo;
#pragma unroll
        for (int kk = 0; kk < kD / 16; ++kk) {
          const uint64_t dq =
              FwdWsDesc(q_lo + ((kk >> 2) * kBlockM * 64 + (kk & 3) * 16) * 2 / 16);
          const uint64_t dk =
              FwdWsDesc(ks_lo + ((kk >> 2) * kBlockN * 64 + (kk & 3) * 16) * 2 / 16);
          WgmmaSS<T, kBlockN, 0, 0>::Run(s, dq, dk, kk > 0 ? 1 : 0);
        }
        WgmmaCommit();
      };
      auto issue_pv = [&](uint32_t stage) {  // O += P V: P from registers, V read MN-major
        const uint32_t vs_lo = v_lo + stage * kStageLo;
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) {
          const uint64_t dv = FwdWsDesc(vs_lo + kk * 16 * 64 * 2 / 16);
          WgmmaRS<T, kD, 1>::Run(acc_o, a[kk], dv, 1);
        }
        WgmmaCommit();
      };
      // Mask and online softmax (base 2) of S(it) in place; sets corr, the factor for O.
      auto softmax = [&](int it, bool need_mask) {
        if (kIv && need_mask) {  // selects against each row's visible columns [lo, hi)
          const int n0 = (n_first + n_blocks - 1 - it) * kBlockN;
          int lo[2], hi[2];
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            lo[hf] = iv_row[hf].lo - n0 - 2 * t;
            hi[hf] = iv_row[hf].hi - n0 - 2 * t;
          }
          if (cuts_hi(it) && cuts_lo(it)) {
#pragma unroll
            for (int i = 0; i < kNS; ++i) {
              const int c = (i >> 2) * 8 + (i & 1);
              s[i] = (c >= lo[(i >> 1) & 1]) & (c < hi[(i >> 1) & 1]) ? s[i] : -INFINITY;
            }
          } else if (cuts_hi(it)) {
#pragma unroll
            for (int i = 0; i < kNS; ++i)
              s[i] = (i >> 2) * 8 + (i & 1) < hi[(i >> 1) & 1] ? s[i] : -INFINITY;
          } else {
#pragma unroll
            for (int i = 0; i < kNS; ++i)
              s[i] = (i >> 2) * 8 + (i & 1) >= lo[(i >> 1) & 1] ? s[i] : -INFINITY;
          }
        } else if (need_mask) {  // warp-uniform; selects against a per-row count of visible columns
          const int64_t n0 = int64_t{n_blocks - 1 - it} * kBlockN;
          int lim[2];
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            int64_t l = p.n - n0;  // columns < l are visible (col < n, kv_row0 + col <= q_row0 + row)
            if (p.causal) l = Min64(l, p.q_row0 + m_begin + row_base + hf * 8 - p.kv_row0 - n0 + 1);
            lim[hf] = static_cast<int>(l < 0 ? 0 : Min64(l, kBlockN)) - 2 * t;
          }
#pragma unroll
          for (int i = 0; i < kNS; ++i)
            s[i] = (i >> 2) * 8 + (i & 1) < lim[(i >> 1) & 1] ? s[i] : -INFINITY;
        }
        // A row that has seen no key yet keeps max -inf and uses 0 as its reference.
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          // Row maximum as a tree (depth 5 instead of a chain of 16 dependent FMNMX).
          float v[kBlockN / 8];
#pragma unroll
          for (int j = 0; j < kBlockN / 8; ++j)
            v[j] = fmaxf(s[4 * j + 2 * hf], s[4 * j + 2 * hf + 1]);
          static_assert(kBlockN == 128, "the tree below folds 16 values");
#pragma unroll
          for (int j = 0; j < 8; ++j) v[j] = fmaxf(v[j], v[j + 8]);
#pragma unroll
          for (int j = 0; j < 4; ++j) v[j] = fmaxf(v[j], v[j + 4]);
          v[0] = fmaxf(v[0], v[2]);
          v[1] = fmaxf(v[1], v[3]);
          v[0] = fmaxf(v[0], v[1]);
          const float mx = fmaxf(QuadMax(v[0]) * scale_log2, row_max[hf]);
          const float ref = mx == -INFINITY ? 0.f : mx;
          corr[hf] = FastExp2(row_max[hf] - ref);
          row_max[hf] = mx;
          float sum = 0.f;
#pragma unroll
          for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float pv = FastExp2(s[4 * j + 2 * hf + e] * scale_log2 - ref);
              pr[4 * j + 2 * hf + e] = pv;
              sum += pv;
            }
          row_sum[hf] = row_sum[hf] * corr[hf] + sum;
        }
      };
      // O *= corr, skipped (a warp-uniform branch) when no row of the warp changed its maximum:
      // corr is then exactly 1 for every row, so the result is the same.
      auto rescale_o = [&]() {
        if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
          for (int dt = 0; dt < kD / 8; ++dt) {
            acc_o[4 * dt + 0] *= corr[0];
            acc_o[4 * dt + 1] *= corr[0];
            acc_o[4 * dt + 2] *= corr[1];
            acc_o[4 * dt + 3] *= corr[1];
          }
        }
      };
      auto pack_p = [&]() {  // P -> A fragments of P V
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) {
          a[kk][0] = Tr::Pack(pr[8 * kk + 0], pr[8 * kk + 1]);
          a[kk][1] = Tr::Pack(pr[8 * kk + 2], pr[8 * kk + 3]);
          a[kk][2] = Tr::Pack(pr[8 * kk + 4], pr[8 * kk + 5]);
          a[kk][3] = Tr::Pack(pr[8 * kk + 6], pr[8 * kk + 7]);
        }
      };
      // The K/V ring position of walk step `it` and its phase parity.
      auto stage_of = [&](int it) { return (kv_base + static_cast<uint32_t>(it)) % kStages; };
      auto parity_of = [&](int it) {
        return ((kv_base + static_cast<uint32_t>(it)) / kStages) & 1;
      };

      MbarWait(qb ? q_full1 : q_full, kPersistent ? (q_uses >> 1) & 1 : 0);
      MbarWait(k_full + stage_of(0), parity_of(0));
      NamedBarrierSync(my_turn, 256);
      WgmmaFence();
      issue_s(stage_of(0));
      NamedBarrierArrive(next_turn, 256);
      WgmmaWait<0>();
      FenceRegs<kNS>(s);
      release(k_empty + stage_of(0));
      if (kPersistent && n_blocks == 1) release(q_empty + qb);  // this tile's last S is done
      softmax(0, mask_at(0));
      pack_p();  // O is still 0: no rescale
      // O is rescaled between the issue of S(it) and that of P V(it - 1) (FlashAttention-3's
      // RescaleOBeforeGemm order): the rescale is off the path from the end of softmax(it - 1)
      // to the next S issue and runs while S(it) is on the tensor cores.
      for (int it = 1; it < n_blocks; ++it) {
        const uint32_t sk = stage_of(it), sv = stage_of(it - 1);
        MbarWait(k_full + sk, parity_of(it));
        MbarWait(v_full + sv, parity_of(it - 1));  // before the turn: no wait between GEMMs
        FenceRegs<kNO>(acc_o);
        FenceRegs<kBlockN / 4>(&a[0][0]);
        NamedBarrierSync(my_turn, 256);
        WgmmaFence();
        issue_s(sk);
        if (it >= 2) rescale_o();  // O is still 0 at it == 1
        FenceRegs<kNO>(acc_o);
        FenceRegs<kBlockN / 4>(&a[0][0]);
        WgmmaFence();
        issue_pv(sv);
        NamedBarrierArrive(next_turn, 256);
        WgmmaWait<1>();  // S done, P V may still run
        FenceRegs<kNS>(s);
        release(k_empty + sk);
        if (kPersistent && it == n_blocks - 1) release(q_empty + qb);
        softmax(it, mask_at(it));
        FenceRegs<kNS>(pr);
        FenceRegs<2>(row_sum);
        NamedBarrierSync(kPinBarrier + cw, 128);  // keeps ptxas from hoisting the wait
        WgmmaWait<0>();
        FenceRegs<kNO>(acc_o);
        FenceRegs<kBlockN / 4>(&a[0][0]);
        release(v_empty + sv);
        pack_p();
      }
      const uint32_t sv = stage_of(n_blocks - 1);
      MbarWait(v_full + sv, parity_of(n_blocks - 1));
      FenceRegs<kNO>(acc_o);
      FenceRegs<kBlockN / 4>(&a[0][0]);
      if (n_blocks >= 2) rescale_o();
      FenceRegs<kNO>(acc_o);
      FenceRegs<kBlockN / 4>(&a[0][0]);
      WgmmaFence();
      issue_pv(sv);
      WgmmaWait<0>();
      FenceRegs<kNO>(acc_o);
      FenceRegs<kBlockN / 4>(&a[0][0]);
      if constexpr (kPersistent) release(v_empty + sv);
      kv_base += static_cast<uint32_t>(n_blocks);
      ++q_uses;
    }
    // Balances the last consumer's first hand-over (consumer 0 waits once more than the
    // others); the persistent kernel does so after its last tile.
    if constexpr (!kPersistent) {
      if (cw == 0) NamedBarrierSync(kTurnBarrier + 0, 256);
    }
    TileWork w_next;
    IvRow iv_next[2];
    bool have_next = false;
    if constexpr (kPersistent) have_next = next_tile(k + 1, &w_next, iv_next);

    // Epilogue: O = acc / l, LSE = max + log(l); empty rows get O = 0, LSE = -inf.
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const float l = QuadSum(row_sum[hf]);
      const int r = row_base + hf * 8;
      if (r >= m_valid) continue;
      const int64_t row = m_begin + r;
      float lse_b = l > 0.f ? row_max[hf] * kLn2 + logf(l) : -INFINITY;
      float wa = 0.f, wb = l > 0.f ? 1.f / l : 0.f;
      float* lse_ptr = p.lse + b * p.lse_batch_stride + h * p.lse_head_stride + row;
      if (p.accumulate) {
        const float lse_a = *lse_ptr;
        const float mx = fmaxf(lse_a, lse_b);
        if (mx == -INFINITY) {
          lse_b = -INFINITY;
          wb = 0.f;
        } else {
          const float ea = __expf(lse_a - mx), eb = __expf(lse_b - mx);
          const float inv = 1.f / (ea + eb);
          wa = ea * inv;
          wb *= eb * inv;
          lse_b = mx + logf(ea + eb);
        }
      }
      if (t == 0) *lse_ptr = lse_b;
      const int64_t o_off = b * p.o_batch_stride + row * p.o_row_stride + int64_t{h} * kD + 2 * t;
      if (p.out_f32) {
        float* o = static_cast<float*>(p.out) + o_off;
#pragma unroll
        for (int dt = 0; dt < kD / 8; ++dt) {
          float2 v = make_float2(acc_o[4 * dt + 2 * hf] * wb, acc_o[4 * dt + 2 * hf + 1] * wb);
          if (p.accumulate) {
            const float2 old = *reinterpret_cast<const float2*>(o + dt * 8);
            v.x += old.x * wa;
            v.y += old.y * wa;
          }
          *reinterpret_cast<float2*>(o + dt * 8) = v;
        }
      } else {
        T* o = static_cast<T*>(p.out) + o_off;
#pragma unroll
        for (int dt = 0; dt < kD / 8; ++dt) {
          *reinterpret_cast<uint32_t*>(o + dt * 8) =
              Tr::Pack(acc_o[4 * dt + 2 * hf] * wb, acc_o[4 * dt + 2 * hf + 1] * wb);
        }
      }
    }
    if constexpr (!kPersistent) break;
    w = w_next;
    iv_row[0] = iv_next[0];
    iv_row[1] = iv_next[1];
    have_tile = have_next;
  }
  if constexpr (kPersistent) {
    if (cw == 0) NamedBarrierSync(kTurnBarrier + 0, 256);
  }
#else
  __trap();  // only the sm_90a build carries this kernel; the launcher never picks it elsewhere
#endif
}

// Queues the warp-specialised forward. Returns cudaErrorNotSupported, with nothing queued, when
// the tensors cannot be described by TMA descriptors (the caller then runs another kernel).
// kIv (persistent): min(tiles, p.sms) CTAs and a tile counter allocated, zeroed and freed on
// `stream` around the launch, so that launches on other streams never share it.
template <typename T, int kD, int kBlockN, int kStages, int kConsumers = 2, bool kIv = false>
cudaError_t LaunchFwdSm90Ws(const FwdParams& p, cudaStream_t stream) {
  using Cfg = FwdWsTraits<kD, kBlockN, kStages, kConsumers, kIv ? 2 : 1>;
  FwdTmaMaps maps;
  if (p.m <= 0 || p.n <= 0 || p.kv_heads <= 0 || p.q_heads % p.kv_heads != 0 ||
      !EncodeRowTensorMap<T>(&maps.q, p.q, kD, p.q_heads, p.m, p.batch, p.q_row_stride,
                             p.q_batch_stride, Cfg::kBlockM) ||
      !EncodeRowTensorMap<T>(&maps.k, p.k, kD, p.kv_heads, p.n, p.batch, p.k_row_stride,
                             p.k_batch_stride, kBlockN) ||
      !EncodeRowTensorMap<T>(&maps.v, p.v, kD, p.kv_heads, p.n, p.batch, p.v_row_stride,
                             p.v_batch_stride, kBlockN)) {
    return cudaErrorNotSupported;
  }
  auto kernel = FlashFwdSm90WsKernel<T, kD, kBlockN, kStages, kConsumers, kIv>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const int64_t m_blocks = (p.m + Cfg::kBlockM - 1) / Cfg::kBlockM;
  if constexpr (kIv) {
    const int64_t tiles = m_blocks * p.q_heads * p.batch;
    if (tiles > INT32_MAX) return cudaErrorInvalidValue;
    int sms = p.sms;
    if (sms <= 0) {
      int dev = 0;
      if ((err = cudaGetDevice(&dev)) != cudaSuccess) return err;
      if ((err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess)
        return err;
    }
    FwdParams pp = p;
    if ((err = cudaMallocAsync(reinterpret_cast<void**>(&pp.tile_counter), sizeof(int), stream)) !=
        cudaSuccess)
      return err;
    err = cudaMemsetAsync(pp.tile_counter, 0, sizeof(int), stream);
    if (err == cudaSuccess) {
      const unsigned ctas = static_cast<unsigned>(tiles < sms ? tiles : sms);
      kernel<<<ctas, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(pp, maps);
      err = cudaGetLastError();
    }
    const cudaError_t free_err = cudaFreeAsync(pp.tile_counter, stream);
    return err != cudaSuccess ? err : free_err;
  } else {
    const dim3 grid(static_cast<unsigned>(m_blocks), p.q_heads, p.batch);
    kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p, maps);
    return cudaGetLastError();
  }
}

}  // namespace dfa::cuda
