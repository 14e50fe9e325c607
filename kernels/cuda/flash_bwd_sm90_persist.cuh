// Hopper backward, persistent form of the pipe kernel's deferred column split (pipe modes 4 / 5,
// head dim 128; flash_bwd_sm90_pipe.cuh has the per-item algorithm, which is unchanged here).
// Same contract as FlashBwdSm90PipeKernel (BwdParams; ComputeDelta has run; dq, dk, dv fp32,
// receive +=). Chosen by the head dim 128 launchers when Sm90BwdPersist() (sm90_dispatch.h) is on.
//
// What differs from the pipe kernel:
// - Grid = min(tiles, SMs) CTAs, each looping over tiles (key block, kv head x batch) taken from
//   a dynamic tile counter: CTA c starts with tile c, then producer warp 0 claims the next with one
//   atomicAdd once it has issued every load of its current tile (about two items before the
//   consumers finish it), so long and short tiles even out across SMs like the hardware's CTA
//   dispatch, without its per-CTA cost. Tile ids map to tiles through LongestFirstTile
//   (bwd_tile_order.h, `sched.chunk`).
// - The tile id reaches the other warps through a 2-slot shared ring (tile_full / tile_empty
//   mbarriers); a claimed id >= the tile count ends every role.
// - Barrier init and register reallocation happen once per CTA; the Q / dO ring, dS^T buffers
//   and dQ staging run on CTA-global item counters across tiles. Warpgroup 1's start offset
//   (`sched.start`) is applied per tile, since both warpgroups meet at each tile's K / V.
// - K / V have one buffer: the consumers release it (kv_empty, one arrival per warp) after the
//   tile's last dQ, then add dK / dV to global memory while the producer loads the next tile's
//   K / V (after that tile's first Q / dO stage), i.e. the epilogue and the next tile's first
//   loads overlap.
// The counter is one of kBwdPersistSlots device words, zeroed by the launcher on the stream before
// the kernel (cudaMemsetAsync); slots rotate per launch, so at most kBwdPersistSlots launches of
// one translation unit may be in flight on different streams at once (launches on one stream are
// ordered anyway).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>

#include "kernels/cuda/bwd_tile_order.h"
#include "kernels/cuda/flash_bwd_sm90_epilogue.cuh"
#include "kernels/cuda/flash_bwd_sm90_pipe.cuh"
#include "kernels/cuda/flash_params.h"
#include "kernels/cuda/sm90_common.cuh"
#include "kernels/cuda/sm90_dispatch.h"
#include "kernels/cuda/sm90_tma.cuh"

