// Forward instantiation: bf16, head dim 128 (one per file so nvcc builds them in parallel).
#include "kernels/cuda/flash_fwd_kernel.cuh"

namespace dfa::cuda {
cudaError_t LaunchFwdBf16Hdim128(const FwdParams& p, cudaStream_t stream) {
  return LaunchFwd<__nv_bfloat16, 128, 128, 64, 8>(p, stream);  // kD, kBlockM, kBlockN, kNWarps
}
}  // namespace dfa::cuda
