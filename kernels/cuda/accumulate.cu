#include "kernels/cuda/accumulate.h"

namespace dfa::cuda {
namespace {

// One block per (batch, row); threads stride over heads * head_dim with float4 when aligned.
__global__ void AccumulateKernel(RowShape s, RawTensor src, RawTensor dst) {
  const int64_t br = blockIdx.x;
  const int b = static_cast<int>(br / s.rows);
  const int64_t r = br % s.rows;
  const int width = s.heads * s.head_dim;
  const float* sp = static_cast<const float*>(src.data) + b * src.batch_stride + r * src.row_stride;
  float* dp = static_cast<float*>(dst.data) + b * dst.batch_stride + r * dst.row_stride;
  const bool vec = (width % 4 == 0) && (reinterpret_cast<uintptr_t>(sp) % 16 == 0) &&
                   (reinterpret_cast<uintptr_t>(dp) % 16 == 0);
  if (vec) {
    const float4* s4 = reinterpret_cast<const float4*>(sp);
    float4* d4 = reinterpret_cast<float4*>(dp);
    for (int i = threadIdx.x; i < width / 4; i += blockDim.x) {
      float4 a = d4[i];
      const float4 c = s4[i];
      a.x += c.x; a.y += c.y; a.z += c.z; a.w += c.w;
      d4[i] = a;
    }
  } else {
    for (int i = threadIdx.x; i < width; i += blockDim.x) dp[i] += sp[i];
  }
}

}  // namespace

cudaError_t LaunchAccumulateF32(const RowShape& s, const RawTensor& src, const RawTensor& dst,
                                cudaStream_t stream) {
  const int64_t blocks = int64_t{s.batch} * s.rows;
  if (blocks == 0) return cudaSuccess;
  AccumulateKernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(s, src, dst);
  return cudaGetLastError();
}

}  // namespace dfa::cuda
