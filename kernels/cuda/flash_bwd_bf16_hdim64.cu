// Backward launcher: bf16, head dim 64 (flash_launch.cuh). One file per
// dtype x head dim so that nvcc builds them in parallel.
#include "kernels/cuda/flash_launch.cuh"

namespace dfa::cuda {
cudaError_t LaunchBwdBf16Hdim64(const BwdParams& p, const BwdPlan& plan, cudaStream_t stream) {
  return LaunchBackward<__nv_bfloat16, 64>(p, plan, stream);
}
}  // namespace dfa::cuda
