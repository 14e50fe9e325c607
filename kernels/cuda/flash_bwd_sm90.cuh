// Hopper backward unit: the algorithm of flash_bwd_kernel.cuh on warpgroup MMA (wgmma, sm_90a).
// Same contract as the mma.sync kernel (BwdParams; ComputeDelta has run; dq, dk, dv are fp32
// and receive +=). Runs on Hopper where TMA cannot describe q, k, v, dout or dq (the table of
// kernel_dispatch.h; the default is the pipe kernel of flash_bwd_sm90_pipe.cuh).
//
// CTA = 2 warpgroups (256 threads) owning kBlockN = 128 key rows of one (batch, kv head), 64
// per warpgroup; it walks every query head of the GQA group and every visible 64-row query
// block (Q, dO of the next block prefetched with cp.async into 128B-swizzled tiles). Per block
// and warpgroup, as m64 wgmmas:
//   S^T = K Q^T, dP^T = V dO^T           (both operands from shared memory, kD/16 k-steps)
//   P^T = exp2(S^T scale log2e - LSE2), dS^T = P^T (dP^T - Delta)   (registers)
//   dV += P^T dO, dK += dS^T Q           (A from registers, B read MN-major from shared memory)
// dS^T goes to shared memory, then dQ = dS K over the CTA's 128 keys (head dim 128: each
// warpgroup one 64-column half; head dim 64: each warpgroup its own 64 keys) is added to the
// fp32 dq with vector atomics. dK, dV are summed over the GQA group in registers and added once
// (the CTA is the only writer of its rows).
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda/flash_bwd_sm90_epilogue.cuh"
#include "kernels/cuda/flash_params.h"
#include "kernels/cuda/sm90_common.cuh"