namespace dfa::cuda {

constexpr int kBwdPersistSlots = 64;
static __device__ unsigned int g_bwd_persist_counters[kBwdPersistSlots];

template <int kD>
struct BwdPersistTraits : BwdPipeTraits<kD, BwdPipeVariant::kDefer> {
  using Base = BwdPipeTraits<kD, BwdPipeVariant::kDefer>;
  // After the pipe kernel's 15 mbarriers: kv_empty, tile_full[2], tile_empty[2], tile ids [2].
  static constexpr int kExtraOffset = Base::kBarOffset + 8 * 15;
  static constexpr int kSmemBytes = Base::kSmemBytes + 8 * 5 + 8;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

template <typename T, int kD>
__global__ void __launch_bounds__(384, 1)
    FlashBwdSm90PersistKernel(const __grid_constant__ BwdParams p,
                              const __grid_constant__ BwdPipeMaps maps, BwdPipeSched sched,
                              unsigned int* tile_counter, int key_blocks, int head_batches) {
#ifdef DFA_WGMMA
  using Tr = ElemTraits<T>;
  using Cfg = BwdPersistTraits<kD>;
  constexpr int kBlockN = Cfg::kBlockN, kBlockM = Cfg::kBlockM, kStages = Cfg::kStages;
  constexpr int kPanels = kD / 64;
  constexpr int kNS = kBlockM / 2;
  constexpr int kNA = kD / 2;
  extern __shared__ __align__(1024) char smem_bwpp[];
  char* base = smem_bwpp + ((1024 - (SmemAddr(smem_bwpp) & 1023)) & 1023);
  T* s_k = reinterpret_cast<T*>(base);
  T* s_v = s_k + Cfg::kKVElems;
  T* s_q_base = s_v + Cfg::kKVElems;
  T* s_do_base = s_q_base + kStages * Cfg::kQElems;
  T* s_ds_base = s_do_base + kStages * Cfg::kQElems;  // 3 buffers
  float* s_lse = reinterpret_cast<float*>(base + Cfg::kStatOffset);
  float* s_delta = s_lse + kStages * kBlockM;
  char* s_dq = base + Cfg::kDqOffset;
  uint64_t* kv_full = reinterpret_cast<uint64_t*>(base + Cfg::kBarOffset);
  uint64_t* full = kv_full + 1;
  uint64_t* empty = full + kStages;
  uint64_t* dq_full = empty + kStages;
  uint64_t* dq_empty = dq_full + 2;
  uint64_t* ds_full = dq_empty + 2;
  uint64_t* ds_empty = ds_full + 3;
  uint64_t* kv_empty = reinterpret_cast<uint64_t*>(base + Cfg::kExtraOffset);
  uint64_t* tile_full = kv_empty + 1;                    // [2]
  uint64_t* tile_empty = tile_full + 2;                  // [2]
  int* s_tile = reinterpret_cast<int*>(tile_empty + 2);  // [2]

  const int total = key_blocks * head_batches;
  const int group = p.q_heads / p.kv_heads;
  const int tid = threadIdx.x;
  const int wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int m_blocks = static_cast<int>((p.m + kBlockM - 1) / kBlockM);

  // The tile of id `lin` (< total): key block, kv head, batch, first visible query block.
  struct Tile {
    int nb, hk, b, m_block_min, per_head, items;
  };
  auto decode = [&](int lin) {
    const BwdTile bt = LongestFirstTile(lin, key_blocks, head_batches, p.causal ? sched.chunk : 0);
    Tile tl;
    tl.nb = bt.key_block;
    tl.hk = bt.head_batch % p.kv_heads;
    tl.b = bt.head_batch / p.kv_heads;
    tl.m_block_min = 0;
    if (p.causal) {
      const int64_t first = p.kv_row0 + int64_t{tl.nb} * kBlockN - p.q_row0;
      if (first > 0) tl.m_block_min = static_cast<int>(Min64(first / kBlockM, m_blocks));
    }
    tl.per_head = m_blocks - tl.m_block_min;
    tl.items = group * tl.per_head;  // 0: nothing visible, dK / dV unchanged
    return tl;
  };
  // Reads the id of the CTA's j-th tile from the ring and releases the slot (one arrival per
  // warp of the 10 reader warps).
  auto read_tile = [&](int j) {
    MbarWait(tile_full + (j & 1), (j >> 1) & 1);
    const int lin = *reinterpret_cast<volatile int*>(s_tile + (j & 1));
    __syncwarp();
    if (lane == 0) MbarArrive(tile_empty + (j & 1));
    // Broadcast from lane 0: the compiler then knows the id (and the item loop bounds derived
    // from it) to be warp-uniform and keeps the wgmma descriptors in uniform registers.
    return __shfl_sync(0xffffffffu, lin, 0);
  };

  if (tid == 0) {
    MbarInit(kv_full, 1);
    MbarInit(kv_empty, 8);
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      MbarInit(full + s, 1 + 32);
      MbarInit(empty + s, 8);
    }
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      MbarInit(dq_full + w, 128);
      MbarInit(dq_empty + w, 1);
      MbarInit(tile_full + w, 1);
      MbarInit(tile_empty + w, 10);  // 8 consumer warps + 2 dQ writer warps
    }
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      MbarInit(ds_full + i, 8);
      MbarInit(ds_empty + i, 8);
    }
    FenceMbarInit();
  }
  __syncthreads();

  if (wg == 0) {  // producer
    SetMaxNRegDec<Cfg::kProducerRegs>();
    if (warp == 0) {
      int g = 0, tile_iter = 0;
      for (int j = 0;; ++j) {
        MbarWait(tile_empty + (j & 1), ((j >> 1) & 1) ^ 1);
        int lin = 0;
        if (lane == 0) {
          lin = j == 0 ? static_cast<int>(blockIdx.x)
                       : static_cast<int>(gridDim.x + atomicAdd(tile_counter, 1u));
          s_tile[j & 1] = lin;
          MbarArrive(tile_full + (j & 1));
        }
        lin = __shfl_sync(0xffffffffu, lin, 0);
        if (lin >= total) break;
        const Tile tl = decode(lin);
        if (tl.items == 0) continue;
        for (int it = 0; it < tl.items; ++it, ++g) {
          const int s = g % kStages;
          MbarWait(empty + s, ((g / kStages) & 1) ^ 1);
          const int h = tl.hk * group + it / tl.per_head;
          const int64_t m_begin = int64_t{tl.m_block_min + it % tl.per_head} * kBlockM;
          if (lane == 0) {
            MbarArriveExpectTx(full + s, 2 * Cfg::kQElems * 2);
#pragma unroll
            for (int pn = 0; pn < kPanels; ++pn) {
              TmaLoad4d(s_q_base + s * Cfg::kQElems + pn * kBlockM * 64, &maps.q, full + s, pn * 64,
                        h, static_cast<int>(m_begin), tl.b);
              TmaLoad4d(s_do_base + s * Cfg::kQElems + pn * kBlockM * 64, &maps.dout, full + s,
                        pn * 64, h, static_cast<int>(m_begin), tl.b);
            }
          }
          const float* lse_g = p.lse + tl.b * p.lse_batch_stride + h * p.lse_head_stride + m_begin;
          const float* delta_g =
              p.delta + tl.b * p.delta_batch_stride + h * p.delta_head_stride + m_begin;
#pragma unroll
          for (int r = lane; r < kBlockM; r += 32) {
            float l = INFINITY, d = 0.f;
            if (m_begin + r < p.m) {
              const float lse = lse_g[r];
              if (lse != -INFINITY) l = lse * kLog2e;
              d = delta_g[r];
            }
            s_lse[s * kBlockM + r] = l;
            s_delta[s * kBlockM + r] = d;
          }
          MbarArrive(full + s);
          if (it == 0) {  // K / V once the consumers are done with the previous tile's
            MbarWait(kv_empty, (tile_iter & 1) ^ 1);
            if (lane == 0) {
              MbarArriveExpectTx(kv_full, 2 * Cfg::kKVElems * 2);
              const int n0 = tl.nb * kBlockN;
#pragma unroll
              for (int pn = 0; pn < kPanels; ++pn) {
                TmaLoad4d(s_k + pn * kBlockN * 64, &maps.k, kv_full, pn * 64, tl.hk, n0, tl.b);
                TmaLoad4d(s_v + pn * kBlockN * 64, &maps.v, kv_full, pn * 64, tl.hk, n0, tl.b);
              }
            }
          }
        }
        ++tile_iter;
      }
    } else if (warp <= 2) {  // dQ writer of consumer warpgroup w
      const int w = warp - 1;
      const char* src = s_dq + w * Cfg::kDqWgFloats * 4;
      int g = 0;
      for (int j = 0;; ++j) {
        const int lin = read_tile(j);
        if (lin >= total) break;
        const Tile tl = decode(lin);
        for (int it = 0; it < tl.items; ++it, ++g) {
          MbarWait(dq_full + w, g & 1);
          if (lane == 0) {
            const int h = tl.hk * group + it / tl.per_head;
            const int m_row = (tl.m_block_min + it % tl.per_head) * kBlockM;
#pragma unroll
            for (int pn = 0; pn < Cfg::kDqPanels; ++pn)
              TmaReduceAdd4d(&maps.dq, src + pn * 64 * 128, w * 64 + pn * 32, h, m_row, tl.b);
            BulkCommit();
            BulkWaitRead();
          }
          __syncwarp();
          if (lane == 0) MbarArrive(dq_empty + w);
        }
      }
      if (lane == 0) BulkWait();
    }
    return;
  }

  // Consumers.
  SetMaxNRegInc<Cfg::kConsumerRegs>();
  const int cw = wg - 1;
  const int g4 = lane >> 2, t = lane & 3;
  const int key_base = cw * 64 + warp * 16 + g4;
  const int qrow_base = warp * 16 + g4;
  const float scale_log2 = p.scale * kLog2e;
  char* s_dq_wg = s_dq + cw * Cfg::kDqWgFloats * 4;

  // Odd g4 store column group j ^ 2 (bank conflicts: the pipe kernel's stage_dq says why).
  // Offsets of this thread's four column groups computed once (as in the pipe kernel).
  const bool odd_g = (g4 & 1) != 0;
  int stage_off[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) stage_off[j] = DqStageOffset(qrow_base, (odd_g ? j ^ 2 : j) * 8 + 2 * t);
  auto stage_dq = [&](const float* acc_dq) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float v0 = odd_g ? acc_dq[4 * (j ^ 2) + 2 * hf] : acc_dq[4 * j + 2 * hf];
        const float v1 = odd_g ? acc_dq[4 * (j ^ 2) + 2 * hf + 1] : acc_dq[4 * j + 2 * hf + 1];
        *reinterpret_cast<float2*>(s_dq_wg + stage_off[j & 3] + (j >> 2) * 64 * 128 +
                                   hf * 8 * 128) = make_float2(v0 * p.scale, v1 * p.scale);
      }
    }
  };

  // wgmma descriptors: a base per operand tile, k-steps added with DescPlus (the compiler cannot
  // keep them in uniform registers here, so each MakeSmemDesc per wgmma would be vector work).
  const uint64_t desc_k = MakeSmemDesc(s_k + cw * 64 * 64, 16, 1024);  // K-major, own 64 keys
  const uint64_t desc_v = MakeSmemDesc(s_v + cw * 64 * 64, 16, 1024);
  const uint64_t desc_k_mn = MakeSmemDesc(s_k + cw * kBlockN * 64, kBlockN * 64 * 2, 1024);

  int g = 0, tile_iter = 0;
  for (int j = 0;; ++j) {
    const int lin = read_tile(j);
    if (lin >= total) break;
    const Tile tl = decode(lin);
    if (tl.items == 0) continue;
    const int64_t n_begin = int64_t{tl.nb} * kBlockN;
    const int n_valid = static_cast<int>(Min64(kBlockN, p.n - n_begin));

    float acc_dk[kNA], acc_dv[kNA];
#pragma unroll
    for (int i = 0; i < kNA; ++i) acc_dk[i] = acc_dv[i] = 0.f;

    // Warpgroup 1 starts each tile late (the pipe kernel's start offset): the two warpgroups meet
    // at every tile's K / V, so the stagger is set up again per tile.
    if (cw == 1 && sched.start) NamedBarrierSync(kBwdPipeStartBarrier, 256);
    MbarWait(kv_full, tile_iter & 1);
    for (int li = 0; li < tl.items; ++li, ++g) {
      const int s = g % kStages;
      const int64_t m_begin = int64_t{tl.m_block_min + li % tl.per_head} * kBlockM;
      const T* s_q = s_q_base + s * Cfg::kQElems;
      const T* s_do = s_do_base + s * Cfg::kQElems;
      T* s_ds = s_ds_base + (g % 3) * Cfg::kDsElems;
      const float* s_lse_cur = s_lse + s * kBlockM;
      const float* s_delta_cur = s_delta + s * kBlockM;
      const uint64_t desc_q = MakeSmemDesc(s_q, 16, 1024);
      const uint64_t desc_do = MakeSmemDesc(s_do, 16, 1024);
      const uint64_t desc_q_mn = MakeSmemDesc(s_q, kBlockM * 64 * 2, 1024);
      const uint64_t desc_do_mn = MakeSmemDesc(s_do, kBlockM * 64 * 2, 1024);
      MbarWait(full + s, (g / kStages) & 1);
      float st[kNS], dpt[kNS];
      WgmmaFence();
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        const int off = (kk & 3) * 16;
        const uint64_t da = DescPlus(desc_k, (kk >> 2) * kBlockN * 64 + off);
        const uint64_t db = DescPlus(desc_q, (kk >> 2) * kBlockM * 64 + off);
        WgmmaSS<T, kBlockM, 0, 0>::Run(st, da, db, kk > 0 ? 1 : 0);
      }
      WgmmaCommit();
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        const int off = (kk & 3) * 16;
        const uint64_t da = DescPlus(desc_v, (kk >> 2) * kBlockN * 64 + off);
        const uint64_t db = DescPlus(desc_do, (kk >> 2) * kBlockM * 64 + off);
        WgmmaSS<T, kBlockM, 0, 0>::Run(dpt, da, db, kk > 0 ? 1 : 0);
      }
      WgmmaCommit();
      WgmmaWait<1>();
      FenceRegs<kNS>(st);

      // P^T, masked entries 0: keys past n, and (causal) key - query > the diagonal offset `lim`
      // (clamped: |key - query| < 128 inside a tile). Selects, not branches: the compiler cannot
      // prove the tile (read from shared memory) warp-uniform, and a branch per element would
      // cost a convergence barrier each.
      const int64_t diag = p.q_row0 + m_begin - p.kv_row0 - n_begin;
      const int lim =
          p.causal ? static_cast<int>(diag < -256 ? -256 : (diag > 256 ? 256 : diag)) : 256;
