// Memory-bound helpers of the cuDNN backend (kernels/cuda/cudnn_backend.cc), kept apart from the
// CUDA backend's own kernels: adding a 2-byte gradient partial into an fp32 accumulator, and
// marking query rows that see no key. Plain structs in, cudaError_t out (no abseil in nvcc code).
// All pointers are device memory; strides are in elements; work is queued on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dfa::cudnn {

// Rows of a BSHD tensor: element (b, r, h, d) at data[b * batch_stride + r * row_stride + h * head_dim + d].
// dtype uses dfa::DType's values (1 f32, 2 bf16, 3 f16).
struct RowsView {
  void* data = nullptr;
  int dtype = 1;
  int64_t batch_stride = 0, row_stride = 0;
};
struct RowsShape {
  int batch = 0;
  int64_t rows = 0;
  int heads = 0, head_dim = 0;
};

// dst += src element by element; dst is fp32, src bf16 or f16 (or fp32).
cudaError_t LaunchAddInto(const RowsShape& s, const RowsView& src, const RowsView& dst, cudaStream_t stream);

// (out, lse) <- LSE-merge((out, lse), (part, part_lse)): out fp32, part bf16/f16/f32, both LSE
// fp32 BHS (natural log). Rows where both LSE are -inf get 0 and -inf. One fused pass.
cudaError_t LaunchMergeInto(const RowsShape& s, const RowsView& part, const float* part_lse, int64_t part_lse_bs,
                            int64_t part_lse_hs, const RowsView& out, float* lse, int64_t lse_bs, int64_t lse_hs,
                            cudaStream_t stream);

// A stand-in for the final O when only D = rowsum(dO * O) is known: o = round(c * dout) with
// c = delta / rowsum(dout^2) per (b, r, h) row (0 when dout's row is 0), so rowsum(dout * o) =
// delta up to the rounding of o (relative 2^-9 / sqrt(head_dim) in bf16, like rounding the real
// O), and |o| <= |O| row-wise (Cauchy-Schwarz), so it cannot overflow f16 where O does not.
// dout and o: bf16/f16 of one dtype; delta fp32 BHS.
cudaError_t LaunchOutFromDelta(const RowsShape& s, const RowsView& dout, const float* delta, int64_t delta_bs,
                               int64_t delta_hs, const RowsView& o, cudaStream_t stream);

// For rows [0, s.rows): out = 0 (any dtype) and lse[b, h, r] = -inf (lse fp32, BHS strides).
cudaError_t LaunchMarkEmptyRows(const RowsShape& s, const RowsView& out, float* lse, int64_t lse_batch_stride,
                                int64_t lse_head_stride, cudaStream_t stream);

}  // namespace dfa::cudnn