namespace dfa::cuda {

template <int kD>
struct BwdSm90Traits {
  static constexpr int kBlockN = 128, kBlockM = 64, kThreads = 256;
  static constexpr int kKVElems = kBlockN * kD;
  static constexpr int kQElems = kBlockM * kD;
  static constexpr int kDsElems = kBlockN * kBlockM;
  static constexpr int kSmemBytes =
      (2 * kKVElems + 4 * kQElems + kDsElems) * 2 + 4 * kBlockM * 4 + 1024;
};

template <typename T, int kD>
__global__ void __launch_bounds__(256, 1) FlashBwdSm90Kernel(const BwdParams p) {
#ifdef DFA_WGMMA
  using Tr = ElemTraits<T>;
  using Cfg = BwdSm90Traits<kD>;
  constexpr int kBlockN = Cfg::kBlockN, kBlockM = Cfg::kBlockM, kThreads = Cfg::kThreads;
  constexpr bool kSplitN = kD == 128;  // dQ: split columns (128) or keys (64) between warpgroups
  constexpr int kNS = kBlockM / 2;     // S^T / dP^T accumulator floats per thread (m64 n64)
  constexpr int kNA = kD / 2;          // dK / dV accumulator floats per thread (m64 n kD)
  extern __shared__ __align__(1024) char smem_sm90[];
  T* s_k = reinterpret_cast<T*>(smem_sm90 + ((1024 - (SmemAddr(smem_sm90) & 1023)) & 1023));
  T* s_v = s_k + Cfg::kKVElems;
  T* s_q_base = s_v + Cfg::kKVElems;           // 2 stages
  T* s_do_base = s_q_base + 2 * Cfg::kQElems;  // 2 stages
  T* s_ds = s_do_base + 2 * Cfg::kQElems;      // dS^T [kBlockN keys][kBlockM queries]
  float* s_lse = reinterpret_cast<float*>(s_ds + Cfg::kDsElems);  // 2 stages of LSE * log2e
  float* s_delta = s_lse + 2 * kBlockM;                           // 2 stages

  const int nb = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const int group = p.q_heads / p.kv_heads;
  const int tid = threadIdx.x;
  const int wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t n_begin = int64_t{nb} * kBlockN;
  const int n_valid = static_cast<int>(Min64(kBlockN, p.n - n_begin));
  const int key_base = wg * 64 + warp * 16 + g;  // this thread's key rows: key_base, key_base + 8
  const int qrow_base = warp * 16 + g;           // this thread's query rows in the dQ phase
  const float scale_log2 = p.scale * kLog2e;

  const int m_blocks = static_cast<int>((p.m + kBlockM - 1) / kBlockM);
  int m_block_min = 0;
  if (p.causal) {
    const int64_t first = p.kv_row0 + n_begin - p.q_row0;  // first query row that sees a key
    if (first > 0) m_block_min = static_cast<int>(Min64(first / kBlockM, m_blocks));
  }
  if (m_block_min >= m_blocks) return;  // nothing visible: dK, dV unchanged

  const T* k_g = static_cast<const T*>(p.k) + b * p.k_batch_stride + n_begin * p.k_row_stride +
                 int64_t{hk} * kD;
  const T* v_g = static_cast<const T*>(p.v) + b * p.v_batch_stride + n_begin * p.v_row_stride +
                 int64_t{hk} * kD;
  LoadTileSw128<kBlockN, kD, kThreads>(s_k, k_g, p.k_row_stride, n_valid, tid);
  LoadTileSw128<kBlockN, kD, kThreads>(s_v, v_g, p.v_row_stride, n_valid, tid);
  CpAsyncCommit();

  float acc_dk[kNA], acc_dv[kNA];
#pragma unroll
  for (int i = 0; i < kNA; ++i) acc_dk[i] = acc_dv[i] = 0.f;

  const int per_head = m_blocks - m_block_min;
  const int items = group * per_head;
  auto load_item = [&](int item, int stage) {
    const int h = hk * group + item / per_head;
    const int64_t m_begin = int64_t{m_block_min + item % per_head} * kBlockM;
    const int m_valid = static_cast<int>(Min64(kBlockM, p.m - m_begin));
    LoadTileSw128<kBlockM, kD, kThreads>(s_q_base + stage * Cfg::kQElems,
                                         static_cast<const T*>(p.q) + b * p.q_batch_stride +
                                             m_begin * p.q_row_stride + int64_t{h} * kD,
                                         p.q_row_stride, m_valid, tid);
    LoadTileSw128<kBlockM, kD, kThreads>(s_do_base + stage * Cfg::kQElems,
                                         static_cast<const T*>(p.dout) + b * p.do_batch_stride +
                                             m_begin * p.do_row_stride + int64_t{h} * kD,
                                         p.do_row_stride, m_valid, tid);
  };
  // LSE (times log2 e) and Delta of one item's 64 rows, read by threads 0..63. Rows past the
  // end and rows that see no key get LSE = +inf, so P = 0.
  auto fetch_stats = [&](int item, float* l, float* d) {
    const int h = hk * group + item / per_head;
    const int64_t m_begin = int64_t{m_block_min + item % per_head} * kBlockM;
    *l = INFINITY;
    *d = 0.f;
    if (m_begin + tid < p.m) {
      const float lse = p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + m_begin + tid];
      if (lse != -INFINITY) *l = lse * kLog2e;
      *d = p.delta[b * p.delta_batch_stride + h * p.delta_head_stride + m_begin + tid];
    }
  };
  load_item(0, 0);
  CpAsyncCommit();
  if (tid < kBlockM) fetch_stats(0, &s_lse[tid], &s_delta[tid]);