#pragma unroll
      for (int i = 0; i < kNS; ++i) {
        const int ml = (i >> 2) * 8 + 2 * t + (i & 1);
        const int nl = key_base + ((i >> 1) & 1) * 8;
        const float pv = FastExp2(st[i] * scale_log2 - s_lse_cur[ml]);
        st[i] = (nl >= n_valid) | (nl - ml > lim) ? 0.f : pv;
      }
      uint32_t ap[kBlockM / 16][4];
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        ap[kk][0] = Tr::Pack(st[8 * kk + 0], st[8 * kk + 1]);
        ap[kk][1] = Tr::Pack(st[8 * kk + 2], st[8 * kk + 3]);
        ap[kk][2] = Tr::Pack(st[8 * kk + 4], st[8 * kk + 5]);
        ap[kk][3] = Tr::Pack(st[8 * kk + 6], st[8 * kk + 7]);
      }
      NamedBarrierArriveIf(kBwdPipeStartBarrier, 256, cw == 0 && li == 0 && sched.start == 1);
      FenceRegs<kNA>(acc_dv);
      WgmmaFence();
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        const uint64_t db = DescPlus(desc_do_mn, kk * 16 * 64);
        WgmmaRS<T, kD, 1>::Run(acc_dv, ap[kk], db, 1);
      }
      WgmmaCommit();
      WgmmaWait<1>();
      FenceRegs<kNS>(dpt);

      uint32_t ads[kBlockM / 16][4];
      if (g >= 3) MbarWait(ds_empty + g % 3, ((g - 3) / 3) & 1);
