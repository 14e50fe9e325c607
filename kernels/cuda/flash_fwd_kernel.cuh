// FlashAttention-2 style forward unit (mma.sync m16n8k16, runs on sm_80 and sm_90): the forward
// on GPUs other than Hopper (kernel_dispatch.h).
//
// One CTA computes kBlockM query rows of one (batch, query head) against all visible key
// blocks of kBlockN rows, walking them from the last to the first (the causally masked blocks
// come first, so the rest run without masks). Each warp owns 16 * kMT query rows; S = Q K^T
// stays in registers, the online softmax runs in base 2 with the scale folded into one multiply,
// and P is fed back to the tensor cores straight from the accumulators. K and V are double
// buffered in shared memory with cp.async. The epilogue writes O / l and LSE, or LSE-merges
// them into an existing fp32 partial (accumulate).
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda/flash_common.cuh"
#include "kernels/cuda/flash_params.h"
#include "kernels/cuda/mask_tiles.cuh"

namespace dfa::cuda {

template <typename T, int kD, int kBlockM, int kBlockN, int kNWarps>
struct FwdTraits {
  static constexpr int kThreads = kNWarps * 32;
  static constexpr int kMT = kBlockM / (16 * kNWarps);  // 16-row m-tiles per warp
  static constexpr int kNT = kBlockN / 8;               // 8-column n-tiles of S
  static constexpr int kDT = kD / 8;                    // 8-column n-tiles of O
  static constexpr int kSmemBytes = (kBlockM * kD + 4 * kBlockN * kD) * 2;
  static_assert(kMT >= 1 && kBlockM == kMT * 16 * kNWarps, "kBlockM must be 16 * warps * kMT");
  static_assert(kD % 64 == 0 && kBlockN % 16 == 0, "tile shapes");
};

// kIv: the kIntervals mask (mask_tiles.cuh): the key blocks come from the tile's intervals, the
// partial ones at both ends of the walk are masked per element; false compiles the dense kernel.
template <typename T, int kD, int kBlockM, int kBlockN, int kNWarps, bool kIv>
__global__ void __launch_bounds__(kNWarps * 32) FlashFwdKernel(const FwdParams p) {
  using Tr = ElemTraits<T>;
  using Cfg = FwdTraits<T, kD, kBlockM, kBlockN, kNWarps>;
  constexpr int kMT = Cfg::kMT, kNT = Cfg::kNT, kDT = Cfg::kDT, kThreads = Cfg::kThreads;
  extern __shared__ __align__(128) char smem_raw[];
  T* s_q = reinterpret_cast<T*>(smem_raw);
  T* s_k = s_q + kBlockM * kD;    // 2 stages
  T* s_v = s_k + 2 * kBlockN * kD;  // 2 stages

  const int mb = p.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;  // long rows first
  const int h = blockIdx.y, b = blockIdx.z;
  const int hk = h / (p.q_heads / p.kv_heads);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t m_begin = int64_t{mb} * kBlockM;
  const int m_valid = static_cast<int>(Min64(kBlockM, p.m - m_begin));

  int64_t n_end = p.n;  // keys [0, n_end) can be visible to this block
  if (p.causal) n_end = Min64(n_end, p.q_row0 + m_begin + m_valid - 1 - p.kv_row0 + 1);
  int n_first = 0;  // kIv: the walk's first key block (the dense walk ends at block 0)
  IvBlockRange iv_range;
  if constexpr (kIv) {
    iv_range = IvKeyBlocks(p.iv, b, p.q_row0 + m_begin, p.q_row0 + m_begin + m_valid - 1,
                           p.kv_row0, p.n, kBlockN);
    n_first = iv_range.first;
    n_end = int64_t{iv_range.count} * kBlockN;  // blocks to walk, as a key count
  }

  const T* q_g = static_cast<const T*>(p.q) + b * p.q_batch_stride + m_begin * p.q_row_stride +
                 int64_t{h} * kD;
  const T* k_g = static_cast<const T*>(p.k) + b * p.k_batch_stride + int64_t{hk} * kD;
  const T* v_g = static_cast<const T*>(p.v) + b * p.v_batch_stride + int64_t{hk} * kD;
  const float scale_log2 = p.scale * kLog2e;

  float acc_o[kMT][kDT][4];
  float row_max[kMT][2], row_sum[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) acc_o[mt][dt][0] = acc_o[mt][dt][1] = acc_o[mt][dt][2] = acc_o[mt][dt][3] = 0.f;
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }

