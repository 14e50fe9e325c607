// Hopper backward unit, warp-specialised with dQ writer warps ("pipe" kernel, sm_90a): the
// default backward on Hopper (kernel_dispatch.h). Same contract and math as flash_bwd_sm90.cuh
// (BwdParams; ComputeDelta has run; dq, dk, dv are fp32 and receive +=). Runs where TMA can
// describe q, k, v, dout and dq (fp32 dq rows: 16-byte aligned, strides multiples of 4
// elements); elsewhere the launcher answers cudaErrorNotSupported and the cp.async kernel runs.
//
// CTA = 3 warpgroups (384 threads) owning kBlockN = 128 key rows of one (batch, kv head):
// - warpgroup 0, the producer, gives its registers back (setmaxnreg.dec to 24). Its warp 0
//   loads K and V once (TMA, one "kv" mbarrier), then walks the items (every query head of the
//   GQA group x every visible 64-row query block) into a ring of kStages stages: lane 0 issues
//   the Q and dO tiles as TMA bulk tensor copies (128B swizzle = SW128), the 32 lanes write the
//   block's LSE * log2 e and Delta (rows past m / rows that see no key: LSE = +inf so P = 0) to
//   shared memory. A stage's "full" mbarrier expects 1 + 32 arrivals plus the TMA bytes; its
//   "empty" one 8 arrivals (lane 0 of every consumer warp, after its last wgmma read the stage).
//   Warps 1 and 2 are the dQ writers (below).
// - warpgroups 1 and 2, the consumers (setmaxnreg.inc to 240), own 64 key rows each. Per item:
//   S^T = K Q^T and dP^T = V dO^T (m64n64), P^T and dS^T in registers, dV += P^T dO and
//   dK += dS^T Q (A from registers), dS^T to shared memory, dQ = dS K. At head dim 64, K and V of
//   the warpgroup's 64 keys stay in registers (ldmatrix once) as the A operand of S^T / dP^T.
// - dQ: the columns are split between the two warpgroups over all 128 keys (head dim 64: 32
//   columns each, m64n32 wgmmas on K read MN-major from the middle of its 128-byte swizzle rows),
//   and each item's dQ is issued in the next item (after that item's dS^T), so a warpgroup never
//   waits for the other one's dS^T of the same item: dS^T triple buffered, mbarriers ds_full /
//   ds_empty per buffer (one arrival per consumer warp). The consumers never add dQ to global
//   memory: each writes its dQ tile times the scale to its own shared staging buffer (fp32,
//   64 rows x 32-column panels with 128-byte swizzle) and arrives on dq_full[wg]; producer warp
//   1 + wg adds the tile to dq with TMA tensor reduce-adds (cp.reduce.async.bulk.tensor, one per
//   panel; rows past m skipped by the copy engine) and releases the buffer (dq_empty[wg]) once
//   the engine has read it.
// - Warpgroup 1 starts once warpgroup 0 has computed its first P^T, so the softmax phases of the
//   two fall on each other's GEMMs.
// - Tile order (`tile_chunk`, causal only): the CTA of linear block id L runs the tile
//   (key block, kv head x batch) at position L of a longest-first list: the kv heads (x batch)
//   in chunks of `tile_chunk`, inside a chunk key block 0 of every head first, then key block 1,
//   ... (a causal CTA's work falls with its key block), so the last wave holds the short tiles;
//   the hardware dispatches CTAs in linear block order. 0 = grid order (key blocks fastest).
//   Chunks rather than one global list keep the Q / dO / dq rows of a few heads hot in L2. The
//   table (kernel_dispatch.h) picks the order per grid size.
// - Epilogue: head dim 128: dK, dV are staged in shared memory (over K, V and the Q / dO stages,
//   once both consumers are done with them) and added to global memory by TMA reduce-adds; head
//   dim 64: added from registers by float2 reductions (nothing waited for).
// - Per item the GEMMs are issued as S^T, dP^T | dV | dQ (previous item), dK: the consumer waits
//   for dQ while dK is still on the tensor cores and stages dQ under it (FlashAttention-3's
//   order).
// - kIntervals (template flag kIv, mask_tiles.cuh): the items cover only the query blocks that
//   see the CTA's keys (k_lo of its first key, k_hi of its last); the mask runs on the items
//   where some key does not see every row; grid order.
// Registers: producer 24, consumers 240 (128 x 24 + 256 x 240 = 384 x 168, the CTA's pool:
// setmaxnreg moves registers inside the CTA's own allocation, so the consumers' increase must be
// covered by what the producer gives back, else setmaxnreg.inc blocks forever).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda/bwd_tile_order.h"
#include "kernels/cuda/flash_bwd_sm90_epilogue.cuh"
#include "kernels/cuda/flash_params.h"
#include "kernels/cuda/kernel_dispatch.h"
#include "kernels/cuda/mask_tiles.cuh"
#include "kernels/cuda/sm90_common.cuh"
#include "kernels/cuda/sm90_tensor_maps.cuh"
#include "kernels/cuda/sm90_tma.cuh"

