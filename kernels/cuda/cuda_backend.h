// The CUDA attention backend (FlashAttention-style fused kernels; sm_90a and sm_80 paths).
// Only compiled when nvcc is found; CreateBackend("cuda") is UNAVAILABLE otherwise.
#pragma once

#include <memory>

#include "kernels/attention_backend.h"

namespace dfa {

// UNAVAILABLE when no CUDA device can be used (no driver, no GPU).
absl::StatusOr<std::unique_ptr<AttentionBackend>> CreateCudaBackend(const BackendOptions& options);

}  // namespace dfa
