// FlashAttention-2 style backward unit (mma.sync m16n8k16, sm_80 and sm_90): the backward on GPUs
// other than Hopper (kernel_dispatch.h).
//
// One CTA owns kBlockN key/value rows of one (batch, kv head) and walks every query head of its
// GQA group and every query block that can see those keys, so dK and dV are summed over the
// group in registers and written once (+= into the caller's fp32 buffers, no atomics: the CTA
// is the only writer of its rows). Per query block, with warps split along the key rows:
//   S^T = K Q^T,  P^T = exp2(S^T * scale * log2e - LSE2),  dP^T = V dO^T,
//   dS^T = P^T o (dP^T - Delta),  dV += P^T dO,  dK += scale * dS^T Q,
// then dS^T goes through shared memory and the warps, now split along the query rows, compute
// dQ = scale * dS K and add it to the fp32 dq with atomics (vector atomics on sm_90).
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda/flash_common.cuh"
#include "kernels/cuda/flash_params.h"
#include "kernels/cuda/mask_tiles.cuh"

namespace dfa::cuda {

template <typename T, int kD, int kBlockM, int kBlockN, int kNWarps>
struct BwdTraits {
  static constexpr int kThreads = kNWarps * 32;
  static constexpr int kMT = kBlockM / 8;  // 8-column tiles of S^T (query rows)
  static constexpr int kDT = kD / 8;
  static constexpr int kSmemBytes =
      (2 * kBlockN * kD + 4 * kBlockM * kD + kBlockN * kBlockM) * 2 + 2 * kBlockM * 4;
  static_assert(kBlockN == 16 * kNWarps && kBlockM == 16 * kNWarps, "one 16-row tile per warp");
  static_assert(kBlockM % 64 == 0 && kD % 64 == 0, "tile shapes");
};

__device__ inline void AtomicAddF2(float* dst, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(dst), make_float2(x, y));
#else
  atomicAdd(dst, x);
  atomicAdd(dst + 1, y);
#endif
}