namespace dfa::cuda {

// The TMA descriptors of one pipe backward launch (kernel parameter, __grid_constant__).
struct BwdPipeMaps {
  CUtensorMap q, k, v, dout, dq, dk, dv;  // dq, dk, dv: fp32, 64-row x 32-column boxes
};

template <int kD>
struct BwdPipeTraits {
  static constexpr int kBlockN = kSm90PipeKeyBlock, kBlockM = 64, kStages = 2, kThreads = 384;
  static constexpr int kKVElems = kBlockN * kD;
  static constexpr int kQElems = kBlockM * kD;
  static constexpr int kDsElems = kBlockN * kBlockM;
  static constexpr int kDsBuffers = 3;
  // dQ staging per consumer warpgroup: kDqCols fp32 columns (this warpgroup's half) as panels of
  // 64 rows x 32 columns (128-byte rows, 16-byte chunk c of row r at c ^ (r % 8): the TMA box
  // with 128B swizzle). kDqN: the N of one dQ GEMM.
  static constexpr int kDqCols = kD / 2;
  static constexpr int kDqN = kD / 2;
  static constexpr int kDqPanels = kDqCols / 32;
  static constexpr int kDqWgFloats = kBlockM * kDqCols;
  // Layout (bytes from the 1024-aligned base): K, V, Q[kStages], dO[kStages], dS^T[kDsBuffers],
  // LSE[kStages][64], Delta[kStages][64] (1 KB), dQ staging [2], mbarriers (kv, full[kStages],
  // empty[kStages], dq_full[2], dq_empty[2], ds_full[3], ds_empty[3]).
  static constexpr int kStatOffset =
      (2 * kKVElems + 2 * kStages * kQElems + kDsBuffers * kDsElems) * 2;
  static constexpr int kDqOffset = kStatOffset + 2 * kStages * kBlockM * 4;
  static constexpr int kBarOffset = kDqOffset + 2 * kDqWgFloats * 4;
  static constexpr int kSmemBytes = kBarOffset + 8 * (5 + 2 * kStages + 6) + 1024;  // + alignment
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 384 * 168, "register pool");
  static_assert(kDqOffset % 1024 == 0, "swizzled staging panels need 1024-byte alignment");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
  static_assert(kD == 64 || kD == 128, "head dims 64 and 128");
};

// Named barriers of the pipe kernel: warpgroup 1's start (after warpgroup 0's first P^T); both
// consumers done with every shared operand (the dK/dV staging may overwrite them).
constexpr int kBwdPipeStartBarrier = 4;
constexpr int kBwdPipeDoneBarrier = 5;  // 5; then 6 + warpgroup: its staging written

// Whether dK / dV leave through shared memory and TMA reduce-adds (else float2 reductions).
__host__ __device__ constexpr bool kBwdPipeTmaDkDv(int head_dim) { return head_dim == 128; }

// Byte offset of fp32 element (row, col) in a staging buffer of 32-column swizzled panels.
__device__ inline int DqStageOffset(int row, int col) {
  return (col >> 5) * (64 * 128) + row * 128 + ((((col & 31) >> 2) ^ (row & 7)) << 4) +
         (col & 3) * 4;
}

