// The dK, dV epilogue of the Hopper backward kernels (flash_bwd_sm90.cuh,
// flash_bwd_sm90_pipe.cuh): a consumer thread adds its two key rows of the CTA's dK (times the
// scale) and dV accumulators (wgmma m64 x kD layout: accumulator 4 * dt + 2 * hf + {0, 1} = row
// key_base + 8 * hf, columns dt * 8 + 2t + {0, 1}) to the fp32 dk, dv. The CTA owns these rows
// exclusively; either way does one fp32 add per element.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/flash_params.h"

namespace dfa::cuda {

// How the tile is added: kBatched issues every load of a row first, then the adds and stores
// (one global round trip per row; the cp.async kernel); kReduce adds with float2 reductions
// (red.global.add.v2.f32, flushes fp32 denormals; nothing is waited for; the pipe kernel).
enum class BwdEpilogue { kBatched, kReduce };

// float2 atomicAdd (red.global.add.v2.f32) exists from sm_90 on; kReduce adds as kBatched before.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr bool kBwdHasVectorReduce = true;
#else
constexpr bool kBwdHasVectorReduce = false;
#endif

template <int kD, BwdEpilogue kHow>
__device__ __forceinline__ void AddDkDvRows(const BwdParams& p, const float* acc_dk,
                                            const float* acc_dv, int hk, int b, int64_t n_begin,
                                            int n_valid, int key_base, int t) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int nl = key_base + hf * 8;
    if (nl >= n_valid) continue;
    float* dk =
        p.dk + b * p.dk_batch_stride + (n_begin + nl) * p.dk_row_stride + int64_t{hk} * kD + 2 * t;
    float* dv =
        p.dv + b * p.dv_batch_stride + (n_begin + nl) * p.dv_row_stride + int64_t{hk} * kD + 2 * t;
    if constexpr (kHow == BwdEpilogue::kReduce && kBwdHasVectorReduce) {
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt) {
        atomicAdd(
            reinterpret_cast<float2*>(dk + dt * 8),
            make_float2(acc_dk[4 * dt + 2 * hf] * p.scale, acc_dk[4 * dt + 2 * hf + 1] * p.scale));
        atomicAdd(reinterpret_cast<float2*>(dv + dt * 8),
                  make_float2(acc_dv[4 * dt + 2 * hf], acc_dv[4 * dt + 2 * hf + 1]));
      }
    } else {
      float2 k2[kD / 8], v2[kD / 8];
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt) {
        k2[dt] = *reinterpret_cast<const float2*>(dk + dt * 8);
        v2[dt] = *reinterpret_cast<const float2*>(dv + dt * 8);
      }
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt) {
        k2[dt].x += acc_dk[4 * dt + 2 * hf] * p.scale;
        k2[dt].y += acc_dk[4 * dt + 2 * hf + 1] * p.scale;
        v2[dt].x += acc_dv[4 * dt + 2 * hf];
        v2[dt].y += acc_dv[4 * dt + 2 * hf + 1];
        *reinterpret_cast<float2*>(dk + dt * 8) = k2[dt];
        *reinterpret_cast<float2*>(dv + dt * 8) = v2[dt];
      }
    }
  }
}

}  // namespace dfa::cuda