// kIv: the kIntervals mask (mask_tiles.cuh): the query blocks come from the key tile's
// intervals (k_lo / k_hi), each key's visible queries mask P; false compiles the dense kernel.
template <typename T, int kD, int kBlockM, int kBlockN, int kNWarps, bool kIv>
__global__ void __launch_bounds__(kNWarps * 32) FlashBwdKernel(const BwdParams p) {
  using Tr = ElemTraits<T>;
  using Cfg = BwdTraits<T, kD, kBlockM, kBlockN, kNWarps>;
  constexpr int kMT = Cfg::kMT, kDT = Cfg::kDT, kThreads = Cfg::kThreads;
  extern __shared__ __align__(128) char smem_raw[];
  T* s_k = reinterpret_cast<T*>(smem_raw);
  T* s_v = s_k + kBlockN * kD;
  T* s_q_base = s_v + kBlockN * kD;          // 2 stages
  T* s_do_base = s_q_base + 2 * kBlockM * kD;  // 2 stages
  T* s_ds = s_do_base + 2 * kBlockM * kD;      // dS^T [kBlockN][kBlockM]
  float* s_lse = reinterpret_cast<float*>(s_ds + kBlockN * kBlockM);  // LSE * log2e
  float* s_delta = s_lse + kBlockM;

  const int nb = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const int group = p.q_heads / p.kv_heads;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t n_begin = int64_t{nb} * kBlockN;
  const int n_valid = static_cast<int>(Min64(kBlockN, p.n - n_begin));
  const int nr0 = warp * 16;  // this warp's key rows in S^T phases
  const int mr0 = warp * 16;  // this warp's query rows in the dQ phase
  const float scale_log2 = p.scale * kLog2e;

  // Query blocks before m_block_min hold only rows that precede every key of this block.
  const int m_blocks = static_cast<int>((p.m + kBlockM - 1) / kBlockM);
  int m_block_min = 0;
  if (p.causal) {
    const int64_t first = p.kv_row0 + n_begin - p.q_row0;  // first query row that sees a key
    if (first > 0) m_block_min = static_cast<int>(Min64(first / kBlockM, m_blocks));
  }
  int m_block_end = m_blocks;
  IvRow iv_key[2];  // kIv: this thread's two key rows' visible queries (unit-local)
  if constexpr (kIv) {
    const IvQueryRange r = IvQueryBlocks(p.iv, b, p.kv_row0 + n_begin,
                                         p.kv_row0 + n_begin + n_valid - 1, p.q_row0, p.m, kBlockM);
    m_block_min = r.first;
    m_block_end = r.end;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int nl = nr0 + g + hf * 8;
      iv_key[hf] = IvKeyRow(p.iv, b, p.kv_row0 + n_begin + nl, p.q_row0, p.m, nl < n_valid);
    }
  }
  if (m_block_min >= m_block_end) return;  // nothing visible: dK, dV unchanged

  const T* k_g = static_cast<const T*>(p.k) + b * p.k_batch_stride + n_begin * p.k_row_stride + int64_t{hk} * kD;
  const T* v_g = static_cast<const T*>(p.v) + b * p.v_batch_stride + n_begin * p.v_row_stride + int64_t{hk} * kD;
  LoadTile<kBlockN, kD, kThreads>(s_k, k_g, p.k_row_stride, n_valid);
  LoadTile<kBlockN, kD, kThreads>(s_v, v_g, p.v_row_stride, n_valid);
  CpAsyncCommit();

  float acc_dk[kDT][4], acc_dv[kDT][4];
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[dt][e] = acc_dv[dt][e] = 0.f;

  // Work items are (query head of the group, query block); Q and dO of item i + 1 are copied
  // while item i computes.
  const int per_head = m_block_end - m_block_min;
  const int items = group * per_head;
  auto load_item = [&](int item, int stage) {
    const int h = hk * group + item / per_head;
    const int64_t m_begin = int64_t{m_block_min + item % per_head} * kBlockM;
    const int m_valid = static_cast<int>(Min64(kBlockM, p.m - m_begin));
    LoadTile<kBlockM, kD, kThreads>(s_q_base + stage * kBlockM * kD,
                                    static_cast<const T*>(p.q) + b * p.q_batch_stride + m_begin * p.q_row_stride + int64_t{h} * kD,
                                    p.q_row_stride, m_valid);
    LoadTile<kBlockM, kD, kThreads>(s_do_base + stage * kBlockM * kD,
                                    static_cast<const T*>(p.dout) + b * p.do_batch_stride + m_begin * p.do_row_stride + int64_t{h} * kD,
                                    p.do_row_stride, m_valid);
  };
  load_item(0, 0);
  CpAsyncCommit();

  for (int item = 0; item < items; ++item) {
    {
      const int h = hk * group + item / per_head;
      const int mb = m_block_min + item % per_head;
      const int64_t m_begin = int64_t{mb} * kBlockM;
      const int m_valid = static_cast<int>(Min64(kBlockM, p.m - m_begin));
      const T* s_q = s_q_base + (item & 1) * kBlockM * kD;
      const T* s_do = s_do_base + (item & 1) * kBlockM * kD;
      if (item + 1 < items) load_item(item + 1, (item + 1) & 1);
      CpAsyncCommit();
      for (int i = threadIdx.x; i < kBlockM; i += kThreads) {
        float l = INFINITY, d = 0.f;  // rows past the end and rows that see no key: P = 0
        if (i < m_valid) {
          const float lse = p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + m_begin + i];
          if (lse != -INFINITY) l = lse * kLog2e;
          d = p.delta[b * p.delta_batch_stride + h * p.delta_head_stride + m_begin + i];
        }
        s_lse[i] = l;
        s_delta[i] = d;
      }
      CpAsyncWait<1>();
      __syncthreads();

      // S^T = K Q^T and dP^T = V dO^T for this warp's 16 key rows.
      float st[kMT][4], dpt[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[mt][e] = dpt[mt][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        uint32_t ak[4], av[4];
        LoadA<kD>(ak, s_k, nr0, kk * 16);
        LoadA<kD>(av, s_v, nr0, kk * 16);
#pragma unroll
        for (int mt2 = 0; mt2 < kMT / 2; ++mt2) {
          uint32_t bq[4], bo[4];
          LoadBRowsN<kD>(bq, s_q, mt2 * 16, kk * 16);
          LoadBRowsN<kD>(bo, s_do, mt2 * 16, kk * 16);
          Tr::Mma(st[2 * mt2], ak, bq);
          Tr::Mma(st[2 * mt2 + 1], ak, bq + 2);
          Tr::Mma(dpt[2 * mt2], av, bo);
          Tr::Mma(dpt[2 * mt2 + 1], av, bo + 2);
        }
      }

      // P^T and dS^T (masked entries: P = 0).
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int nl = nr0 + g + (e >> 1) * 8;
          const int ml = mt * 8 + 2 * t + (e & 1);
          float pv = FastExp2(st[mt][e] * scale_log2 - s_lse[ml]);
          if constexpr (kIv) {
            const int64_t mq = m_begin + ml;
            if (mq < iv_key[e >> 1].lo || mq >= iv_key[e >> 1].hi) pv = 0.f;
          } else if (nl >= n_valid || (p.causal && p.kv_row0 + n_begin + nl > p.q_row0 + m_begin + ml)) {
            pv = 0.f;
          }
          st[mt][e] = pv;
          dpt[mt][e] = pv * (dpt[mt][e] - s_delta[ml]);
        }

      // dV += P^T dO, dK += dS^T Q (scale applied at the end).
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        uint32_t ap[4], ads[4];
        ap[0] = Tr::Pack(st[2 * kk][0], st[2 * kk][1]);
        ap[1] = Tr::Pack(st[2 * kk][2], st[2 * kk][3]);
        ap[2] = Tr::Pack(st[2 * kk + 1][0], st[2 * kk + 1][1]);
        ap[3] = Tr::Pack(st[2 * kk + 1][2], st[2 * kk + 1][3]);
        ads[0] = Tr::Pack(dpt[2 * kk][0], dpt[2 * kk][1]);
        ads[1] = Tr::Pack(dpt[2 * kk][2], dpt[2 * kk][3]);
        ads[2] = Tr::Pack(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]);
        ads[3] = Tr::Pack(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3]);
        // dS^T to shared memory for the dQ phase.
        T* ds_row = s_ds;
        *reinterpret_cast<uint32_t*>(ds_row + Swz<kBlockM>(nr0 + g, kk * 16 + 2 * t)) = ads[0];
        *reinterpret_cast<uint32_t*>(ds_row + Swz<kBlockM>(nr0 + g + 8, kk * 16 + 2 * t)) = ads[1];
        *reinterpret_cast<uint32_t*>(ds_row + Swz<kBlockM>(nr0 + g, kk * 16 + 8 + 2 * t)) = ads[2];
        *reinterpret_cast<uint32_t*>(ds_row + Swz<kBlockM>(nr0 + g + 8, kk * 16 + 8 + 2 * t)) = ads[3];
