// Forward instantiation: bf16, head dim 64 (one per file so nvcc builds them in parallel).
// Tile choice measured on H200 (docs/kernels-cuda.md): 4 warps x 32 query rows each.
#include "kernels/cuda/flash_fwd_kernel.cuh"

namespace dfa::cuda {
cudaError_t LaunchFwdBf16Hdim64(const FwdParams& p, cudaStream_t stream) {
  return LaunchFwd<__nv_bfloat16, 64, 128, 64, 4>(p, stream);  // kD, kBlockM, kBlockN, kNWarps
}
}  // namespace dfa::cuda
