// The CUDA attention backend (FlashAttention-style fused kernels; sm_90a and sm_80 paths).
// Only compiled when nvcc is found; CreateBackend("cuda") is UNAVAILABLE otherwise.
#pragma once

#include <memory>

#include "kernels/attention_backend.h"
#include "kernels/cuda/kernel_dispatch.h"

namespace dfa {

// UNAVAILABLE when no CUDA device can be used (no driver, no GPU). `choice` overrides the kernel
// table of kernel_dispatch.h (benchmarks and tests; the default runs the table); INVALID_ARGUMENT
// when it forces a Hopper kernel on another GPU or names a tile chunk outside -1..999.
absl::StatusOr<std::unique_ptr<AttentionBackend>> CreateCudaBackend(
    const BackendOptions& options, const cuda::KernelChoice& choice = {});

}  // namespace dfa
