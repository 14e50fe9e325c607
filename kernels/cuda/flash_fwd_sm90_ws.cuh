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
// tile's visible range, and the mask runs on the partial blocks at both of its ends.
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
  CUtensorMap o;       // out in q's dtype, 64-row boxes: read only when o_tma
  bool o_tma = false;  // O leaves through shared memory and TMA stores (out in q's dtype, no
                       // accumulate, and the driver took the map)
};

template <int kD, int kBlockN, int kStages, int kConsumers>
struct FwdWsTraits {
  static_assert(kConsumers == 2 || kConsumers == 3, "2 or 3 consumer warpgroups");
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kQElems = kBlockM * kD;
  static constexpr int kKVElems = kBlockN * kD;
  static constexpr int kBarOffset = (kQElems + 2 * kStages * kKVElems) * 2;     // bytes
  static constexpr int kSmemBytes = kBarOffset + 8 * (1 + 4 * kStages) + 1024;  // + alignment
  // 24 x 128 + kConsumerRegs x 128 x kConsumers <= 64K registers of the SM.
  static constexpr int kProducerRegs = 24, kConsumerRegs = kConsumers == 2 ? 240 : 160;
};

// Named barriers: 0 is __syncthreads; 1 + c the GEMM turn of consumer c; 4 + c pins the
// softmax of consumer c before its P V wait (see flash_fwd_sm90.cuh).
constexpr int kTurnBarrier = 1;
constexpr int kPinBarrier = 4;
constexpr int kOStagedBarrier = 7;  // 7 + c: consumer c's O tile is in shared memory

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

