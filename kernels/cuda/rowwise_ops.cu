// Row-wise helper kernels (see rowwise_ops.h). One warp per (batch, row, head) row of head_dim
// elements for the reductions; one thread per element for conversion.
#include "kernels/cuda/rowwise_ops.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

namespace dfa::cuda {
namespace {

__device__ inline float LoadF(const void* p, int dtype, int64_t i) {
  if (dtype == 1) return static_cast<const float*>(p)[i];
  if (dtype == 2) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return __half2float(static_cast<const __half*>(p)[i]);
}
__device__ inline void StoreF(void* p, int dtype, int64_t i, float v) {
  if (dtype == 1) {
    static_cast<float*>(p)[i] = v;
  } else if (dtype == 2) {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  } else {
    static_cast<__half*>(p)[i] = __float2half_rn(v);
  }
}

constexpr int kWarpsPerBlock = 8;

// Decodes the warp's row index into (b, r, h); false when past the end.
__device__ inline bool WarpRow(const RowShape& s, int64_t* b, int64_t* r, int* h) {
  const int64_t w = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  if (w >= int64_t{s.batch} * s.rows * s.heads) return false;
  *h = static_cast<int>(w % s.heads);
  *r = (w / s.heads) % s.rows;
  *b = w / (s.heads * s.rows);
  return true;
}

__global__ void DeltaKernel(const RowShape s, const RawTensor dout, const RawTensor out,
                            const RawStat delta) {
  int64_t b, r;
  int h;
  if (!WarpRow(s, &b, &r, &h)) return;
  const int lane = threadIdx.x & 31;
  const int64_t o_do = b * dout.batch_stride + r * dout.row_stride + int64_t{h} * s.head_dim;
  const int64_t o_o = b * out.batch_stride + r * out.row_stride + int64_t{h} * s.head_dim;
  float acc = 0.f;
  for (int d = lane; d < s.head_dim; d += 32) {
    acc += LoadF(dout.data, dout.dtype, o_do + d) * LoadF(out.data, out.dtype, o_o + d);
  }
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) delta.data[b * delta.batch_stride + h * delta.head_stride + r] = acc;
}

// The same for 16-bit dout and out (bf16: dtype 2, fp16: 3) of head_dim 128 at 8-byte aligned
// addresses: one 8-byte load of each per lane, and rows fastest across warps, so that the warps
// of a block write consecutive delta entries ([B, H, S] layout) instead of one per head apart.
// (The generic kernel above ran at ~1 TB/s: 2-byte loads, scattered 4-byte stores.)
template <int kDtype>
__global__ void Delta16x128Kernel(const RowShape s, const RawTensor dout, const RawTensor out,
                                  const RawStat delta) {
  const int64_t w = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  if (w >= int64_t{s.batch} * s.rows * s.heads) return;
  const int64_t r = w % s.rows;
  const int64_t bh = w / s.rows;
  const int h = static_cast<int>(bh % s.heads);
  const int64_t b = bh / s.heads;
  const int lane = threadIdx.x & 31;
  const int64_t o_do = b * dout.batch_stride + r * dout.row_stride + int64_t{h} * 128 + lane * 4;
  const int64_t o_o = b * out.batch_stride + r * out.row_stride + int64_t{h} * 128 + lane * 4;
  const uint2 x = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(dout.data) + o_do);
  const uint2 y = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(out.data) + o_o);
  float acc = 0.f;
  const uint32_t xs[2] = {x.x, x.y}, ys[2] = {y.x, y.y};
  for (int i = 0; i < 2; ++i) {
    float2 a, c;
    if constexpr (kDtype == 2) {
      a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&xs[i]));
      c = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&ys[i]));
    } else {
      a = __half22float2(*reinterpret_cast<const __half2*>(&xs[i]));
      c = __half22float2(*reinterpret_cast<const __half2*>(&ys[i]));
    }
    acc += a.x * c.x + a.y * c.y;
  }
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) delta.data[b * delta.batch_stride + h * delta.head_stride + r] = acc;
}

bool Aligned8(const RawTensor& t) {
  // Every row's head starts 8-byte aligned: base, row and batch strides (in 2-byte elements).
  return reinterpret_cast<uintptr_t>(t.data) % 8 == 0 && t.row_stride % 4 == 0 &&
         t.batch_stride % 4 == 0;
}

