// Forward launcher: f16, head dim 128 (flash_launch.cuh). One file per
// dtype x head dim so that nvcc builds them in parallel.
#include "kernels/cuda/flash_launch.cuh"

namespace dfa::cuda {
cudaError_t LaunchFwdF16Hdim128(const FwdParams& p, FwdKernel kernel, cudaStream_t stream) {
  return LaunchForward<__half, 128>(p, kernel, stream);
}
}  // namespace dfa::cuda
