// Backward instantiation: bf16, head dim 128 (one per file so nvcc builds them in parallel).
// On sm_90 (Hopper): the warp-specialised TMA "pipe" kernel (flash_bwd_sm90_pipe.cuh, mode per
// head dim: Sm90BwdPipeMode in sm90_dispatch.h), or with mode 0 the atomic-dQ TMA
// kernel (flash_bwd_sm90_ws.cuh); the cp.async wgmma kernel (flash_bwd_sm90.cuh) with
// DFA_CUDA_BWD_WS=0 or where TMA cannot describe the tensors; elsewhere the mma.sync one
// (flash_bwd_kernel.cuh).
#include "kernels/cuda/flash_bwd_kernel.cuh"
#include "kernels/cuda/flash_bwd_sm90.cuh"
#include "kernels/cuda/flash_bwd_sm90_pipe.cuh"
#include "kernels/cuda/flash_bwd_sm90_ws.cuh"
#include "kernels/cuda/sm90_dispatch.h"

namespace dfa::cuda {
cudaError_t LaunchBwdBf16Hdim128(const BwdParams& p, cudaStream_t stream) {
  if (UseSm90Kernels()) {
    if (UseSm90WsBackward()) {  // TMA + warp specialisation; NotSupported: strides TMA cannot map
      // Pipe kernel (dQ added by writer warps with TMA); NotSupported: tensors TMA cannot map.
      if (const int mode = Sm90BwdPipeMode(128); mode > 0) {
        const cudaError_t err = LaunchBwdSm90Pipe<__nv_bfloat16, 128>(p, mode, stream);
        if (err != cudaErrorNotSupported) return err;
      }
      const cudaError_t err = LaunchBwdSm90Ws<__nv_bfloat16, 128>(p, stream);
      if (err != cudaErrorNotSupported) return err;
    }
    return LaunchBwdSm90<__nv_bfloat16, 128>(p, stream);
  }
  return LaunchBwd<__nv_bfloat16, 128, 64, 64, 4>(p, stream);  // kD, kBlockM, kBlockN, kNWarps
}
}  // namespace dfa::cuda
