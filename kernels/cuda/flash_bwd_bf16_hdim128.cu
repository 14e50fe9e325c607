// Backward instantiation: bf16, head dim 128 (one per file so nvcc builds them in parallel).
// On sm_90 (Hopper) the wgmma kernel runs (flash_bwd_sm90.cuh, 128 key rows x 64 query rows);
// elsewhere the mma.sync one (flash_bwd_kernel.cuh).
#include "kernels/cuda/flash_bwd_kernel.cuh"
#include "kernels/cuda/flash_bwd_sm90.cuh"
#include "kernels/cuda/sm90_dispatch.h"

namespace dfa::cuda {
cudaError_t LaunchBwdBf16Hdim128(const BwdParams& p, cudaStream_t stream) {
  if (UseSm90Kernels()) return LaunchBwdSm90<__nv_bfloat16, 128>(p, stream);
  return LaunchBwd<__nv_bfloat16, 128, 64, 64, 4>(p, stream);  // kD, kBlockM, kBlockN, kNWarps
}
}  // namespace dfa::cuda
