// Forward launcher: bf16, head dim 64 (flash_launch.cuh). One file per
// dtype x head dim so that nvcc builds them in parallel.
#include "kernels/cuda/flash_launch.cuh"

namespace dfa::cuda {
cudaError_t LaunchFwdBf16Hdim64(const FwdParams& p, FwdKernel kernel, cudaStream_t stream) {
  return LaunchForward<__nv_bfloat16, 64>(p, kernel, stream);
}
}  // namespace dfa::cuda
