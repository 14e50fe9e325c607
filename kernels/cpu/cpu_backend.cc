// Placeholder until the CPU kernels land (issue 2).
#include "kernels/cpu/cpu_backend.h"

namespace dfa {
absl::StatusOr<std::unique_ptr<AttentionBackend>> CreateCpuBackend(const BackendOptions&) {
  return absl::UnimplementedError("cpu backend: not built yet");
}
}  // namespace dfa
