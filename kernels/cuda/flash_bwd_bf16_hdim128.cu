// Backward launcher: bf16, head dim 128 (flash_launch.cuh). One file per
// dtype x head dim so that nvcc builds them in parallel.
#include "kernels/cuda/flash_launch.cuh"

namespace dfa::cuda {
cudaError_t LaunchBwdBf16Hdim128(const BwdParams& p, const BwdPlan& plan, cudaStream_t stream) {
  return LaunchBackward<__nv_bfloat16, 128>(p, plan, stream);
}
}  // namespace dfa::cuda