// kIv: the kIntervals mask (mask_tiles.cuh): the query blocks come from the key tile's intervals
// (k_lo / k_hi), the mask runs on the partial ones only; false compiles the dense kernel.
template <typename T, int kD, bool kIv>
__global__ void __launch_bounds__(384, 1)
    FlashBwdSm90PipeKernel(const __grid_constant__ BwdParams p,
                           const __grid_constant__ BwdPipeMaps maps, int tile_chunk) {
#ifdef DFA_WGMMA
  using Tr = ElemTraits<T>;
  using Cfg = BwdPipeTraits<kD>;
  // Head dim 64: K and V of this warpgroup's keys held in registers as the A operand of S^T /
  // dP^T (RS wgmmas: half their shared-memory operand reads; 32 registers).
  constexpr bool kRegKV = kD == 64;
  constexpr int kBlockN = Cfg::kBlockN, kBlockM = Cfg::kBlockM, kStages = Cfg::kStages;
  constexpr int kPanels = kD / 64;
  constexpr int kNS = kBlockM / 2;  // S^T / dP^T accumulator floats per thread (m64 n64)
  constexpr int kNA = kD / 2;       // dK / dV accumulator floats per thread (m64 n kD)
  extern __shared__ __align__(1024) char smem_bwp[];
  char* base = smem_bwp + ((1024 - (SmemAddr(smem_bwp) & 1023)) & 1023);
  T* s_k = reinterpret_cast<T*>(base);
  T* s_v = s_k + Cfg::kKVElems;
  T* s_q_base = s_v + Cfg::kKVElems;                                 // kStages stages
  T* s_do_base = s_q_base + kStages * Cfg::kQElems;                  // kStages stages
  T* s_ds_base = s_do_base + kStages * Cfg::kQElems;                 // kDsBuffers buffers
  float* s_lse = reinterpret_cast<float*>(base + Cfg::kStatOffset);  // [kStages][kBlockM]
  float* s_delta = s_lse + kStages * kBlockM;
  char* s_dq = base + Cfg::kDqOffset;  // [2][kDqPanels][64 rows][128 B]
  uint64_t* kv_full = reinterpret_cast<uint64_t*>(base + Cfg::kBarOffset);
  uint64_t* full = kv_full + 1;
  uint64_t* empty = full + kStages;
  uint64_t* dq_full = empty + kStages;  // [2]
  uint64_t* dq_empty = dq_full + 2;     // [2]
  uint64_t* ds_full = dq_empty + 2;     // [3]: both warpgroups' dS^T of an item written
  uint64_t* ds_empty = ds_full + 3;     // [3]: both warpgroups' dQ of an item read it

  int nb = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  if (p.causal && tile_chunk > 0) {  // longest-first order (file comment, bwd_tile_order.h)
    const BwdTile tile =
        LongestFirstTile(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z), gridDim.x,
                         gridDim.y * gridDim.z, tile_chunk);
    nb = tile.key_block;
    hk = tile.head_batch % gridDim.y;
    b = tile.head_batch / gridDim.y;
  }
  const int group = p.q_heads / p.kv_heads;
  const int tid = threadIdx.x;
  const int wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int64_t n_begin = int64_t{nb} * kBlockN;
  const int n_valid = static_cast<int>(Min64(kBlockN, p.n - n_begin));

  const int m_blocks = static_cast<int>((p.m + kBlockM - 1) / kBlockM);
  int m_block_min = 0;
  if (p.causal) {
    const int64_t first = p.kv_row0 + n_begin - p.q_row0;  // first query row that sees a key
    if (first > 0) m_block_min = static_cast<int>(Min64(first / kBlockM, m_blocks));
  }
  int m_block_end = m_blocks;
  IvQueryRange iv_range;
  if constexpr (kIv) {
    iv_range = IvQueryBlocks(p.iv, b, p.kv_row0 + n_begin, p.kv_row0 + n_begin + n_valid - 1,
                             p.q_row0, p.m, kBlockM);
    m_block_min = iv_range.first;
    m_block_end = iv_range.end;
  }
  if (m_block_min >= m_block_end) return;  // nothing visible: dK, dV unchanged (whole CTA)
  const int per_head = m_block_end - m_block_min;
  const int items = group * per_head;
  // First query row of item `it` (items: query heads of the group, then query blocks).
  auto item_m_begin = [&](int it) { return int64_t{m_block_min + it % per_head} * kBlockM; };

  if (tid == 0) {
    MbarInit(kv_full, 1);
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      MbarInit(full + s, 1 + 32);
      MbarInit(empty + s, 8);
    }
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      MbarInit(dq_full + w, 128);
      MbarInit(dq_empty + w, 1);
    }
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      MbarInit(ds_full + i, 8);  // one arrival per consumer warp (lane 0, after __syncwarp)
      MbarInit(ds_empty + i, 8);
    }
    FenceMbarInit();
  }
  __syncthreads();

  if (wg == 0) {  // producer
    SetMaxNRegDec<Cfg::kProducerRegs>();
    if (warp == 0) {
      if (lane == 0) {
        MbarArriveExpectTx(kv_full, 2 * Cfg::kKVElems * 2);
#pragma unroll
        for (int pn = 0; pn < kPanels; ++pn) {
          TmaLoad4d(s_k + pn * kBlockN * 64, &maps.k, kv_full, pn * 64, hk,
                    static_cast<int>(n_begin), b);
          TmaLoad4d(s_v + pn * kBlockN * 64, &maps.v, kv_full, pn * 64, hk,
                    static_cast<int>(n_begin), b);
        }
      }
      for (int it = 0; it < items; ++it) {
        const int s = it % kStages;
        MbarWait(empty + s, ((it / kStages) & 1) ^ 1);
        const int h = hk * group + it / per_head;
        const int64_t m_begin = item_m_begin(it);
        if (lane == 0) {
          MbarArriveExpectTx(full + s, 2 * Cfg::kQElems * 2);
#pragma unroll
          for (int pn = 0; pn < kPanels; ++pn) {
            TmaLoad4d(s_q_base + s * Cfg::kQElems + pn * kBlockM * 64, &maps.q, full + s, pn * 64,
                      h, static_cast<int>(m_begin), b);
            TmaLoad4d(s_do_base + s * Cfg::kQElems + pn * kBlockM * 64, &maps.dout, full + s,
                      pn * 64, h, static_cast<int>(m_begin), b);
          }
        }
        const float* lse_g = p.lse + b * p.lse_batch_stride + h * p.lse_head_stride + m_begin;
        const float* delta_g =
            p.delta + b * p.delta_batch_stride + h * p.delta_head_stride + m_begin;
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
        MbarArrive(full + s);  // release: this lane's LSE / Delta stores
      }
    } else if (warp <= 2) {  // dQ writer of consumer warpgroup w: staged tile -> dq (TMA add)
      const int w = warp - 1;
      const char* src = s_dq + w * Cfg::kDqWgFloats * 4;
      const int col0 = w * Cfg::kDqCols;
      for (int it = 0; it < items; ++it) {
        MbarWait(dq_full + w, it & 1);
        if (lane == 0) {
          const int h = hk * group + it / per_head;
          const int m_row = static_cast<int>(item_m_begin(it));
#pragma unroll
          for (int pn = 0; pn < Cfg::kDqPanels; ++pn)
            TmaReduceAdd4d(&maps.dq, src + pn * 64 * 128, col0 + pn * 32, h, m_row, b);
          BulkCommit();
          BulkWaitRead();
        }
        __syncwarp();
        if (lane == 0) MbarArrive(dq_empty + w);
      }
      if (lane == 0) BulkWait();
    }
    return;
  }

  // Consumers.
  SetMaxNRegInc<Cfg::kConsumerRegs>();
  const int cw = wg - 1;  // consumer 0 / 1
  const int g = lane >> 2, t = lane & 3;
  const int key_base = cw * 64 + warp * 16 + g;  // this thread's key rows: key_base, key_base + 8
  const int qrow_base = warp * 16 + g;           // this thread's query rows in the dQ phase
  const float scale_log2 = p.scale * kLog2e;
  char* s_dq_wg = s_dq + cw * Cfg::kDqWgFloats * 4;

  // dQ accumulator (64 rows x kDqN columns) times the scale into this warpgroup's staging buffer.
  // Threads of odd g store column group j ^ 2 where the others store j: with the panels' 128-byte
  // swizzle, rows g and g ^ 1 would otherwise hit the same 8 banks in each half-warp (2-way
  // conflict on every STS.64; measured with ncu, 2x the ideal wavefronts).
  // The byte offsets of this thread's four column groups (row qrow_base, panel 0) are computed
  // once: rows + 8 and the next panel only add constants (the swizzle depends on row % 8 and on
  // the column inside the panel), so per item the stores need no address arithmetic.
  // One register holds all of them: group j's offset is stage_base ^ (j << 5) (the swizzle XOR
  // only touches bits 4-6, the row sits above them), and bit 7 is g's parity (row = 16 warp + g).
  const int stage_base = DqStageOffset(qrow_base, ((g & 1) ? 2 : 0) * 8 + 2 * t);
  auto stage_dq = [&](const float* acc_dq) {
    const bool odd_g = (stage_base & 128) != 0;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
#pragma unroll
      for (int j = 0; j < Cfg::kDqN / 8; ++j) {
        const float v0 = odd_g ? acc_dq[4 * (j ^ 2) + 2 * hf] : acc_dq[4 * j + 2 * hf];
        const float v1 = odd_g ? acc_dq[4 * (j ^ 2) + 2 * hf + 1] : acc_dq[4 * j + 2 * hf + 1];
        *reinterpret_cast<float2*>(s_dq_wg + (stage_base ^ ((j & 3) << 5)) +
                                   (j >> 2) * 64 * 128 + hf * 8 * 128) =
            make_float2(v0 * p.scale, v1 * p.scale);
      }
    }
  };
  // dS^T rows by stmatrix: lane l gives row l % 8 of matrix l / 8 (matrix m: key rows + 8 (m & 1),
  // query columns + 8 (m >> 1)); for k-step kk the byte offset is ds_lane ^ (kk << 5).
  const int ds_lane = (cw * 64 + warp * 16 + 8 * ((lane >> 3) & 1) + (lane & 7)) * 128 +
                      ((((lane >> 4) & 1) ^ (lane & 7)) << 4);

  float acc_dk[kNA], acc_dv[kNA];
