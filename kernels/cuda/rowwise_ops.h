// Memory-bound helper kernels of the CUDA backend: D = rowsum(dO * O), LSE merge of two fp32
// partials, and dtype conversion. Plain structs in, cudaError_t out (no abseil in nvcc code).
// All pointers are device memory; strides are in elements.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dfa::cuda {

// A BSHD tensor as the helpers see it. dtype uses the values of dfa::DType (1 f32, 2 bf16, 3 f16).
struct RawTensor {
  void* data = nullptr;
  int dtype = 1;
  int64_t batch_stride = 0, row_stride = 0;
};
struct RawStat {
  float* data = nullptr;
  int64_t batch_stride = 0, head_stride = 0;
};
struct RowShape {
  int batch = 0;
  int64_t rows = 0;
  int heads = 0, head_dim = 0;
};

// delta[b, h, r] = sum_d dout[b, r, h, d] * out[b, r, h, d]
cudaError_t LaunchComputeDelta(const RowShape& s, const RawTensor& dout, const RawTensor& out,
                               const RawStat& delta, cudaStream_t stream);
// (out_a, lse_a) <- merge((out_a, lse_a), (out_b, lse_b)); outputs fp32. Empty rows (both
// LSE = -inf) get 0 and -inf.
cudaError_t LaunchMerge(const RowShape& s, const RawTensor& out_a, const RawStat& lse_a,
                        const RawTensor& out_b, const RawStat& lse_b, cudaStream_t stream);
// dst = cast(src), element by element.
cudaError_t LaunchConvert(const RowShape& s, const RawTensor& src, const RawTensor& dst,
                          cudaStream_t stream);

}  // namespace dfa::cuda