  for (int item = 0; item < items; ++item) {
    const int h = hk * group + item / per_head;
    const int mb = m_block_min + item % per_head;
    const int64_t m_begin = int64_t{mb} * kBlockM;
    const int m_valid = static_cast<int>(Min64(kBlockM, p.m - m_begin));
    const T* s_q = s_q_base + (item & 1) * Cfg::kQElems;
    const T* s_do = s_do_base + (item & 1) * Cfg::kQElems;
    // The copies of this item are waited for and published first, and only then the next
    // item's are issued: the proxy fence (MEMBAR) waits for every copy and load in flight.
    CpAsyncWait<0>();
    FenceProxyAsync();
    __syncthreads();
    if (item + 1 < items) load_item(item + 1, (item + 1) & 1);
    CpAsyncCommit();
    // The next item's LSE / Delta are read now and stored at the end of this one.
    float next_l = INFINITY, next_d = 0.f;
    if (tid < kBlockM && item + 1 < items) fetch_stats(item + 1, &next_l, &next_d);
    const float* s_lse_cur = s_lse + (item & 1) * kBlockM;
    const float* s_delta_cur = s_delta + (item & 1) * kBlockM;

    // S^T = K Q^T and dP^T = V dO^T for this warpgroup's 64 keys, as two commit groups.
    float st[kNS], dpt[kNS];
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const int off = (kk & 3) * 16;
      const uint64_t da =
          MakeSmemDesc(s_k + (kk >> 2) * kBlockN * 64 + wg * 64 * 64 + off, 16, 1024);
      const uint64_t db = MakeSmemDesc(s_q + (kk >> 2) * kBlockM * 64 + off, 16, 1024);
      WgmmaSS<T, kBlockM, 0, 0>::Run(st, da, db, kk > 0 ? 1 : 0);
    }
    WgmmaCommit();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const int off = (kk & 3) * 16;
      const uint64_t da =
          MakeSmemDesc(s_v + (kk >> 2) * kBlockN * 64 + wg * 64 * 64 + off, 16, 1024);
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
    __syncthreads();  // dS^T complete for both warpgroups

    // dQ = dS K: A = dS^T read MN-major, B = K read MN-major.
    float acc_dq[32];
    WgmmaFence();
    constexpr int kQSteps = kSplitN ? kBlockN / 16 : 64 / 16;
#pragma unroll
    for (int kk = 0; kk < kQSteps; ++kk) {
      const int key0 = kSplitN ? kk * 16 : wg * 64 + kk * 16;
      const uint64_t da = MakeSmemDesc(s_ds + key0 * 64, kBlockN * 64 * 2, 1024);
      const uint64_t db =
          MakeSmemDesc(s_k + (kSplitN ? wg * kBlockN * 64 : 0) + key0 * 64, kBlockN * 64 * 2, 1024);
      WgmmaSS<T, 64, 1, 1>::Run(acc_dq, da, db, kk > 0 ? 1 : 0);
    }
    WgmmaCommit();
    WgmmaWait<0>();
    FenceRegs<32>(acc_dq);
    FenceRegs<kBlockM / 4>(&ap[0][0]);  // A operands stay untouched until their wgmmas finish
    FenceRegs<kBlockM / 4>(&ads[0][0]);
    FenceRegs<kNA>(acc_dv);
    FenceRegs<kNA>(acc_dk);
    float* dq_g = p.dq + b * p.dq_batch_stride + m_begin * p.dq_row_stride + int64_t{h} * kD +
                  (kSplitN ? wg * 64 : 0);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int ml = qrow_base + hf * 8;
        if (ml < m_valid) {
          float* dst = dq_g + ml * p.dq_row_stride + j * 8 + 2 * t;
          atomicAdd(
              reinterpret_cast<float2*>(dst),
              make_float2(acc_dq[4 * j + 2 * hf] * p.scale, acc_dq[4 * j + 2 * hf + 1] * p.scale));
        }
      }
    if (tid < kBlockM) {
      s_lse[((item + 1) & 1) * kBlockM + tid] = next_l;
      s_delta[((item + 1) & 1) * kBlockM + tid] = next_d;
    }
    // No barrier here: the next item's first barrier orders this item's reads of its Q/dO
    // stage, dS^T and LSE/Delta stage before anything overwrites them.
  }

  // dK, dV += (this CTA owns these rows exclusively); loads batched (flash_bwd_sm90_epilogue.cuh).
  AddDkDvRows<kD, BwdEpilogue::kBatched>(p, acc_dk, acc_dv, hk, b, n_begin, n_valid, key_base,
                                         t);
#else
  __trap();  // only the sm_90a build carries this kernel; the launcher never picks it elsewhere
#endif
}

template <typename T, int kD>
cudaError_t LaunchBwdSm90(const BwdParams& p, cudaStream_t stream) {
  using Cfg = BwdSm90Traits<kD>;
  auto kernel = FlashBwdSm90Kernel<T, kD>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>((p.n + Cfg::kBlockN - 1) / Cfg::kBlockN), p.kv_heads,
                  p.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dfa::cuda