#pragma unroll
  for (int i = 0; i < kNA; ++i) acc_dk[i] = acc_dv[i] = 0.f;
  IvRow iv_key[2];  // kIv: this thread's two key rows' visible queries (unit-local)
  if constexpr (kIv) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int nl = key_base + hf * 8;
      iv_key[hf] = IvKeyRow(p.iv, b, p.kv_row0 + n_begin + nl, p.q_row0, p.m, nl < n_valid);
    }
  }

  // wgmma descriptors: a base per operand tile, k-steps added with DescPlus (one add per wgmma
  // instead of MakeSmemDesc's masks and shifts, ~11 instructions per wgmma).
  const uint64_t desc_k = MakeSmemDesc(s_k + cw * 64 * 64, 16, 1024);  // K-major, own 64 keys
  const uint64_t desc_v = MakeSmemDesc(s_v + cw * 64 * 64, 16, 1024);
  const uint64_t desc_k_mn = MakeSmemDesc(s_k, kBlockN * 64 * 2, 1024);  // MN-major (dQ's B)
  // Element offset of K's column `col` in desc_k_mn (64-column panels of kBlockN rows; head dim
  // 64's second 32-column half starts 64 bytes into the swizzled rows).
  auto k_col_off = [](int col) { return (col >> 6) * kBlockN * 64 + (col & 63); };

  if (cw == 1) NamedBarrierSync(kBwdPipeStartBarrier, 256);
  MbarWait(kv_full, 0);
  // kRegKV: A fragments of K and V (this warp's 16 keys, k-step kk) by ldmatrix; the ldmatrix
  // lane layout is stmatrix's (ds_lane above), in K's / V's own 128-byte swizzled rows.
  uint32_t a_k[kRegKV ? kD / 16 : 1][4], a_v[kRegKV ? kD / 16 : 1][4];
  if constexpr (kRegKV) {
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      LdMatrixX4(a_k[kk], reinterpret_cast<const char*>(s_k) + (ds_lane ^ (kk << 5)));
      LdMatrixX4(a_v[kk], reinterpret_cast<const char*>(s_v) + (ds_lane ^ (kk << 5)));
    }
  }
  int dq_pending = 0;  // 1: this warpgroup's staged dQ not yet handed to its writer
  int qb = 0;  // query block of `item` inside its head (item % per_head, without a division)
  for (int item = 0; item < items; ++item, qb = qb + 1 == per_head ? 0 : qb + 1) {
    const int s = item % kStages;
    const int64_t m_begin = int64_t{m_block_min + qb} * kBlockM;
    const T* s_q = s_q_base + s * Cfg::kQElems;
    const T* s_do = s_do_base + s * Cfg::kQElems;
    T* s_ds = s_ds_base + (item % 3) * Cfg::kDsElems;
    const float* s_lse_cur = s_lse + s * kBlockM;
    const float* s_delta_cur = s_delta + s * kBlockM;
    const uint64_t desc_q = MakeSmemDesc(s_q, 16, 1024);
    const uint64_t desc_do = MakeSmemDesc(s_do, 16, 1024);
    const uint64_t desc_q_mn = MakeSmemDesc(s_q, kBlockM * 64 * 2, 1024);
    const uint64_t desc_do_mn = MakeSmemDesc(s_do, kBlockM * 64 * 2, 1024);
    MbarWait(full + s, (item / kStages) & 1);
    // This thread's LSE rows (query columns (i >> 2) * 8 + 2t + (i & 1)) into registers before
    // the GEMMs are issued: loaded after the S^T wait, their latency sat on the softmax's
    // critical path (ncu), and the compiler does not move loads across the wgmma asm.
    float2 lse_r[kNS / 4];
#pragma unroll
    for (int j = 0; j < kNS / 4; ++j)
      lse_r[j] = *reinterpret_cast<const float2*>(s_lse_cur + j * 8 + 2 * t);
    // S^T = K Q^T and dP^T = V dO^T for this warpgroup's 64 keys, as two commit groups: acc =
    // A B^T with A = this warpgroup's K (V) rows, from registers (a_reg) or shared memory (desc_a),
    // B = the item's Q (dO) rows.
    float st[kNS], dpt[kNS];
    auto issue_sdp = [&](float* acc, const uint32_t (*a_reg)[4], uint64_t desc_a, uint64_t desc_b) {
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        const int off = (kk & 3) * 16;
        const uint64_t db = DescPlus(desc_b, (kk >> 2) * kBlockM * 64 + off);
        if constexpr (kRegKV) {
          WgmmaRS<T, kBlockM, 0>::Run(acc, a_reg[kk], db, kk > 0 ? 1 : 0);
        } else {
          const uint64_t da = DescPlus(desc_a, (kk >> 2) * kBlockN * 64 + off);
          WgmmaSS<T, kBlockM, 0, 0>::Run(acc, da, db, kk > 0 ? 1 : 0);
        }
      }
      WgmmaCommit();
    };
    WgmmaFence();
    issue_sdp(st, a_k, desc_k, desc_q);
    issue_sdp(dpt, a_v, desc_v, desc_do);
    // The previous item's dQ staging (stage_dq below) is handed to the writer here rather than
    // right after its stores: the proxy fence then finds them drained instead of waiting for them
    // (ncu: ~3% of the consumers' time in that fence and arrive).
    FenceProxyAsync();
    MbarArriveIf(dq_full + cw, dq_pending);
    dq_pending = 0;
    WgmmaWait<1>();
    FenceRegs<kNS>(st);

    // P^T (masked entries: 0). Accumulator i: key row key_base + 8 * ((i >> 1) & 1),
    // query column (i >> 2) * 8 + 2t + (i & 1).
