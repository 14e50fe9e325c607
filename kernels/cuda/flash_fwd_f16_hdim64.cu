// Forward instantiation: f16, head dim 64 (one per file so nvcc builds them in parallel).
#include "kernels/cuda/flash_fwd_kernel.cuh"

namespace dfa::cuda {
cudaError_t LaunchFwdF16Hdim64(const FwdParams& p, cudaStream_t stream) {
  return LaunchFwd<__half, 64, 128, 128, 8>(p, stream);  // kD, kBlockM, kBlockN, kNWarps
}
}  // namespace dfa::cuda