#pragma unroll
      for (int i = 0; i < kNS; ++i)
        dpt[i] = st[i] * (dpt[i] - s_delta_cur[(i >> 2) * 8 + 2 * t + (i & 1)]);
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        ads[kk][0] = Tr::Pack(dpt[8 * kk + 0], dpt[8 * kk + 1]);
        ads[kk][1] = Tr::Pack(dpt[8 * kk + 2], dpt[8 * kk + 3]);
        ads[kk][2] = Tr::Pack(dpt[8 * kk + 4], dpt[8 * kk + 5]);
        ads[kk][3] = Tr::Pack(dpt[8 * kk + 6], dpt[8 * kk + 7]);
        *reinterpret_cast<uint32_t*>(s_ds + Sw128<kBlockN>(key_base, kk * 16 + 2 * t)) = ads[kk][0];
        *reinterpret_cast<uint32_t*>(s_ds + Sw128<kBlockN>(key_base + 8, kk * 16 + 2 * t)) =
            ads[kk][1];
        *reinterpret_cast<uint32_t*>(s_ds + Sw128<kBlockN>(key_base, kk * 16 + 8 + 2 * t)) =
            ads[kk][2];
        *reinterpret_cast<uint32_t*>(s_ds + Sw128<kBlockN>(key_base + 8, kk * 16 + 8 + 2 * t)) =
            ads[kk][3];
      }
      FenceProxyAsync();
      __syncwarp();
      MbarArriveIf(ds_full + g % 3, lane == 0);
      NamedBarrierArriveIf(kBwdPipeStartBarrier, 256, cw == 0 && li == 0 && sched.start == 2);

      // The previous item's dQ (at a tile's first item a dummy one on buffer (g + 2) % 3, never
      // staged nor released), then this item's dK.
      float acc_dq[32];
      const int dq_item = g - 1;
      if (li > 0) MbarWait(ds_full + dq_item % 3, (dq_item / 3) & 1);
      WgmmaFence();
      {
        const uint64_t desc_ds =
            MakeSmemDesc(s_ds_base + ((g + 2) % 3) * Cfg::kDsElems, kBlockN * 64 * 2, 1024);
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) {
          const uint64_t da = DescPlus(desc_ds, kk * 16 * 64);
          const uint64_t db = DescPlus(desc_k_mn, kk * 16 * 64);
          WgmmaSS<T, 64, 1, 1>::Run(acc_dq, da, db, kk > 0 ? 1 : 0);
        }
        WgmmaCommit();
      }
      FenceRegs<kNA>(acc_dk);
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        const uint64_t db = DescPlus(desc_q_mn, kk * 16 * 64);
        WgmmaRS<T, kD, 1>::Run(acc_dk, ads[kk], db, 1);
      }
      WgmmaCommit();
      WgmmaWait<1>();
      FenceRegs<32>(acc_dq);
      FenceRegs<kNA>(acc_dv);
      FenceRegs<kBlockM / 4>(&ap[0][0]);
      __syncwarp();
      MbarArriveIf(ds_empty + (g + 2) % 3, li > 0 && lane == 0);

      if (li > 0) {
        MbarWait(dq_empty + cw, (dq_item & 1) ^ 1);
        stage_dq(acc_dq);
        FenceProxyAsync();
        MbarArrive(dq_full + cw);
      }

      WgmmaWait<0>();
      FenceRegs<kNA>(acc_dk);
      FenceRegs<kBlockM / 4>(&ads[0][0]);
      if (lane == 0) MbarArrive(empty + s);
    }
    {  // the tile's last dQ; then K / V are free for the next tile
      const int dq_item = g - 1;
      MbarWait(ds_full + dq_item % 3, (dq_item / 3) & 1);
      float acc_dq[32];
      const uint64_t desc_ds_last =
          MakeSmemDesc(s_ds_base + (dq_item % 3) * Cfg::kDsElems, kBlockN * 64 * 2, 1024);
      WgmmaFence();
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        const uint64_t da = DescPlus(desc_ds_last, kk * 16 * 64);
        const uint64_t db = DescPlus(desc_k_mn, kk * 16 * 64);
        WgmmaSS<T, 64, 1, 1>::Run(acc_dq, da, db, kk > 0 ? 1 : 0);
      }
      WgmmaCommit();
      WgmmaWait<0>();
      FenceRegs<32>(acc_dq);
      __syncwarp();
      if (lane == 0) {
        MbarArrive(ds_empty + dq_item % 3);
        MbarArrive(kv_empty);
      }
      MbarWait(dq_empty + cw, (dq_item & 1) ^ 1);
      stage_dq(acc_dq);
      FenceProxyAsync();
      MbarArrive(dq_full + cw);
    }
    AddDkDvRows<kD>(p, acc_dk, acc_dv, tl.hk, tl.b, n_begin, n_valid, key_base, t, sched.epilogue);
    ++tile_iter;
  }
