// Hopper backward unit, warp-specialised (FlashAttention-3's producer / consumer split, sm_90a),
// dQ by atomics. Same contract and math as flash_bwd_sm90.cuh (BwdParams; ComputeDelta has run;
// dq, dk, dv are fp32 and receive +=); chosen by the launchers of flash_bwd_*.cu with pipe mode 0
// (DFA_CUDA_BWD_PIPE=0) or where the pipe kernel (flash_bwd_sm90_pipe.cuh, the default, same
// tiles and loop with dQ added by writer warps) cannot describe dq by TMA.
//
// CTA = 3 warpgroups (384 threads) owning kBlockN = 128 key rows of one (batch, kv head):
// - warpgroup 0, the producer, gives its registers back (setmaxnreg.dec to 24). Its warp 0
//   loads K and V once (TMA, one "kv" mbarrier), then walks the items (every query head of the
//   GQA group x every visible 64-row query block) into a ring of kStages stages: lane 0 issues
//   the Q and dO tiles as TMA bulk tensor copies (128B swizzle = SW128), the 32 lanes write the
//   block's LSE * log2 e and Delta (rows past m / rows that see no key: LSE = +inf so P = 0) to
//   shared memory. A stage's "full" mbarrier expects 1 + 32 arrivals plus the TMA bytes; its
//   "empty" one 8 arrivals (lane 0 of every consumer warp, after its last wgmma read the stage).
// - warpgroups 1 and 2, the consumers (setmaxnreg.inc to 240), own 64 key rows each and run
//   the loop of flash_bwd_sm90.cuh per item: S^T = K Q^T and dP^T = V dO^T (m64n64, shared
//   operands), P^T, dS^T in registers, dV += P^T dO and dK += dS^T Q (A from registers), dS^T to
//   shared memory (double buffered, so the next item needs no CTA barrier), one 256-thread named
//   barrier, dQ = dS K (D=128: column halves; D=64: key halves), fp32 float2 atomics into dq.
// The only CTA-wide barrier is the one after the mbarrier initialisation.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda/flash_bwd_sm90_epilogue.cuh"
#include "kernels/cuda/flash_fwd_sm90_ws.cuh"  // EncodeRowTensorMap
#include "kernels/cuda/flash_params.h"
#include "kernels/cuda/sm90_common.cuh"
#include "kernels/cuda/sm90_tma.cuh"

namespace dfa::cuda {

// The TMA descriptors of one backward launch (kernel parameter, __grid_constant__).
struct BwdTmaMaps {
  CUtensorMap q, k, v, dout;
};

template <int kD>
struct BwdWsTraits {
  static constexpr int kBlockN = 128, kBlockM = 64, kStages = 2, kThreads = 384;
  static constexpr int kKVElems = kBlockN * kD;
  static constexpr int kQElems = kBlockM * kD;
  static constexpr int kDsElems = kBlockN * kBlockM;
  // Layout (bytes from the 1024-aligned base): K, V, Q[kStages], dO[kStages], dS^T[2],
  // LSE[kStages][64], Delta[kStages][64], mbarriers (kv, full[kStages], empty[kStages]).
  static constexpr int kStatOffset = (2 * kKVElems + 2 * kStages * kQElems + 2 * kDsElems) * 2;
  static constexpr int kBarOffset = kStatOffset + 2 * kStages * kBlockM * 4;
  static constexpr int kSmemBytes = kBarOffset + 8 * (1 + 2 * kStages) + 1024;  // + alignment
  // setmaxnreg moves registers inside the CTA's own allocation: ptxas gives 384 threads at most
  // 168 registers each (launch bounds 384, 1) and the consumers' increase must be covered by
  // what the producer gives back, i.e. 128 x producer + 256 x consumer <= 384 x 168 (FA3's
  // 24 / 240 is exactly that). A larger sum blocks setmaxnreg.inc forever (seen on the H200 with
  // 32 / 240: every launch hung).
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 384 * 168, "register pool");
};

// Named barrier 1: the two consumer warpgroups, "dS^T of this item is in shared memory".
constexpr int kBwdDsBarrier = 1;