#pragma unroll
    for (int i = 0; i < kNS; ++i)
      st[i] = FastExp2(st[i] * scale_log2 - ((i & 1) ? lse_r[i >> 2].y : lse_r[i >> 2].x));
    // The mask in one uniform branch per item (items off the diagonal skip it): a test per
    // element made ptxas emit 32 branches per item, ~12% of the consumers' time (ncu).
    const bool need_mask =
        kIv ? n_valid < kBlockN || !IvQueryBlockFull(iv_range, m_begin, kBlockM, p.m)
            : n_valid < kBlockN ||
                  (p.causal && p.kv_row0 + n_begin + kBlockN - 1 > p.q_row0 + m_begin);
    if (kIv && need_mask) {  // each key row's visible queries [lo, hi)
      int lo[2], hi[2];
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        lo[hf] = iv_key[hf].lo - static_cast<int>(m_begin) - 2 * t;
        hi[hf] = iv_key[hf].hi - static_cast<int>(m_begin) - 2 * t;
      }
#pragma unroll
      for (int i = 0; i < kNS; ++i) {
        const int c = (i >> 2) * 8 + (i & 1);
        st[i] = (c >= lo[(i >> 1) & 1]) & (c < hi[(i >> 1) & 1]) ? st[i] : 0.f;
      }
    } else if (need_mask) {
#pragma unroll
      for (int i = 0; i < kNS; ++i) {
        const int ml = (i >> 2) * 8 + 2 * t + (i & 1);
        const int nl = key_base + ((i >> 1) & 1) * 8;
        // Non-short-circuit: selects, not a branch per element.
        st[i] = (nl >= n_valid) | (p.causal & (p.kv_row0 + n_begin + nl > p.q_row0 + m_begin + ml))
                    ? 0.f
                    : st[i];
      }
    }
    uint32_t ap[kBlockM / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      ap[kk][0] = Tr::Pack(st[8 * kk + 0], st[8 * kk + 1]);
      ap[kk][1] = Tr::Pack(st[8 * kk + 2], st[8 * kk + 3]);
      ap[kk][2] = Tr::Pack(st[8 * kk + 4], st[8 * kk + 5]);
      ap[kk][3] = Tr::Pack(st[8 * kk + 6], st[8 * kk + 7]);
    }
    // Warpgroup 1 may start (predicated: no branch between wgmmas).
    NamedBarrierArriveIf(kBwdPipeStartBarrier, 256, cw == 0 && item == 0);
    float2 delta_r[kNS / 4];  // Delta rows, as lse_r (before the dV wgmma asm, as there)
