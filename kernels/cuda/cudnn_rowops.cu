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

int Blocks(int64_t total) {
  const int64_t b = (total + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

}  // namespace

cudaError_t LaunchAddInto(const RowsShape& s, const RowsView& src, const RowsView& dst, cudaStream_t stream) {
  const int64_t total = int64_t{s.batch} * s.rows * s.heads * s.head_dim;
  if (total == 0) return cudaSuccess;
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

}  // namespace dfa::cudnn
