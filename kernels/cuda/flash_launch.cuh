// The launch of one forward or backward unit on the kernel that the table of kernel_dispatch.h
// chose: the eight flash_{fwd,bwd}_{bf16,f16}_hdim{64,128}.cu files instantiate these (one per
// file so nvcc builds them in parallel). The TMA kernels answer cudaErrorNotSupported, with
// nothing queued, where TMA cannot describe a tensor; the cp.async kernels then run.
// The kIntervals mask (p.iv.on) runs on instantiations of its own (a template flag: the dense
// ones compile to the dense kernels): the TMA forward, the pipe backward and the mma.sync pair;
// the sm90 cp.async kernels have none, their place is taken by the mma.sync kernels.
// Tile choices and their measurements: docs/kernels-cuda.md.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/flash_bwd_kernel.cuh"
#include "kernels/cuda/flash_bwd_sm90.cuh"
#include "kernels/cuda/flash_bwd_sm90_pipe.cuh"
#include "kernels/cuda/flash_fwd_kernel.cuh"
#include "kernels/cuda/flash_fwd_sm90.cuh"
#include "kernels/cuda/flash_fwd_sm90_ws.cuh"
#include "kernels/cuda/flash_params.h"
#include "kernels/cuda/kernel_dispatch.h"

namespace dfa::cuda {

template <typename T, int kD>
cudaError_t LaunchForward(const FwdParams& p, FwdKernel kernel, cudaStream_t stream) {
  if (p.iv.on) {
    if (kernel == FwdKernel::kSm90Tma) {
      const cudaError_t err =
          LaunchFwdSm90Ws<T, kD, 128, 2, Sm90TmaForwardConsumers(kD), true>(p, stream);
      if (err != cudaErrorNotSupported) return err;
    }
    return LaunchFwd<T, kD, 128, 64, 4, true>(p, stream);
  }
  if (kernel == FwdKernel::kSm90Tma) {
    // 128-key blocks for both masks, 2 stages; 64 x Sm90TmaForwardConsumers(kD) query rows.
    const cudaError_t err =
        LaunchFwdSm90Ws<T, kD, 128, 2, Sm90TmaForwardConsumers(kD)>(p, stream);
    if (err != cudaErrorNotSupported) return err;
    kernel = FwdKernel::kSm90CpAsync;
  }
  if (kernel == FwdKernel::kSm90CpAsync) return LaunchFwdSm90<T, kD, 128>(p, stream);  // kBlockN
  return LaunchFwd<T, kD, 128, 64, 4>(p, stream);  // kBlockM, kBlockN, kNWarps
}

template <typename T, int kD>
cudaError_t LaunchBackward(const BwdParams& p, const BwdPlan& plan, cudaStream_t stream) {
  BwdKernel kernel = plan.kernel;
  if (p.iv.on) {
    if (kernel == BwdKernel::kSm90Pipe) {
      const cudaError_t err = LaunchBwdSm90Pipe<T, kD, true>(p, 0, stream);
      if (err != cudaErrorNotSupported) return err;
    }
    return LaunchBwd<T, kD, 64, 64, 4, true>(p, stream);
  }
  if (kernel == BwdKernel::kSm90Pipe) {
    const cudaError_t err = LaunchBwdSm90Pipe<T, kD>(p, plan.tile_chunk, stream);
    if (err != cudaErrorNotSupported) return err;
    kernel = BwdKernel::kSm90CpAsync;
  }
  if (kernel == BwdKernel::kSm90CpAsync) return LaunchBwdSm90<T, kD>(p, stream);
  return LaunchBwd<T, kD, 64, 64, 4>(p, stream);  // kBlockM, kBlockN, kNWarps
}

}  // namespace dfa::cuda