#pragma unroll
    for (int j = 0; j < kNS / 4; ++j)
      delta_r[j] = *reinterpret_cast<const float2*>(s_delta_cur + j * 8 + 2 * t);
    // dV += P^T dO (dO read MN-major), on the tensor cores while dS^T is computed.
    FenceRegs<kNA>(acc_dv);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      const uint64_t db = DescPlus(desc_do_mn, kk * 16 * 64);
      WgmmaRS<T, kD, 1>::Run(acc_dv, ap[kk], db, 1);
    }
    WgmmaCommit();
    WgmmaWait<1>();  // dP^T done (the dV group may still run)
    FenceRegs<kNS>(dpt);

    uint32_t ads[kBlockM / 16][4];
    // This buffer was last read by both warpgroups' dQ of item - 3.
    if (item >= 3) MbarWait(ds_empty + item % 3, ((item - 3) / 3) & 1);
#pragma unroll
    for (int i = 0; i < kNS; ++i)
      dpt[i] = st[i] * (dpt[i] - ((i & 1) ? delta_r[i >> 2].y : delta_r[i >> 2].x));
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      ads[kk][0] = Tr::Pack(dpt[8 * kk + 0], dpt[8 * kk + 1]);
      ads[kk][1] = Tr::Pack(dpt[8 * kk + 2], dpt[8 * kk + 3]);
      ads[kk][2] = Tr::Pack(dpt[8 * kk + 4], dpt[8 * kk + 5]);
      ads[kk][3] = Tr::Pack(dpt[8 * kk + 6], dpt[8 * kk + 7]);
      // dS^T to shared memory (rows = keys, columns = queries; Sw128 layout) for the dQ phase.
      StMatrixX4(SmemAddr(s_ds) + (ds_lane ^ (kk << 5)), ads[kk][0], ads[kk][1], ads[kk][2],
                 ads[kk][3]);
    }
    // This item's dS^T rows are fenced and released (ds_full) after this item's dQ / dK wgmmas
    // are issued (below): nothing reads them before the next item, and the fence then finds the
    // stores drained (ncu: ~3% of the consumers' time waiting in it here).

    // dQ = dS K (A = dS^T read MN-major, B = K read MN-major; all keys, this warpgroup's kD / 2
    // columns), then dK += dS^T Q (Q read MN-major; the scale is applied at the end), as two
    // commit groups.
    float acc_dq[Cfg::kDqN / 2];
    auto issue_dq = [&](int col, const T* ds) {  // dQ columns [col, col + kDqN)
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        const uint64_t da = DescPlus(MakeSmemDesc(ds, kBlockN * 64 * 2, 1024), kk * 16 * 64);
        const uint64_t db = DescPlus(desc_k_mn, k_col_off(col) + kk * 16 * 64);
        WgmmaSS<T, Cfg::kDqN, 1, 1>::Run(acc_dq, da, db, kk > 0 ? 1 : 0);
      }
      WgmmaCommit();
    };
    // The dQ of the previous item (at the first item a dummy one on the unused buffer 2, never
    // staged), once both warpgroups' dS^T of that item are in shared memory.
    const int dq_item = item - 1;
    if (item > 0) MbarWait(ds_full + dq_item % 3, (dq_item / 3) & 1);
    WgmmaFence();
    issue_dq(cw * Cfg::kDqN, s_ds_base + ((item + 2) % 3) * Cfg::kDsElems);
    FenceRegs<kNA>(acc_dk);
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      const uint64_t db = DescPlus(desc_q_mn, kk * 16 * 64);
      WgmmaRS<T, kD, 1>::Run(acc_dk, ads[kk], db, 1);
    }
    WgmmaCommit();
    // One arrival per warp: __syncwarp orders the lanes' stores (and proxy fences) before lane
    // 0's release; predicated, not a branch (wgmmas are in flight).
    FenceProxyAsync();
    __syncwarp();
    MbarArriveIf(ds_full + item % 3, ElectOne());
    WgmmaWait<1>();  // dV and dQ done; dK may still run
    FenceRegs<Cfg::kDqN / 2>(acc_dq);
    FenceRegs<kNA>(acc_dv);
    FenceRegs<kBlockM / 4>(&ap[0][0]);  // P^T stays untouched until the dV wgmmas finished
    // dS^T of dq_item read by this warp's dQ wgmmas (one arrival per warp).
    __syncwarp();
    MbarArriveIf(ds_empty + (item + 2) % 3, item > 0 && ElectOne());

    // Stage dQ * scale once the writer has read this warpgroup's previous tile.
    if (dq_item >= 0) {
      MbarWait(dq_empty + cw, (dq_item & 1) ^ 1);
      stage_dq(acc_dq);
      dq_pending = 1;  // fenced and handed over after the next item's GEMMs are issued
    }

    WgmmaWait<0>();
    FenceRegs<kNA>(acc_dk);
    FenceRegs<kBlockM / 4>(&ads[0][0]);
    __syncwarp();
    if (ElectOne()) MbarArrive(empty + s);  // every read of this stage (Q, dO, LSE, Delta) done
  }
  FenceProxyAsync();  // the TMA reduce reads the staging through the async proxy
  MbarArriveIf(dq_full + cw, dq_pending);
  {  // the last item's dQ
    const int dq_item = items - 1;
    MbarWait(ds_full + dq_item % 3, (dq_item / 3) & 1);
    float acc_dq[Cfg::kDqN / 2];
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      const uint64_t da = MakeSmemDesc(s_ds_base + (dq_item % 3) * Cfg::kDsElems + kk * 16 * 64,
                                       kBlockN * 64 * 2, 1024);
      const uint64_t db = DescPlus(desc_k_mn, k_col_off(cw * Cfg::kDqN) + kk * 16 * 64);
      WgmmaSS<T, Cfg::kDqN, 1, 1>::Run(acc_dq, da, db, kk > 0 ? 1 : 0);
    }
    WgmmaCommit();
    WgmmaWait<0>();
    FenceRegs<Cfg::kDqN / 2>(acc_dq);
    MbarWait(dq_empty + cw, (dq_item & 1) ^ 1);
    stage_dq(acc_dq);
    FenceProxyAsync();
    MbarArrive(dq_full + cw);
  }

  // dK, dV += (this CTA owns these rows exclusively). Head dim 128: by TMA reduce-adds from
  // shared memory: once both consumers' last wgmmas have read K, V and the Q / dO stages, each
  // warpgroup stages its 64 rows of dK (times the scale) over K and V and of dV over the Q / dO
  // stages, fp32 in the dQ staging's swizzled 32-column panels (64 x kD x 4 bytes each: exactly
  // those regions), and one thread adds them with one copy per panel; rows past n are skipped by
  // the copy engine. Head dim 64 (measured 0.5-1% slower that way at 16K): float2 reductions.
  static_assert(2 * Cfg::kKVElems * 2 == 2 * 64 * kD * 4 &&
                    2 * kStages * Cfg::kQElems * 2 == 2 * 64 * kD * 4,
                "dK / dV staging fits K + V and the Q / dO stages");
  if constexpr (kBwdPipeTmaDkDv(kD)) {
    NamedBarrierSync(kBwdPipeDoneBarrier, 256);
    char* st_k = reinterpret_cast<char*>(s_k) + cw * 64 * kD * 4;
    char* st_v = reinterpret_cast<char*>(s_q_base) + cw * 64 * kD * 4;
    const int r0 = warp * 16 + g;  // this thread's rows in the warpgroup's 64: r0, r0 + 8
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt) {
        const int off = DqStageOffset(r0 + hf * 8, dt * 8 + 2 * t);
        *reinterpret_cast<float2*>(st_k + off) =
            make_float2(acc_dk[4 * dt + 2 * hf] * p.scale, acc_dk[4 * dt + 2 * hf + 1] * p.scale);
        *reinterpret_cast<float2*>(st_v + off) =
            make_float2(acc_dv[4 * dt + 2 * hf], acc_dv[4 * dt + 2 * hf + 1]);
      }
    }
    FenceProxyAsync();  // the copy engine reads the staging through the async proxy
    NamedBarrierSync(kBwdPipeDoneBarrier + 1 + cw, 128);
    if (warp == 0 && lane == 0) {
      const int row = static_cast<int>(n_begin) + cw * 64;
#pragma unroll
      for (int pn = 0; pn < kD / 32; ++pn) {
        TmaReduceAdd4d(&maps.dk, st_k + pn * 64 * 128, pn * 32, hk, row, b);
        TmaReduceAdd4d(&maps.dv, st_v + pn * 64 * 128, pn * 32, hk, row, b);
      }
      BulkCommit();
      BulkWaitRead();  // the staging must outlive the copies' reads of it
    }
  } else {
    AddDkDvRows<kD, BwdEpilogue::kReduce>(p, acc_dk, acc_dv, hk, b, n_begin, n_valid, key_base,
                                          t);
  }
