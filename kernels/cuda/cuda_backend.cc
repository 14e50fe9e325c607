// Placeholder until the CUDA kernels land (issue 5).
#include "kernels/cuda/cuda_backend.h"

namespace dfa {
absl::StatusOr<std::unique_ptr<AttentionBackend>> CreateCudaBackend(const BackendOptions&) {
  return absl::UnavailableError("cuda backend: not built yet");
}
}  // namespace dfa
