// Helpers of the cuDNN backend (see cudnn_rowops.h): one thread per element, grid-stride.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "kernels/cuda/cudnn_rowops.h"

namespace dfa::cudnn {
namespace {

constexpr int kThreads = 256;

__device__ inline float Load(const void* p, int dtype, int64_t i) {
  if (dtype == 1) return static_cast<const float*>(p)[i];
  if (dtype == 2) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return __half2float(static_cast<const __half*>(p)[i]);
}

__device__ inline void StoreZero(void* p, int dtype, int64_t i) {
  if (dtype == 1) {
    static_cast<float*>(p)[i] = 0.f;
  } else {
    static_cast<uint16_t*>(p)[i] = 0;  // +0 in bf16 and f16
  }
}

// Element e of the shape -> offset in a view with the given strides.
__device__ inline int64_t Offset(const RowsShape& s, const RowsView& v, int64_t e) {
  const int64_t row_elems = int64_t{s.heads} * s.head_dim;
  const int64_t in_row = e % row_elems;
  const int64_t r = (e / row_elems) % s.rows;
  const int64_t b = e / (row_elems * s.rows);
  return b * v.batch_stride + r * v.row_stride + in_row;
}

__global__ void AddIntoKernel(const RowsShape s, const RowsView src, const RowsView dst, int64_t total) {
  for (int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    static_cast<float*>(dst.data)[Offset(s, dst, e)] += Load(src.data, src.dtype, Offset(s, src, e));
  }
}

__global__ void MarkEmptyKernel(const RowsShape s, const RowsView out, float* lse, int64_t lse_bs,
                                int64_t lse_hs, int64_t total) {
  const int64_t lse_total = int64_t{s.batch} * s.heads * s.rows;
  for (int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    StoreZero(out.data, out.dtype, Offset(s, out, e));
    if (e < lse_total) {  // e = (b * heads + h) * rows + r
      const int64_t r = e % s.rows;
      const int64_t h = (e / s.rows) % s.heads;
      const int64_t b = e / (s.rows * s.heads);
      lse[b * lse_bs + h * lse_hs + r] = -INFINITY;
    }
  }
}

// Vectorised += for the common case: 4 contiguous elements per thread, one (b, r) row per
// blockIdx.y, 16-byte aligned fp32 rows and 8-byte aligned 2-byte rows.
template <typename T>
__global__ void AddIntoVec4Kernel(const RowsShape s, const RowsView src, const RowsView dst) {
  const int64_t row = blockIdx.y + int64_t{blockIdx.z} * 65535;
  if (row >= int64_t{s.batch} * s.rows) return;
  const int64_t b = row / s.rows, r = row % s.rows;
  const int row_elems = s.heads * s.head_dim;
  const int e = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
  if (e >= row_elems) return;
  float4* d = reinterpret_cast<float4*>(static_cast<float*>(dst.data) + b * dst.batch_stride + r * dst.row_stride + e);
  float4 acc = *d;
  const T* sp = static_cast<const T*>(src.data) + b * src.batch_stride + r * src.row_stride + e;
  float x[4];
  if constexpr (sizeof(T) == 4) {
    const float4 v = *reinterpret_cast<const float4*>(sp);
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
  } else {
    union {
      uint2 u;
      T h[4];
    } v;
    v.u = *reinterpret_cast<const uint2*>(sp);
    for (int i = 0; i < 4; ++i) x[i] = static_cast<float>(v.h[i]);
  }
  acc.x += x[0], acc.y += x[1], acc.z += x[2], acc.w += x[3];
  *d = acc;
}

// One warp per (b, r, h) row of head_dim elements.
__global__ void MergeIntoKernel(const RowsShape s, const RowsView part, const float* part_lse, int64_t plbs,
                                int64_t plhs, const RowsView out, float* lse, int64_t lbs, int64_t lhs) {
  const int64_t w = int64_t{blockIdx.x} * (blockDim.x / 32) + threadIdx.x / 32;
  if (w >= int64_t{s.batch} * s.rows * s.heads) return;
  const int64_t h = w % s.heads, r = (w / s.heads) % s.rows, b = w / (s.heads * s.rows);
  const int lane = threadIdx.x & 31;
  float* l_a = lse + b * lbs + h * lhs + r;
  const float la = *l_a, lb = part_lse[b * plbs + h * plhs + r];
  const float mx = fmaxf(la, lb);
  float* o = static_cast<float*>(out.data) + b * out.batch_stride + r * out.row_stride + h * s.head_dim;
  const int64_t po = b * part.batch_stride + r * part.row_stride + h * s.head_dim;
  if (mx == -INFINITY) {
    for (int d = lane; d < s.head_dim; d += 32) o[d] = 0.f;
    if (lane == 0) *l_a = -INFINITY;
    return;
  }
  const float wa = expf(la - mx), wb = expf(lb - mx), inv = 1.f / (wa + wb);
  for (int d = lane; d < s.head_dim; d += 32) {
    const float a = wa == 0.f ? 0.f : o[d];  // an empty partial's output is never read
    const float p = wb == 0.f ? 0.f : Load(part.data, part.dtype, po + d);
    o[d] = (a * wa + p * wb) * inv;
  }
  __syncwarp();
  if (lane == 0) *l_a = mx + logf(wa + wb);
}

// One warp per (b, r, h) row: sum of squares, then the scaled copy.
template <typename T>
__global__ void OutFromDeltaKernel(const RowsShape s, const RowsView dout, const float* delta, int64_t dbs,
                                   int64_t dhs, const RowsView o) {
  const int64_t w = int64_t{blockIdx.x} * (blockDim.x / 32) + threadIdx.x / 32;
  if (w >= int64_t{s.batch} * s.rows * s.heads) return;
  const int64_t h = w % s.heads, r = (w / s.heads) % s.rows, b = w / (s.heads * s.rows);
  const int lane = threadIdx.x & 31;
  const T* src = static_cast<const T*>(dout.data) + b * dout.batch_stride + r * dout.row_stride + h * s.head_dim;
  T* dst = static_cast<T*>(o.data) + b * o.batch_stride + r * o.row_stride + h * s.head_dim;
  float sq = 0.f;
  for (int d = lane; d < s.head_dim; d += 32) {
    const float x = static_cast<float>(src[d]);
    sq += x * x;
  }
  for (int off = 16; off > 0; off >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, off);
  const float c = sq > 0.f ? delta[b * dbs + h * dhs + r] / sq : 0.f;
  for (int d = lane; d < s.head_dim; d += 32) dst[d] = static_cast<T>(c * static_cast<float>(src[d]));
}

int Blocks(int64_t total) {
  const int64_t b = (total + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

}  // namespace

cudaError_t LaunchAddInto(const RowsShape& s, const RowsView& src, const RowsView& dst, cudaStream_t stream) {
  const int64_t total = int64_t{s.batch} * s.rows * s.heads * s.head_dim;
  if (total == 0) return cudaSuccess;
  const int row_elems = s.heads * s.head_dim;
  const bool vec = row_elems % 4 == 0 && reinterpret_cast<uintptr_t>(dst.data) % 16 == 0 &&
                   dst.row_stride % 4 == 0 && dst.batch_stride % 4 == 0 &&
                   reinterpret_cast<uintptr_t>(src.data) % (src.dtype == 1 ? 16 : 8) == 0 &&
                   src.row_stride % 4 == 0 && src.batch_stride % 4 == 0;
  const int64_t rows = int64_t{s.batch} * s.rows;
  if (vec && rows <= int64_t{65535} * 65535) {
    const dim3 grid((row_elems / 4 + 127) / 128, static_cast<unsigned>(rows < 65535 ? rows : 65535),
                    static_cast<unsigned>((rows + 65534) / 65535));
    if (src.dtype == 1) {
      AddIntoVec4Kernel<float><<<grid, 128, 0, stream>>>(s, src, dst);
    } else if (src.dtype == 2) {
      AddIntoVec4Kernel<__nv_bfloat16><<<grid, 128, 0, stream>>>(s, src, dst);
    } else {
      AddIntoVec4Kernel<__half><<<grid, 128, 0, stream>>>(s, src, dst);
    }
    return cudaGetLastError();
  }
  AddIntoKernel<<<Blocks(total), kThreads, 0, stream>>>(s, src, dst, total);
  return cudaGetLastError();
}

cudaError_t LaunchMarkEmptyRows(const RowsShape& s, const RowsView& out, float* lse, int64_t lse_batch_stride,
                                int64_t lse_head_stride, cudaStream_t stream) {
  const int64_t total = int64_t{s.batch} * s.rows * s.heads * s.head_dim;  // >= lse elements
  if (total == 0) return cudaSuccess;
  MarkEmptyKernel<<<Blocks(total), kThreads, 0, stream>>>(s, out, lse, lse_batch_stride, lse_head_stride, total);
  return cudaGetLastError();
}

cudaError_t LaunchMergeInto(const RowsShape& s, const RowsView& part, const float* part_lse, int64_t part_lse_bs,
                            int64_t part_lse_hs, const RowsView& out, float* lse, int64_t lse_bs, int64_t lse_hs,
                            cudaStream_t stream) {
  const int64_t warps = int64_t{s.batch} * s.rows * s.heads;
  if (warps == 0) return cudaSuccess;
  MergeIntoKernel<<<static_cast<unsigned>((warps + 7) / 8), 256, 0, stream>>>(s, part, part_lse, part_lse_bs,
                                                                             part_lse_hs, out, lse, lse_bs, lse_hs);
  return cudaGetLastError();
}

cudaError_t LaunchOutFromDelta(const RowsShape& s, const RowsView& dout, const float* delta, int64_t delta_bs,
                               int64_t delta_hs, const RowsView& o, cudaStream_t stream) {
  const int64_t warps = int64_t{s.batch} * s.rows * s.heads;
  if (warps == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((warps + 7) / 8);
  if (dout.dtype == 2) {
    OutFromDeltaKernel<__nv_bfloat16><<<blocks, 256, 0, stream>>>(s, dout, delta, delta_bs, delta_hs, o);
  } else {
    OutFromDeltaKernel<__half><<<blocks, 256, 0, stream>>>(s, dout, delta, delta_bs, delta_hs, o);
  }
  return cudaGetLastError();
}

}  // namespace dfa::cudnn