#else
  __trap();  // only the sm_90a build carries this kernel; the launcher never picks it elsewhere
#endif
}

// Tiles (128-key blocks x kv heads x batch) of a backward unit: what Sm90BwdPersist compares
// with the SM count.
inline int64_t Sm90BwdTiles(const BwdParams& p) {
  return (p.n + 127) / 128 * p.kv_heads * int64_t{p.batch};
}

// Queues the persistent backward (head dim 128; mode 4: warpgroup 1 starts after warpgroup 0's
// first P^T, 5: together, DFA_CUDA_BWD_START overrides). Returns cudaErrorNotSupported, with
// nothing queued, when TMA cannot describe the tensors or the grid is too large for int ids.
template <typename T, int kD>
cudaError_t LaunchBwdSm90Persist(const BwdParams& p, int mode, cudaStream_t stream) {
  static_assert(kD == 128, "the deferred column split needs head dim 128");
  using Cfg = BwdPersistTraits<kD>;
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN;
  BwdPipeMaps maps;
  if (p.m <= 0 || p.n <= 0 || p.kv_heads <= 0 || p.q_heads % p.kv_heads != 0 || p.m > INT32_MAX ||
      p.n > INT32_MAX || p.q_heads > INT32_MAX / kD ||
      (p.n + kBlockN - 1) / kBlockN * p.kv_heads * int64_t{p.batch} > INT32_MAX / 2 ||
      !EncodeRowTensorMap<T>(&maps.q, p.q, kD, p.q_heads, p.m, p.batch, p.q_row_stride,
                             p.q_batch_stride, kBlockM) ||
      !EncodeRowTensorMap<T>(&maps.dout, p.dout, kD, p.q_heads, p.m, p.batch, p.do_row_stride,
                             p.do_batch_stride, kBlockM) ||
      !EncodeRowTensorMap<T>(&maps.k, p.k, kD, p.kv_heads, p.n, p.batch, p.k_row_stride,
                             p.k_batch_stride, kBlockN) ||
      !EncodeRowTensorMap<T>(&maps.v, p.v, kD, p.kv_heads, p.n, p.batch, p.v_row_stride,
                             p.v_batch_stride, kBlockN) ||
      !EncodeDqTensorMap(&maps.dq, p.dq, kD, p.q_heads, p.m, p.batch, p.dq_row_stride,
                         p.dq_batch_stride)) {
    return cudaErrorNotSupported;
  }
  const int key_blocks = static_cast<int>((p.n + kBlockN - 1) / kBlockN);
  const int head_batches = p.kv_heads * p.batch;
  const int tiles = key_blocks * head_batches;
  const int cap = Sm90BwdPersistCtas() > 0 ? Sm90BwdPersistCtas() : Sm90SmCount();
  const int ctas = cap > 0 && cap < tiles ? cap : tiles;

  BwdPipeSched sched;
  const int forced_start = Sm90BwdStart();
  sched.start = forced_start >= 0 ? forced_start : (mode == 5 ? 0 : 1);
  sched.chunk = Sm90BwdPersistOrderChunk(p.causal);
  sched.epilogue = Sm90BwdEpilogue();

  static std::atomic<unsigned> next_slot{0};
  unsigned int* counters = nullptr;
  cudaError_t err =
      cudaGetSymbolAddress(reinterpret_cast<void**>(&counters), g_bwd_persist_counters);
  if (err != cudaSuccess) return err;
  unsigned int* counter = counters + next_slot.fetch_add(1) % kBwdPersistSlots;
  err = cudaMemsetAsync(counter, 0, sizeof(unsigned int), stream);
  if (err != cudaSuccess) return err;
  auto kernel = FlashBwdSm90PersistKernel<T, kD>;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  kernel<<<ctas, 384, Cfg::kSmemBytes, stream>>>(p, maps, sched, counter, key_blocks, head_batches);
  return cudaGetLastError();
}

}  // namespace dfa::cuda
