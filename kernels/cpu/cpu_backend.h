// The CPU attention backend: blocked online-softmax kernels, multithreaded, fp32 arithmetic.
// Always built; the reference that tests compare other backends against.
#pragma once

#include <memory>

#include "kernels/attention_backend.h"

namespace dfa {

absl::StatusOr<std::unique_ptr<AttentionBackend>> CreateCpuBackend(const BackendOptions& options);

}  // namespace dfa
