// Hopper forward unit: the FlashAttention-2 algorithm of flash_fwd_kernel.cuh on warpgroup MMA
// (wgmma, sm_90a). Same contract and epilogue as the mma.sync kernel (FwdParams). Runs on Hopper
// where TMA cannot describe q, k or v (the table of kernel_dispatch.h; the default is the
// warp-specialised TMA kernel of flash_fwd_sm90_ws.cuh).
//
// CTA = 2 warpgroups (256 threads) x 64 query rows = kBlockM 128 rows of one (batch, head).
// Q, and K/V (two stages, kBlockN rows each) live in 128B-swizzled shared tiles filled by
// cp.async from all threads. Per key block, each warpgroup runs S = Q K^T as kD/16
// m64 x kBlockN x k16 wgmmas (both operands from shared memory), the online softmax in base 2
// on the accumulators, then O += P V as kBlockN/16 wgmmas with P from registers and V read
// MN-major (transposed) from shared memory. The P V of one block is issued together with the
// S of the next, so the softmax overlaps tensor-core work (FlashAttention-3's intra-warpgroup
// pipelining). Key blocks run from the last to the first, so only the first ones (diagonal,
// tail) pay for the mask.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda/flash_params.h"
#include "kernels/cuda/sm90_common.cuh"

namespace dfa::cuda {

template <int kD, int kBlockN>
struct FwdSm90Traits {
  static constexpr int kBlockM = 128;
  static constexpr int kThreads = 256;
  static constexpr int kQElems = kBlockM * kD;
  static constexpr int kKVElems = kBlockN * kD;
  static constexpr int kSmemBytes = (kQElems + 4 * kKVElems) * 2 + 1024;  // + alignment slack
};

template <typename T, int kD, int kBlockN>
__global__ void __launch_bounds__(256, 1) FlashFwdSm90Kernel(const FwdParams p) {
#ifdef DFA_WGMMA
  using Tr = ElemTraits<T>;
  using Cfg = FwdSm90Traits<kD, kBlockN>;
  constexpr int kBlockM = Cfg::kBlockM, kThreads = Cfg::kThreads;
  constexpr int kNS = kBlockN / 2;  // S accumulator floats per thread
  constexpr int kNO = kD / 2;       // O accumulator floats per thread
  extern __shared__ __align__(1024) char smem_sm90[];
  T* s_q = reinterpret_cast<T*>(smem_sm90 + ((1024 - (SmemAddr(smem_sm90) & 1023)) & 1023));
  T* s_k = s_q + Cfg::kQElems;       // 2 stages
  T* s_v = s_k + 2 * Cfg::kKVElems;  // 2 stages

  const int tid = threadIdx.x;
  const int wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int mb = p.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;  // long rows first
  const int h = blockIdx.y, b = blockIdx.z;
  const int hk = h / (p.q_heads / p.kv_heads);
  const int64_t m_begin = int64_t{mb} * kBlockM;
  const int m_valid = static_cast<int>(Min64(kBlockM, p.m - m_begin));
  const int row_base = wg * 64 + warp * 16 + g;  // this thread's rows: row_base, row_base + 8

  int64_t n_end = p.n;
  if (p.causal) n_end = Min64(n_end, p.q_row0 + m_begin + m_valid - 1 - p.kv_row0 + 1);

  const T* q_g = static_cast<const T*>(p.q) + b * p.q_batch_stride + m_begin * p.q_row_stride +
                 int64_t{h} * kD;
  const T* k_g = static_cast<const T*>(p.k) + b * p.k_batch_stride + int64_t{hk} * kD;
  const T* v_g = static_cast<const T*>(p.v) + b * p.v_batch_stride + int64_t{hk} * kD;
  const float scale_log2 = p.scale * kLog2e;

  float acc_o[kNO];
#pragma unroll
  for (int i = 0; i < kNO; ++i) acc_o[i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};

  if (n_end > 0) {
    const int n_blocks = static_cast<int>((n_end + kBlockN - 1) / kBlockN);
    // Block `it` of the walk is key block n_blocks - 1 - it; K(it) and V(it) live in stage it & 1.
    auto load_k = [&](int it) {
      const int64_t n0 = int64_t{n_blocks - 1 - it} * kBlockN;
      LoadTileSw128<kBlockN, kD, kThreads>(s_k + (it & 1) * Cfg::kKVElems,
                                           k_g + n0 * p.k_row_stride, p.k_row_stride,
                                           static_cast<int>(Min64(kBlockN, p.n - n0)), tid);
    };
    auto load_v = [&](int it) {
      const int64_t n0 = int64_t{n_blocks - 1 - it} * kBlockN;
      LoadTileSw128<kBlockN, kD, kThreads>(s_v + (it & 1) * Cfg::kKVElems,
                                           v_g + n0 * p.v_row_stride, p.v_row_stride,
                                           static_cast<int>(Min64(kBlockN, p.n - n0)), tid);
    };
    float s[kNS], pr[kNS];  // scores, probabilities
    uint32_t a[kBlockN / 16][4];
    float corr[2] = {1.f, 1.f};
    auto issue_s = [&](int it) {  // S = Q K(it)^T for this warpgroup's 64 query rows
      const T* s_ks = s_k + (it & 1) * Cfg::kKVElems;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        const uint64_t dq =
            MakeSmemDesc(s_q + (kk >> 2) * kBlockM * 64 + wg * 64 * 64 + (kk & 3) * 16, 16, 1024);
        const uint64_t dk = MakeSmemDesc(s_ks + (kk >> 2) * kBlockN * 64 + (kk & 3) * 16, 16, 1024);
        WgmmaSS<T, kBlockN, 0, 0>::Run(s, dq, dk, kk > 0 ? 1 : 0);
      }
      WgmmaCommit();
    };
    auto issue_pv = [&](int it) {  // O += P V(it): P from registers, V read MN-major
      const T* s_vs = s_v + (it & 1) * Cfg::kKVElems;
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        const uint64_t dv = MakeSmemDesc(s_vs + kk * 16 * 64, kBlockN * 64 * 2, 1024);
        WgmmaRS<T, kD, 1>::Run(acc_o, a[kk], dv, 1);
      }
      WgmmaCommit();
    };
    // Mask and online softmax (base 2) of S(it) in place; sets corr, the factor for O.
    auto softmax = [&](int it) {
      const int64_t n0 = int64_t{n_blocks - 1 - it} * kBlockN;
      const bool need_mask =
          n0 + kBlockN > p.n || (p.causal && p.kv_row0 + n0 + kBlockN - 1 > p.q_row0 + m_begin);
      if (need_mask) {
#pragma unroll
        for (int i = 0; i < kNS; ++i) {
          const int64_t col = n0 + (i >> 2) * 8 + 2 * t + (i & 1);
          const int64_t row = m_begin + row_base + ((i >> 1) & 1) * 8;
          if (col >= p.n || (p.causal && p.kv_row0 + col > p.q_row0 + row)) s[i] = -INFINITY;
        }
      }
      // A row that has seen no key yet keeps max -inf and uses 0 as its reference, so
      // exp2(-inf - 0) = 0 and nothing becomes NaN.
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float mx = -INFINITY;  // raw scores; scale > 0, so max(scaled) = scale * max(raw)
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j)
          mx = fmaxf(mx, fmaxf(s[4 * j + 2 * hf], s[4 * j + 2 * hf + 1]));
        mx = fmaxf(QuadMax(mx) * scale_log2, row_max[hf]);
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
    auto rescale_o_and_pack_p = [&]() {
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt) {
        acc_o[4 * dt + 0] *= corr[0];
        acc_o[4 * dt + 1] *= corr[0];
        acc_o[4 * dt + 2] *= corr[1];
        acc_o[4 * dt + 3] *= corr[1];
      }
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        a[kk][0] = Tr::Pack(pr[8 * kk + 0], pr[8 * kk + 1]);
        a[kk][1] = Tr::Pack(pr[8 * kk + 2], pr[8 * kk + 3]);
        a[kk][2] = Tr::Pack(pr[8 * kk + 4], pr[8 * kk + 5]);
        a[kk][3] = Tr::Pack(pr[8 * kk + 6], pr[8 * kk + 7]);
      }
    };

    // Software pipeline: iteration `it` issues S(it) and P(it-1) V(it-1) back to back, and the
    // softmax of S(it) runs while the tensor cores still work on P V. Copies: iteration it
    // loads K(it+1) (its stage held K(it-1), consumed) and V(it) (its stage held V(it-2)),
    // issued only after the barrier that publishes the previous copies: the proxy fence
    // (MEMBAR) waits for every copy in flight, so copies issued before it would stall it.
    LoadTileSw128<kBlockM, kD, kThreads>(s_q, q_g, p.q_row_stride, m_valid, tid);
    load_k(0);
    CpAsyncCommit();
    CpAsyncWait<0>();
    FenceProxyAsync();
    __syncthreads();
    if (n_blocks > 1) load_k(1);
    load_v(0);
    CpAsyncCommit();
    WgmmaFence();
    issue_s(0);
    WgmmaWait<0>();
    FenceRegs<kNS>(s);
    softmax(0);
    rescale_o_and_pack_p();
    for (int it = 1; it < n_blocks; ++it) {
      CpAsyncWait<0>();  // K(it), V(it-1)
      FenceProxyAsync();
      __syncthreads();  // copies visible; every warpgroup is done with K(it-1) and V(it-2)
      if (it + 1 < n_blocks) load_k(it + 1);
      load_v(it);
      CpAsyncCommit();
      FenceRegs<kNO>(acc_o);
      FenceRegs<kBlockN / 4>(&a[0][0]);
      WgmmaFence();
      issue_s(it);
      issue_pv(it - 1);
      WgmmaWait<1>();  // S(it) done, P V may still run
      FenceRegs<kNS>(s);
      softmax(it);
      // ptxas hoists the wait above the softmax (no data dependence between them), which would
      // serialise softmax and P V; a warpgroup-local named barrier pins the order.
      FenceRegs<kNS>(pr);
      FenceRegs<2>(row_sum);
      NamedBarrierSync(1 + wg, 128);
      WgmmaWait<0>();
      FenceRegs<kNO>(acc_o);
      FenceRegs<kBlockN / 4>(&a[0][0]);
      rescale_o_and_pack_p();
    }
    CpAsyncWait<0>();  // V(n_blocks - 1)
    FenceProxyAsync();
    __syncthreads();
    FenceRegs<kNO>(acc_o);
    FenceRegs<kBlockN / 4>(&a[0][0]);
    WgmmaFence();
    issue_pv(n_blocks - 1);
    WgmmaWait<0>();
    FenceRegs<kNO>(acc_o);
    FenceRegs<kBlockN / 4>(&a[0][0]);
  }

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
#else
  __trap();  // only the sm_90a build carries this kernel; the launcher never picks it elsewhere
#endif
}

template <typename T, int kD, int kBlockN>
cudaError_t LaunchFwdSm90(const FwdParams& p, cudaStream_t stream) {
  using Cfg = FwdSm90Traits<kD, kBlockN>;
  auto kernel = FlashFwdSm90Kernel<T, kD, kBlockN>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>((p.m + Cfg::kBlockM - 1) / Cfg::kBlockM), p.q_heads,
                  p.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dfa::cuda