template <typename T, int kD>
__global__ void __launch_bounds__(384, 1)
    FlashBwdSm90WsKernel(const __grid_constant__ BwdParams p,
                         const __grid_constant__ BwdTmaMaps maps) {
#ifdef DFA_WGMMA
  using Tr = ElemTraits<T>;
  using Cfg = BwdWsTraits<kD>;
  constexpr int kBlockN = Cfg::kBlockN, kBlockM = Cfg::kBlockM, kStages = Cfg::kStages;
  constexpr int kPanels = kD / 64;
  constexpr bool kSplitN = kD == 128;  // dQ: split columns (128) or keys (64) between warpgroups
  constexpr int kNS = kBlockM / 2;  // S^T / dP^T accumulator floats per thread (m64 n64)
  constexpr int kNA = kD / 2;       // dK / dV accumulator floats per thread (m64 n kD)
  extern __shared__ __align__(1024) char smem_bws[];
  char* base = smem_bws + ((1024 - (SmemAddr(smem_bws) & 1023)) & 1023);
  T* s_k = reinterpret_cast<T*>(base);
  T* s_v = s_k + Cfg::kKVElems;
  T* s_q_base = s_v + Cfg::kKVElems;                                 // kStages stages
  T* s_do_base = s_q_base + kStages * Cfg::kQElems;                  // kStages stages
  T* s_ds_base = s_do_base + kStages * Cfg::kQElems;                 // 2 buffers (item parity)
  float* s_lse = reinterpret_cast<float*>(base + Cfg::kStatOffset);  // [kStages][kBlockM]
  float* s_delta = s_lse + kStages * kBlockM;
  uint64_t* kv_full = reinterpret_cast<uint64_t*>(base + Cfg::kBarOffset);
  uint64_t* full = kv_full + 1;
  uint64_t* empty = full + kStages;

  const int nb = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
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
  if (m_block_min >= m_blocks) return;  // nothing visible: dK, dV unchanged (whole CTA)
  const int per_head = m_blocks - m_block_min;
  const int items = group * per_head;

  if (tid == 0) {
    MbarInit(kv_full, 1);
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      MbarInit(full + s, 1 + 32);
      MbarInit(empty + s, 8);
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
        const int64_t m_begin = int64_t{m_block_min + it % per_head} * kBlockM;
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

  float acc_dk[kNA], acc_dv[kNA];
#pragma unroll
  for (int i = 0; i < kNA; ++i) acc_dk[i] = acc_dv[i] = 0.f;

  // dQ of one item (acc_dq) times the scale, added to the fp32 dq with float2 atomics.
  auto flush_dq = [&](const float* acc_dq, int it) {
    const int h = hk * group + it / per_head;
    const int64_t m_begin = int64_t{m_block_min + it % per_head} * kBlockM;
    const int m_valid = static_cast<int>(Min64(kBlockM, p.m - m_begin));
    float* dq_g = p.dq + b * p.dq_batch_stride + m_begin * p.dq_row_stride + int64_t{h} * kD +
                  (kSplitN ? cw * 64 : 0);
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int ml = qrow_base + hf * 8;
      if (ml < m_valid) {
        float* dst = dq_g + ml * p.dq_row_stride + 2 * t;
#pragma unroll
        for (int j = 0; j < 8; ++j)
          atomicAdd(
              reinterpret_cast<float2*>(dst + j * 8),
              make_float2(acc_dq[4 * j + 2 * hf] * p.scale, acc_dq[4 * j + 2 * hf + 1] * p.scale));
      }
    }
  };

  MbarWait(kv_full, 0);
  for (int item = 0; item < items; ++item) {
    const int s = item % kStages;
    const int64_t m_begin = int64_t{m_block_min + item % per_head} * kBlockM;
    const T* s_q = s_q_base + s * Cfg::kQElems;
    const T* s_do = s_do_base + s * Cfg::kQElems;
    T* s_ds = s_ds_base + (item & 1) * Cfg::kDsElems;
    const float* s_lse_cur = s_lse + s * kBlockM;
    const float* s_delta_cur = s_delta + s * kBlockM;
    MbarWait(full + s, (item / kStages) & 1);

    // S^T = K Q^T and dP^T = V dO^T for this warpgroup's 64 keys, as two commit groups.
    float st[kNS], dpt[kNS];
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const int off = (kk & 3) * 16;
      const uint64_t da =
          MakeSmemDesc(s_k + (kk >> 2) * kBlockN * 64 + cw * 64 * 64 + off, 16, 1024);
      const uint64_t db = MakeSmemDesc(s_q + (kk >> 2) * kBlockM * 64 + off, 16, 1024);
      WgmmaSS<T, kBlockM, 0, 0>::Run(st, da, db, kk > 0 ? 1 : 0);
    }
    WgmmaCommit();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const int off = (kk & 3) * 16;
      const uint64_t da =
          MakeSmemDesc(s_v + (kk >> 2) * kBlockN * 64 + cw * 64 * 64 + off, 16, 1024);
      const uint64_t db = MakeSmemDesc(s_do + (kk >> 2) * kBlockM * 64 + off, 16, 1024);
      WgmmaSS<T, kBlockM, 0, 0>::Run(dpt, da, db, kk > 0 ? 1 : 0);
    }
    WgmmaCommit();
    WgmmaWait<1>();
    FenceRegs<kNS>(st);

    // P^T (masked entries: 0). Accumulator i: key row key_base + 8 * ((i >> 1) & 1),
    // query column (i >> 2) * 8 + 2t + (i & 1).
    const bool need_mask =
        n_valid < kBlockN || (p.causal && p.kv_row0 + n_begin + kBlockN - 1 > p.q_row0 + m_begin);
