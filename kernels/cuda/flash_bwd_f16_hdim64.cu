// Backward launcher: f16, head dim 64 (flash_launch.cuh). One file per
// dtype x head dim so that nvcc builds them in parallel.
#include "kernels/cuda/flash_launch.cuh"

namespace dfa::cuda {
cudaError_t LaunchBwdF16Hdim64(const BwdParams& p, const BwdPlan& plan, cudaStream_t stream) {
  return LaunchBackward<__half, 64>(p, plan, stream);
}
}  // namespace dfa::cuda
