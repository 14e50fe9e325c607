// Host side of the TMA kernels: the driver's tensor-map encoder and the descriptors of the
// [batch, rows, heads, D] tensors that flash_fwd_sm90_ws.cuh and flash_bwd_sm90_pipe.cuh copy
// with cp.async.bulk.tensor. An encoder answers false where TMA cannot describe a tensor (base
// not 16-byte aligned, strides not multiples of 16 bytes, an empty tensor, a driver without
// cuTensorMapEncodeTiled); the launchers then answer cudaErrorNotSupported and the cp.async
// kernels run instead. Only included by .cu files.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace dfa::cuda {

// cuTensorMapEncodeTiled from the driver, looked up once through the runtime (no -lcuda);
// nullptr when the driver does not have it.
inline PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// Describes rows x heads x kD (2-byte elements, heads kD apart inside a row) of a [batch, rows,
// heads, kD] tensor as the 4-D tensor {kD, heads, rows, batch}; boxes are 64 x 1 x box_rows x 1
// with 128-byte swizzle (one SW128 panel). False when the driver rejects it.
template <typename T>
bool EncodeRowTensorMap(CUtensorMap* map, const void* ptr, int d, int heads, int64_t rows,
                        int batch, int64_t row_stride, int64_t batch_stride, int box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (encode == nullptr || rows <= 0) return false;
  const CUtensorMapDataType dt = std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                           : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const int64_t bstride = batch > 1 ? batch_stride : rows * row_stride;  // unused when batch 1
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(rows), static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(d) * 2,
                                 static_cast<cuuint64_t>(row_stride) * 2,
                                 static_cast<cuuint64_t>(bstride) * 2};
  const cuuint32_t box[4] = {64, 1, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  return encode(map, dt, 4, const_cast<void*>(ptr), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Describes the fp32 dq ([batch, rows, heads, kD], heads kD apart inside a row) as the 4-D
// tensor {kD, heads, rows, batch} with boxes of 32 x 1 x 64 x 1 and 128-byte swizzle (one
// staging panel). False when the driver rejects it (e.g. strides not multiples of 16 bytes).
inline bool EncodeDqTensorMap(CUtensorMap* map, float* ptr, int d, int heads, int64_t rows,
                              int batch, int64_t row_stride, int64_t batch_stride) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (encode == nullptr || rows <= 0) return false;
  const int64_t bstride = batch > 1 ? batch_stride : rows * row_stride;  // unused when batch 1
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(rows), static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(d) * 4,
                                 static_cast<cuuint64_t>(row_stride) * 4,
                                 static_cast<cuuint64_t>(bstride) * 4};
  const cuuint32_t box[4] = {32, 1, 64, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, ptr, dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace dfa::cuda