#pragma unroll
    for (int i = 0; i < kNS; ++i) {
      const int ml = (i >> 2) * 8 + 2 * t + (i & 1);
      float pv = FastExp2(st[i] * scale_log2 - s_lse_cur[ml]);
      if (need_mask) {
        const int nl = key_base + ((i >> 1) & 1) * 8;
        if (nl >= n_valid || (p.causal && p.kv_row0 + n_begin + nl > p.q_row0 + m_begin + ml))
          pv = 0.f;
      }
      st[i] = pv;
    }
    uint32_t ap[kBlockM / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      ap[kk][0] = Tr::Pack(st[8 * kk + 0], st[8 * kk + 1]);
      ap[kk][1] = Tr::Pack(st[8 * kk + 2], st[8 * kk + 3]);
      ap[kk][2] = Tr::Pack(st[8 * kk + 4], st[8 * kk + 5]);
      ap[kk][3] = Tr::Pack(st[8 * kk + 6], st[8 * kk + 7]);
    }
    // dV += P^T dO (dO read MN-major), overlapping the dS^T computation below.
    FenceRegs<kNA>(acc_dv);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      const uint64_t db = MakeSmemDesc(s_do + kk * 16 * 64, kBlockM * 64 * 2, 1024);
      WgmmaRS<T, kD, 1>::Run(acc_dv, ap[kk], db, 1);
    }
    WgmmaCommit();
    WgmmaWait<1>();  // dP^T done (the dV group may still run)
    FenceRegs<kNS>(dpt);

    uint32_t ads[kBlockM / 16][4];
#pragma unroll
    for (int i = 0; i < kNS; ++i)
      dpt[i] = st[i] * (dpt[i] - s_delta_cur[(i >> 2) * 8 + 2 * t + (i & 1)]);
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      ads[kk][0] = Tr::Pack(dpt[8 * kk + 0], dpt[8 * kk + 1]);
      ads[kk][1] = Tr::Pack(dpt[8 * kk + 2], dpt[8 * kk + 3]);
      ads[kk][2] = Tr::Pack(dpt[8 * kk + 4], dpt[8 * kk + 5]);
      ads[kk][3] = Tr::Pack(dpt[8 * kk + 6], dpt[8 * kk + 7]);
      // dS^T to shared memory (rows = keys, columns = queries) for the dQ phase.
      *reinterpret_cast<uint32_t*>(s_ds + Sw128<kBlockN>(key_base, kk * 16 + 2 * t)) = ads[kk][0];
      *reinterpret_cast<uint32_t*>(s_ds + Sw128<kBlockN>(key_base + 8, kk * 16 + 2 * t)) =
          ads[kk][1];
      *reinterpret_cast<uint32_t*>(s_ds + Sw128<kBlockN>(key_base, kk * 16 + 8 + 2 * t)) =
          ads[kk][2];
      *reinterpret_cast<uint32_t*>(s_ds + Sw128<kBlockN>(key_base + 8, kk * 16 + 8 + 2 * t)) =
          ads[kk][3];
    }
    // dK += dS^T Q (Q read MN-major; the scale is applied at the end).
    FenceRegs<kNA>(acc_dk);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      const uint64_t db = MakeSmemDesc(s_q + kk * 16 * 64, kBlockM * 64 * 2, 1024);
      WgmmaRS<T, kD, 1>::Run(acc_dk, ads[kk], db, 1);
    }
    WgmmaCommit();
    FenceProxyAsync();
    // dS^T complete for both consumers. The buffer of this item's parity is rewritten only two
    // items later, after both consumers passed the next item's barrier, i.e. after their dQ
    // wgmmas of this item completed (WgmmaWait<0> below).
    NamedBarrierSync(kBwdDsBarrier, 256);

    // dQ = dS K: A = dS^T read MN-major, B = K read MN-major.
    float acc_dq[32];
    WgmmaFence();
    constexpr int kQSteps = kSplitN ? kBlockN / 16 : 64 / 16;
