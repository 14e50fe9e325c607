// Backward instantiation: f16, head dim 64 (one per file so nvcc builds them in parallel).
#include "kernels/cuda/flash_bwd_kernel.cuh"

namespace dfa::cuda {
cudaError_t LaunchBwdF16Hdim64(const BwdParams& p, cudaStream_t stream) {
  return LaunchBwd<__half, 64, 64, 64, 4>(p, stream);  // kD, kBlockM, kBlockN, kNWarps
}
}  // namespace dfa::cuda
