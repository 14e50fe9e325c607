// Forward launcher: bf16, head dim 128 (flash_launch.cuh). One file per
// dtype x head dim so that nvcc builds them in parallel.
#include "kernels/cuda/flash_launch.cuh"

namespace dfa::cuda {
cudaError_t LaunchFwdBf16Hdim128(const FwdParams& p, FwdKernel kernel, cudaStream_t stream) {
  return LaunchForward<__nv_bfloat16, 128>(p, kernel, stream);
}
}  // namespace dfa::cuda