#pragma unroll
    for (int kk = 0; kk < kQSteps; ++kk) {
      const int key0 = kSplitN ? kk * 16 : cw * 64 + kk * 16;
      const uint64_t da = MakeSmemDesc(s_ds + key0 * 64, kBlockN * 64 * 2, 1024);
      const uint64_t db =
          MakeSmemDesc(s_k + (kSplitN ? cw * kBlockN * 64 : 0) + key0 * 64, kBlockN * 64 * 2, 1024);
      WgmmaSS<T, 64, 1, 1>::Run(acc_dq, da, db, kk > 0 ? 1 : 0);
    }
    WgmmaCommit();
    WgmmaWait<0>();
    FenceRegs<32>(acc_dq);
    FenceRegs<kBlockM / 4>(&ap[0][0]);  // A operands stay untouched until their wgmmas finish
    FenceRegs<kBlockM / 4>(&ads[0][0]);
    FenceRegs<kNA>(acc_dv);
    FenceRegs<kNA>(acc_dk);
    if (lane == 0) MbarArrive(empty + s);  // every read of this stage (Q, dO, LSE, Delta) done
    flush_dq(acc_dq, item);
  }

  // dK, dV += (this CTA owns these rows exclusively); loads batched (flash_bwd_sm90_epilogue.cuh).
  AddDkDvRows<kD>(p, acc_dk, acc_dv, hk, b, n_begin, n_valid, key_base, t, kBwdEpilogueBatched);
#else
  __trap();  // only the sm_90a build carries this kernel; the launcher never picks it elsewhere
#endif
}

// Queues the warp-specialised backward. Returns cudaErrorNotSupported, with nothing queued, when
// the tensors cannot be described by TMA descriptors (the caller then runs another kernel).
template <typename T, int kD>
cudaError_t LaunchBwdSm90Ws(const BwdParams& p, cudaStream_t stream) {
  using Cfg = BwdWsTraits<kD>;
  BwdTmaMaps maps;
  if (p.m <= 0 || p.n <= 0 || p.kv_heads <= 0 || p.q_heads % p.kv_heads != 0 || p.m > INT32_MAX ||
      p.n > INT32_MAX || p.q_heads > INT32_MAX / kD ||
      !EncodeRowTensorMap<T>(&maps.q, p.q, kD, p.q_heads, p.m, p.batch, p.q_row_stride,
                             p.q_batch_stride, Cfg::kBlockM) ||
      !EncodeRowTensorMap<T>(&maps.dout, p.dout, kD, p.q_heads, p.m, p.batch, p.do_row_stride,
                             p.do_batch_stride, Cfg::kBlockM) ||
      !EncodeRowTensorMap<T>(&maps.k, p.k, kD, p.kv_heads, p.n, p.batch, p.k_row_stride,
                             p.k_batch_stride, Cfg::kBlockN) ||
      !EncodeRowTensorMap<T>(&maps.v, p.v, kD, p.kv_heads, p.n, p.batch, p.v_row_stride,
                             p.v_batch_stride, Cfg::kBlockN)) {
    return cudaErrorNotSupported;
  }
  auto kernel = FlashBwdSm90WsKernel<T, kD>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>((p.n + Cfg::kBlockN - 1) / Cfg::kBlockN), p.kv_heads,
                  p.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p, maps);
  return cudaGetLastError();
}

}  // namespace dfa::cuda