#pragma unroll
        for (int dt2 = 0; dt2 < kDT / 2; ++dt2) {
          uint32_t bo[4], bq[4];
          LoadBRowsK<kD>(bo, s_do, kk * 16, dt2 * 16);
          LoadBRowsK<kD>(bq, s_q, kk * 16, dt2 * 16);
          Tr::Mma(acc_dv[2 * dt2], ap, bo);
          Tr::Mma(acc_dv[2 * dt2 + 1], ap, bo + 2);
          Tr::Mma(acc_dk[2 * dt2], ads, bq);
          Tr::Mma(acc_dk[2 * dt2 + 1], ads, bq + 2);
        }
      }
      __syncthreads();

      // dQ = scale * dS K for this warp's 16 query rows, added to dq with atomics.
      uint32_t a_ds[kBlockN / 16][4];
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) LoadATrans<kBlockM>(a_ds[kk], s_ds, mr0, kk * 16);
      float* dq_g = p.dq + b * p.dq_batch_stride + m_begin * p.dq_row_stride + int64_t{h} * kD;
#pragma unroll
      for (int dt2 = 0; dt2 < kDT / 2; ++dt2) {
        float acc[2][4] = {};
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) {
          uint32_t bk[4];
          LoadBRowsK<kD>(bk, s_k, kk * 16, dt2 * 16);
          Tr::Mma(acc[0], a_ds[kk], bk);
          Tr::Mma(acc[1], a_ds[kk], bk + 2);
        }
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            const int ml = mr0 + g + hf * 8;
            if (ml < m_valid) {
              AtomicAddF2(dq_g + ml * p.dq_row_stride + dt2 * 16 + j * 8 + 2 * t,
                          acc[j][2 * hf] * p.scale, acc[j][2 * hf + 1] * p.scale);
            }
          }
      }
      __syncthreads();  // the next block overwrites Q, dO and dS^T
    }
  }

  // dK, dV += (this CTA owns these rows exclusively).
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int nl = nr0 + g + hf * 8;
    if (nl >= n_valid) continue;
    float* dk = p.dk + b * p.dk_batch_stride + (n_begin + nl) * p.dk_row_stride + int64_t{hk} * kD + 2 * t;
    float* dv = p.dv + b * p.dv_batch_stride + (n_begin + nl) * p.dv_row_stride + int64_t{hk} * kD + 2 * t;
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) {
      float2 k2 = *reinterpret_cast<float2*>(dk + dt * 8);
      float2 v2 = *reinterpret_cast<float2*>(dv + dt * 8);
      k2.x += acc_dk[dt][2 * hf] * p.scale;
      k2.y += acc_dk[dt][2 * hf + 1] * p.scale;
      v2.x += acc_dv[dt][2 * hf];
      v2.y += acc_dv[dt][2 * hf + 1];
      *reinterpret_cast<float2*>(dk + dt * 8) = k2;
      *reinterpret_cast<float2*>(dv + dt * 8) = v2;
    }
  }
}

template <typename T, int kD, int kBlockM, int kBlockN, int kNWarps, bool kIv = false>
cudaError_t LaunchBwd(const BwdParams& p, cudaStream_t stream) {
  using Cfg = BwdTraits<T, kD, kBlockM, kBlockN, kNWarps>;
  auto kernel = FlashBwdKernel<T, kD, kBlockM, kBlockN, kNWarps, kIv>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>((p.n + kBlockN - 1) / kBlockN), p.kv_heads, p.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dfa::cuda
