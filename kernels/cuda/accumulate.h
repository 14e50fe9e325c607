// dst += src for fp32 BSHD views on the device (gradient partials arriving from peers).
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/rowwise_ops.h"

namespace dfa::cuda {

cudaError_t LaunchAccumulateF32(const RowShape& s, const RawTensor& src, const RawTensor& dst,
                                cudaStream_t stream);

}  // namespace dfa::cuda
