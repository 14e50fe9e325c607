// Drivers of the CPU forward and backward units: pack the inputs, run the per-ISA kernel tasks
// on the pool, write the results back into the caller's tensors. Arguments must already have
// passed ValidateForward / ValidateBackward; host memory only.
#pragma once

#include "kernels/attention_backend.h"
#include "kernels/cpu/kernel_params.h"
#include "kernels/cpu/packing.h"
#include "kernels/cpu/thread_pool.h"

namespace dfa::cpu {

void RunForward(const ForwardArgs& args, const KernelTable& kernels, ThreadPool& pool,
                Workspace& ws);
void RunBackward(const BackwardArgs& args, const KernelTable& kernels, ThreadPool& pool,
                 Workspace& ws);

}  // namespace dfa::cpu