__global__ void MergeKernel(const RowShape s, const RawTensor a, const RawStat la,
                            const RawTensor bt, const RawStat lb) {
  int64_t b, r;
  int h;
  if (!WarpRow(s, &b, &r, &h)) return;
  const int lane = threadIdx.x & 31;
  float* lse_a = la.data + b * la.batch_stride + h * la.head_stride + r;
  const float lse_b = lb.data[b * lb.batch_stride + h * lb.head_stride + r];
  const float l_a = *lse_a;
  const float mx = fmaxf(l_a, lse_b);
  float wa = 0.f, wb = 0.f, lse = -INFINITY;
  if (mx != -INFINITY) {
    const float ea = expf(l_a - mx), eb = expf(lse_b - mx);
    wa = ea / (ea + eb);
    wb = eb / (ea + eb);
    lse = mx + logf(ea + eb);
  }
  float* oa = static_cast<float*>(a.data) + b * a.batch_stride + r * a.row_stride + int64_t{h} * s.head_dim;
  const float* ob = static_cast<const float*>(bt.data) + b * bt.batch_stride + r * bt.row_stride +
                    int64_t{h} * s.head_dim;
  for (int d = lane; d < s.head_dim; d += 32) oa[d] = wa * oa[d] + wb * ob[d];
  __syncwarp();
  if (lane == 0) *lse_a = lse;
}

__global__ void ConvertKernel(const RowShape s, const RawTensor src, const RawTensor dst) {
  const int64_t total = int64_t{s.batch} * s.rows * s.heads * s.head_dim;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t hd = i % (int64_t{s.heads} * s.head_dim);
    const int64_t r = (i / (int64_t{s.heads} * s.head_dim)) % s.rows;
    const int64_t b = i / (int64_t{s.heads} * s.head_dim * s.rows);
    StoreF(dst.data, dst.dtype, b * dst.batch_stride + r * dst.row_stride + hd,
           LoadF(src.data, src.dtype, b * src.batch_stride + r * src.row_stride + hd));
  }
}

// Rows of at least kMinRowElements elements: a 2-D grid (row, column) so that no element pays
// for 64-bit divisions (the flat kernel above spent most of its time on them: 0.18 ms for 8K
// rows of 32 x 128 fp32 -> bf16, about 4x the memory time on an H200).
constexpr int kMinRowElements = 64;

__global__ void ConvertRowsKernel(const RowShape s, const RawTensor src, const RawTensor dst) {
  const int64_t rows = int64_t{s.batch} * s.rows;
  const int hd = s.heads * s.head_dim;
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const int64_t b = row / s.rows, r = row - b * s.rows;
    const int64_t so = b * src.batch_stride + r * src.row_stride;
    const int64_t dso = b * dst.batch_stride + r * dst.row_stride;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < hd; c += gridDim.x * blockDim.x) {
      StoreF(dst.data, dst.dtype, dso + c, LoadF(src.data, src.dtype, so + c));
    }
  }
}

unsigned RowBlocks(const RowShape& s) {
  const int64_t rows = int64_t{s.batch} * s.rows * s.heads;
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

cudaError_t LaunchComputeDelta(const RowShape& s, const RawTensor& dout, const RawTensor& out,
                               const RawStat& delta, cudaStream_t stream) {
  if (RowBlocks(s) == 0) return cudaSuccess;
  if (s.head_dim == 128 && dout.dtype == out.dtype && (dout.dtype == 2 || dout.dtype == 3) &&
      Aligned8(dout) && Aligned8(out)) {
    if (dout.dtype == 2) {
      Delta16x128Kernel<2><<<RowBlocks(s), kWarpsPerBlock * 32, 0, stream>>>(s, dout, out, delta);
    } else {
      Delta16x128Kernel<3><<<RowBlocks(s), kWarpsPerBlock * 32, 0, stream>>>(s, dout, out, delta);
    }
    return cudaGetLastError();
  }
  DeltaKernel<<<RowBlocks(s), kWarpsPerBlock * 32, 0, stream>>>(s, dout, out, delta);
  return cudaGetLastError();
}

cudaError_t LaunchMerge(const RowShape& s, const RawTensor& out_a, const RawStat& lse_a,
                        const RawTensor& out_b, const RawStat& lse_b, cudaStream_t stream) {
  if (RowBlocks(s) == 0) return cudaSuccess;
  MergeKernel<<<RowBlocks(s), kWarpsPerBlock * 32, 0, stream>>>(s, out_a, lse_a, out_b, lse_b);
  return cudaGetLastError();
}

cudaError_t LaunchConvert(const RowShape& s, const RawTensor& src, const RawTensor& dst,
                          cudaStream_t stream) {
  const int64_t total = int64_t{s.batch} * s.rows * s.heads * s.head_dim;
  if (total == 0) return cudaSuccess;
  const int hd = s.heads * s.head_dim;
  if (hd >= kMinRowElements) {
    const int64_t rows = int64_t{s.batch} * s.rows;
    const dim3 grid(static_cast<unsigned>((hd + 255) / 256),
                    static_cast<unsigned>(rows < 65535 ? rows : 65535));
    ConvertRowsKernel<<<grid, 256, 0, stream>>>(s, src, dst);
    return cudaGetLastError();
  }
  const int64_t blocks = (total + 255) / 256;
  ConvertKernel<<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(s, src, dst);
  return cudaGetLastError();
}

}  // namespace dfa::cuda