// kIv: the kIntervals mask (mask_tiles.cuh): the key blocks come from the tile's intervals and
// the mask runs on the partial blocks at both ends of the walk; false compiles the dense kernel.
template <typename T, int kD, int kBlockN, int kStages, int kConsumers, bool kIv>
__global__ void __launch_bounds__(128 * (kConsumers + 1), 1)
    FlashFwdSm90WsKernel(const __grid_constant__ FwdParams p,
                         const __grid_constant__ FwdTmaMaps maps) {
#ifdef DFA_WGMMA
  using Tr = ElemTraits<T>;
  using Cfg = FwdWsTraits<kD, kBlockN, kStages, kConsumers>;
  constexpr int kBlockM = Cfg::kBlockM;
  constexpr int kNS = kBlockN / 2;  // S accumulator floats per thread
  constexpr int kNO = kD / 2;       // O accumulator floats per thread
  constexpr int kPanels = kD / 64;
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

  const int tid = threadIdx.x;
  const int wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int mb = p.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;  // long rows first
  const int h = blockIdx.y, b = blockIdx.z;
  const int hk = h / (p.q_heads / p.kv_heads);
  const int64_t m_begin = int64_t{mb} * kBlockM;
  const int m_valid = static_cast<int>(Min64(kBlockM, p.m - m_begin));
  int n_blocks;
  int n_first = 0;  // kIv: first key block of the walk (the dense walk ends at block 0)
  IvBlockRange iv_range;
  if constexpr (kIv) {
    iv_range = IvKeyBlocks(p.iv, b, p.q_row0 + m_begin, p.q_row0 + m_begin + m_valid - 1,
                           p.kv_row0, p.n, kBlockN);
    n_first = iv_range.first;
    n_blocks = iv_range.count;
  } else {
    int64_t n_end = p.n;
    if (p.causal) n_end = Min64(n_end, p.q_row0 + m_begin + m_valid - 1 - p.kv_row0 + 1);
    n_blocks = n_end > 0 ? static_cast<int>((n_end + kBlockN - 1) / kBlockN) : 0;
  }

  if (tid == 0) {
    MbarInit(q_full, 1);
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      MbarInit(k_full + s, 1);
      MbarInit(v_full + s, 1);
      MbarInit(k_empty + s, 4 * kConsumers);
      MbarInit(v_empty + s, 4 * kConsumers);
    }
    FenceMbarInit();
  }
  __syncthreads();

  if (wg == 0) {  // producer
    SetMaxNRegDec<Cfg::kProducerRegs>();
    if (warp == 0 && lane == 0 && n_blocks > 0) {
      constexpr uint32_t kQBytes = Cfg::kQElems * 2, kKVBytes = Cfg::kKVElems * 2;
      MbarArriveExpectTx(q_full, kQBytes);
#pragma unroll
      for (int pn = 0; pn < kPanels; ++pn)
        TmaLoad4d(s_q + pn * kBlockM * 64, &maps.q, q_full, pn * 64, h, static_cast<int>(m_begin),
                  b);
      // Walk position `it` = key block n_blocks - 1 - it, in stage it % kStages.
      auto load = [&](int it, T* s_tiles, uint64_t* full, uint64_t* empty, const CUtensorMap* m) {
        const int s = it % kStages;
        MbarWait(empty + s, ((it / kStages) & 1) ^ 1);
        MbarArriveExpectTx(full + s, kKVBytes);
        const int n0 = (n_first + n_blocks - 1 - it) * kBlockN;
#pragma unroll
        for (int pn = 0; pn < kPanels; ++pn)
          TmaLoad4d(s_tiles + s * Cfg::kKVElems + pn * kBlockN * 64, m, full + s, pn * 64, hk, n0,
                    b);
      };
      load(0, s_k, k_full, k_empty, &maps.k);
      for (int it = 0; it < n_blocks; ++it) {
        if (it + 1 < n_blocks) load(it + 1, s_k, k_full, k_empty, &maps.k);
        load(it, s_v, v_full, v_empty, &maps.v);
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

  float acc_o[kNO];
#pragma unroll
  for (int i = 0; i < kNO; ++i) acc_o[i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};

  // Consumer 0 takes the first GEMM turn: consumer 1 hands it over before its own first wait.
  if (cw == kConsumers - 1) NamedBarrierArrive(kTurnBarrier + 0, 256);

  if (n_blocks > 0) {
    // Iterations 0 .. n_masked - 1 (the last key blocks) need the mask; computed once in 64 bits
    // so that the loop compares 32-bit counters only.
    // kIv: iterations [0, n_masked) and [n_unmasked_end, n_blocks) need the mask, and each
    // thread's two rows keep their visible key columns [lo, hi) (unit-local) in registers.
    const int n_masked =
        kIv ? iv_range.top
            : FwdWsMaskedBlocks(p.n, p.causal, p.q_row0 + m_begin - p.kv_row0, kBlockN, n_blocks);
    const int n_unmasked_end = kIv ? n_blocks - iv_range.bottom : n_blocks;
    IvRow iv_row[2];
    if constexpr (kIv) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = row_base + hf * 8;
        iv_row[hf] = IvQueryRow(p.iv, b, p.q_row0 + m_begin + r, p.kv_row0, p.n, r < m_valid);
      }
    }
    auto mask_at = [&](int it) { return it < n_masked || (kIv && it >= n_unmasked_end); };
    float s[kNS], pr[kNS];  // scores, probabilities
    uint32_t a[kBlockN / 16][4];
    float corr[2] = {1.f, 1.f};
    auto release = [&](uint64_t* bar) {
      if (lane == 0) MbarArrive(bar);
    };
    // Low words of the matrix descriptors at k-step 0 of stage 0 (the high word is the same
    // constant for all three); a k-step or a stage adds a compile-time / uniform offset.
    const uint32_t q_lo = FwdWsDescLo(s_q + cw * 64 * 64, 16);
    const uint32_t k_lo = FwdWsDescLo(s_k, 16);
    const uint32_t v_lo = FwdWsDescLo(s_v, kBlockN * 64 * 2);
    constexpr uint32_t kStageLo = Cfg::kKVElems * 2 / 16;
    auto issue_s = [&](uint32_t stage) {  // S = Q K^T for this warpgroup's 64 query rows
      const uint32_t ks_lo = k_lo + stage * kStageLo;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        const uint64_t dq = FwdWsDesc(q_lo + ((kk >> 2) * kBlockM * 64 + (kk & 3) * 16) * 2 / 16);
        const uint64_t dk = FwdWsDesc(ks_lo + ((kk >> 2) * kBlockN * 64 + (kk & 3) * 16) * 2 / 16);
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
#pragma unroll
        for (int i = 0; i < kNS; ++i) {
          const int c = (i >> 2) * 8 + (i & 1);
          s[i] = (c >= lo[(i >> 1) & 1]) & (c < hi[(i >> 1) & 1]) ? s[i] : -INFINITY;
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
    const int my_turn = kTurnBarrier + cw, next_turn = kTurnBarrier + (cw + 1) % kConsumers;

    MbarWait(q_full, 0);
    MbarWait(k_full, 0);
    NamedBarrierSync(my_turn, 256);
    WgmmaFence();
    issue_s(0);
    NamedBarrierArrive(next_turn, 256);
    WgmmaWait<0>();
    FenceRegs<kNS>(s);
    release(k_empty);
    softmax(0, mask_at(0));
    pack_p();  // O is still 0: no rescale
    // O is rescaled between the issue of S(it) and that of P V(it - 1) (FlashAttention-3's
    // RescaleOBeforeGemm order): the rescale is off the path from the end of softmax(it - 1) to
    // the next S issue and runs while S(it) is on the tensor cores.
    for (int it = 1; it < n_blocks; ++it) {
      const uint32_t uit = static_cast<uint32_t>(it);
      const uint32_t sk = uit % kStages, sv = (uit - 1) % kStages;
      MbarWait(k_full + sk, (uit / kStages) & 1);
      MbarWait(v_full + sv, ((uit - 1) / kStages) & 1);  // before the turn: no wait between GEMMs
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
    const uint32_t sv = static_cast<uint32_t>(n_blocks - 1) % kStages;
    MbarWait(v_full + sv, (static_cast<uint32_t>(n_blocks - 1) / kStages) & 1);
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
  }
  // Balances the last consumer's first hand-over (consumer 0 waits once more than the others).
  if (cw == 0) NamedBarrierSync(kTurnBarrier + 0, 256);

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
    if (maps.o_tma) {  // O into this consumer's rows of the Q buffer (its own S reads are done)
      char* row0 = reinterpret_cast<char*>(s_q) + r * 128;
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt) {
        // Column dt * 8 + 2t: panel dt / 8, 16-byte chunk dt % 8 (swizzled with the row).
        *reinterpret_cast<uint32_t*>(row0 + (dt >> 3) * kBlockM * 128 +
                                     (((dt & 7) ^ (r & 7)) << 4) + t * 4) =
            Tr::Pack(acc_o[4 * dt + 2 * hf] * wb, acc_o[4 * dt + 2 * hf + 1] * wb);
      }
      continue;
    }
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
  if (maps.o_tma) {  // one thread per consumer stores its 64 rows, one copy per 64-column panel
    FenceProxyAsync();
    NamedBarrierSync(kOStagedBarrier + cw, 128);
    if (warp == 0 && lane == 0) {
#pragma unroll
      for (int pn = 0; pn < kPanels; ++pn)
        TmaStore4d(&maps.o, s_q + pn * kBlockM * 64 + cw * 64 * 64, pn * 64, h,
                   static_cast<int>(m_begin) + cw * 64, b);
      BulkCommit();
      BulkWaitRead();  // the staging must outlive the copies' reads of it
    }
  }
#else
  __trap();  // only the sm_90a build carries this kernel; the launcher never picks it elsewhere
#endif
}

// Queues the warp-specialised forward. Returns cudaErrorNotSupported, with nothing queued, when
// the tensors cannot be described by TMA descriptors (the caller then runs another kernel).
template <typename T, int kD, int kBlockN, int kStages, int kConsumers = 2, bool kIv = false>
cudaError_t LaunchFwdSm90Ws(const FwdParams& p, cudaStream_t stream) {
  using Cfg = FwdWsTraits<kD, kBlockN, kStages, kConsumers>;
  FwdTmaMaps maps{};
  if (p.m <= 0 || p.n <= 0 || p.kv_heads <= 0 || p.q_heads % p.kv_heads != 0 ||
      !EncodeRowTensorMap<T>(&maps.q, p.q, kD, p.q_heads, p.m, p.batch, p.q_row_stride,
                             p.q_batch_stride, Cfg::kBlockM) ||
      !EncodeRowTensorMap<T>(&maps.k, p.k, kD, p.kv_heads, p.n, p.batch, p.k_row_stride,
                             p.k_batch_stride, kBlockN) ||
      !EncodeRowTensorMap<T>(&maps.v, p.v, kD, p.kv_heads, p.n, p.batch, p.v_row_stride,
                             p.v_batch_stride, kBlockN)) {
    return cudaErrorNotSupported;
  }
  maps.o_tma = !p.out_f32 && !p.accumulate &&
               EncodeRowTensorMap<T>(&maps.o, p.out, kD, p.q_heads, p.m, p.batch, p.o_row_stride,
                                     p.o_batch_stride, 64);
  auto kernel = FlashFwdSm90WsKernel<T, kD, kBlockN, kStages, kConsumers, kIv>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>((p.m + Cfg::kBlockM - 1) / Cfg::kBlockM), p.q_heads,
                  p.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p, maps);
  return cudaGetLastError();
}

}  // namespace dfa::cuda