  if (n_end > 0) {
    const int n_blocks = static_cast<int>((n_end + kBlockN - 1) / kBlockN);
    auto load_kv = [&](int nb, int stage) {
      const int64_t n0 = int64_t{nb} * kBlockN;
      const int valid = static_cast<int>(Min64(kBlockN, p.n - n0));
      LoadTile<kBlockN, kD, kThreads>(s_k + stage * kBlockN * kD, k_g + n0 * p.k_row_stride,
                                      p.k_row_stride, valid);
      LoadTile<kBlockN, kD, kThreads>(s_v + stage * kBlockN * kD, v_g + n0 * p.v_row_stride,
                                      p.v_row_stride, valid);
    };
    LoadTile<kBlockM, kD, kThreads>(s_q, q_g, p.q_row_stride, m_valid);
    load_kv(n_first + n_blocks - 1, 0);
    CpAsyncCommit();

    for (int it = 0; it < n_blocks; ++it) {
      const int nb = n_first + n_blocks - 1 - it, stage = it & 1;
      if (nb > n_first) load_kv(nb - 1, stage ^ 1);
      CpAsyncCommit();
      CpAsyncWait<1>();
      __syncthreads();
      const T* s_ks = s_k + stage * kBlockN * kD;
      const T* s_vs = s_v + stage * kBlockN * kD;

      // S = Q K^T
      float s[kMT][kNT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        uint32_t a[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) LoadA<kD>(a[mt], s_q, (warp * kMT + mt) * 16, kk * 16);
#pragma unroll
        for (int nt2 = 0; nt2 < kNT / 2; ++nt2) {
          uint32_t bk[4];
          LoadBRowsN<kD>(bk, s_ks, nt2 * 16, kk * 16);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            Tr::Mma(s[mt][2 * nt2], a[mt], bk);
            Tr::Mma(s[mt][2 * nt2 + 1], a[mt], bk + 2);
          }
        }
      }

      // Mask: keys past the unit's end, and (causal) keys after the query's position.
      const int64_t n0 = int64_t{nb} * kBlockN;
      const bool need_mask =
          kIv ? it < iv_range.top || it >= n_blocks - iv_range.bottom
              : n0 + kBlockN > p.n ||
                    (p.causal && p.kv_row0 + n0 + kBlockN - 1 > p.q_row0 + m_begin);
      if (kIv && need_mask) {  // each row's visible keys [lo, hi)
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            const int r = (warp * kMT + mt) * 16 + g + hf * 8;
            const IvRow iv_row =
                IvQueryRow(p.iv, b, p.q_row0 + m_begin + r, p.kv_row0, p.n, r < m_valid);
            const int lo = iv_row.lo - static_cast<int>(n0), hi = iv_row.hi - static_cast<int>(n0);
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int col = nt * 8 + 2 * t + e;
                if (col < lo || col >= hi) s[mt][nt][2 * hf + e] = -INFINITY;
              }
          }
      } else if (need_mask) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int64_t col = n0 + nt * 8 + 2 * t + (e & 1);
              const int64_t row = m_begin + (warp * kMT + mt) * 16 + g + (e >> 1) * 8;
              if (col >= p.n || (p.causal && p.kv_row0 + col > p.q_row0 + row)) s[mt][nt][e] = -INFINITY;
            }
      }

      // Online softmax (base 2). A row that has seen no key yet keeps max -inf and uses 0 as its
      // reference, so exp2(-inf - 0) = 0 and nothing becomes NaN.
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          float mx = row_max[mt][hf];
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
            mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hf], s[mt][nt][2 * hf + 1]) * scale_log2);
          mx = QuadMax(mx);
          const float ref = mx == -INFINITY ? 0.f : mx;
          const float corr = FastExp2(row_max[mt][hf] - ref);
          row_max[mt][hf] = mx;
          float sum = 0.f;
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float pv = FastExp2(s[mt][nt][2 * hf + e] * scale_log2 - ref);
              s[mt][nt][2 * hf + e] = pv;
              sum += pv;
            }
          row_sum[mt][hf] = row_sum[mt][hf] * corr + sum;
#pragma unroll
          for (int dt = 0; dt < kDT; ++dt) {
            acc_o[mt][dt][2 * hf] *= corr;
            acc_o[mt][dt][2 * hf + 1] *= corr;
          }
        }

      // O += P V   (P from the S accumulators, rounded to T)
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        uint32_t a[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          a[mt][0] = Tr::Pack(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          a[mt][1] = Tr::Pack(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          a[mt][2] = Tr::Pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          a[mt][3] = Tr::Pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dt2 = 0; dt2 < kDT / 2; ++dt2) {
          uint32_t bv[4];
          LoadBRowsK<kD>(bv, s_vs, kk * 16, dt2 * 16);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            Tr::Mma(acc_o[mt][2 * dt2], a[mt], bv);
            Tr::Mma(acc_o[mt][2 * dt2 + 1], a[mt], bv + 2);
          }
        }
      }
      __syncthreads();  // the next iteration's copy overwrites this stage
    }
  }

  // Epilogue: O = acc / l, LSE = max + log(l); empty rows get O = 0, LSE = -inf.
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const float l = QuadSum(row_sum[mt][hf]);
      const int r = (warp * kMT + mt) * 16 + g + hf * 8;
      if (r >= m_valid) continue;
      const int64_t row = m_begin + r;
      float lse_b = l > 0.f ? row_max[mt][hf] * kLn2 + logf(l) : -INFINITY;
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
        for (int dt = 0; dt < kDT; ++dt) {
          float2 v = make_float2(acc_o[mt][dt][2 * hf] * wb, acc_o[mt][dt][2 * hf + 1] * wb);
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
        for (int dt = 0; dt < kDT; ++dt) {
          *reinterpret_cast<uint32_t*>(o + dt * 8) =
              Tr::Pack(acc_o[mt][dt][2 * hf] * wb, acc_o[mt][dt][2 * hf + 1] * wb);
        }
      }
    }
}

template <typename T, int kD, int kBlockM, int kBlockN, int kNWarps, bool kIv = false>
cudaError_t LaunchFwd(const FwdParams& p, cudaStream_t stream) {
  using Cfg = FwdTraits<T, kD, kBlockM, kBlockN, kNWarps>;
  auto kernel = FlashFwdKernel<T, kD, kBlockM, kBlockN, kNWarps, kIv>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>((p.m + kBlockM - 1) / kBlockM), p.q_heads, p.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dfa::cuda