#else
  __trap();  // only the sm_90a build carries this kernel; the launcher never picks it elsewhere
#endif
}

// Queues the pipe backward with the causal tile order `tile_chunk` (0 grid order, N > 0 longest
// first in chunks of N kv heads). Returns cudaErrorNotSupported, with nothing queued, when TMA
// cannot describe the tensors (the caller then runs the cp.async kernel).
template <typename T, int kD, bool kIv = false>
cudaError_t LaunchBwdSm90Pipe(const BwdParams& p, int tile_chunk, cudaStream_t stream) {
  using Cfg = BwdPipeTraits<kD>;
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN;
  BwdPipeMaps maps{};
  if (p.m <= 0 || p.n <= 0 || p.kv_heads <= 0 || p.q_heads % p.kv_heads != 0 || p.m > INT32_MAX ||
      p.n > INT32_MAX || p.q_heads > INT32_MAX / kD ||
      !EncodeRowTensorMap<T>(&maps.q, p.q, kD, p.q_heads, p.m, p.batch, p.q_row_stride,
                             p.q_batch_stride, kBlockM) ||
      !EncodeRowTensorMap<T>(&maps.dout, p.dout, kD, p.q_heads, p.m, p.batch, p.do_row_stride,
                             p.do_batch_stride, kBlockM) ||
      !EncodeRowTensorMap<T>(&maps.k, p.k, kD, p.kv_heads, p.n, p.batch, p.k_row_stride,
                             p.k_batch_stride, kBlockN) ||
      !EncodeRowTensorMap<T>(&maps.v, p.v, kD, p.kv_heads, p.n, p.batch, p.v_row_stride,
                             p.v_batch_stride, kBlockN) ||
      (kBwdPipeTmaDkDv(kD) &&
       (!EncodeDqTensorMap(&maps.dk, p.dk, kD, p.kv_heads, p.n, p.batch, p.dk_row_stride,
                           p.dk_batch_stride) ||
        !EncodeDqTensorMap(&maps.dv, p.dv, kD, p.kv_heads, p.n, p.batch, p.dv_row_stride,
                           p.dv_batch_stride))) ||
      !EncodeDqTensorMap(&maps.dq, p.dq, kD, p.q_heads, p.m, p.batch, p.dq_row_stride,
                         p.dq_batch_stride)) {
    return cudaErrorNotSupported;
  }
  auto kernel = FlashBwdSm90PipeKernel<T, kD, kIv>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>((p.n + kBlockN - 1) / kBlockN), p.kv_heads, p.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p, maps, tile_chunk);
  return cudaGetLastError();
}

}  // namespace dfa::cuda
