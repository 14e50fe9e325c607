// Forward instantiation: bf16, head dim 128 (one per file so nvcc builds them in parallel).
// On sm_90 (Hopper) the warp-specialised TMA kernel runs (flash_fwd_sm90_ws.cuh: producer
// warpgroup + 2 consumer warpgroups x 64 query rows, 128-row key blocks), or the cp.async wgmma
// kernel (flash_fwd_sm90.cuh) with DFA_CUDA_FWD_WS=0 or strides TMA cannot describe; elsewhere the
// mma.sync one (4 warps x 32 query rows, 64-row key blocks).
// Tile choices measured on H200: docs/kernels-cuda.md.
#include "kernels/cuda/flash_fwd_kernel.cuh"
#include "kernels/cuda/flash_fwd_sm90.cuh"
#include "kernels/cuda/flash_fwd_sm90_ws.cuh"
#include "kernels/cuda/sm90_dispatch.h"

namespace dfa::cuda {
cudaError_t LaunchFwdBf16Hdim128(const FwdParams& p, cudaStream_t stream) {
  if (UseSm90Kernels()) {
    if (UseSm90WsForward()) {  // TMA + warp specialisation; NotSupported: strides TMA cannot map
      // 128-key blocks for both masks (FlashAttention-3's 176 for full masks measured slower).
      const cudaError_t err = LaunchFwdSm90Ws<__nv_bfloat16, 128, 128, 2>(p, stream);  // kStages 2
      if (err != cudaErrorNotSupported) return err;
    }
    return LaunchFwdSm90<__nv_bfloat16, 128, 128>(p, stream);  // kD, kBlockN
  }
  return LaunchFwd<__nv_bfloat16, 128, 128, 64, 4>(p, stream);  // kD, kBlockM, kBlockN, kNWarps
}
}  // namespace dfa::cuda
