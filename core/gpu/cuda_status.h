// CUDA runtime results turned into absl::Status by one macro, so GPU code returns errors like
// the rest of the project instead of aborting.
//   CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(...));   -> INTERNAL "cudaMemcpyAsync(...): <reason>"
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace dfa {

// OK for cudaSuccess; otherwise INTERNAL (UNAVAILABLE for "no device" style errors,
// RESOURCE_EXHAUSTED for out of memory, INVALID_ARGUMENT for bad values) naming `what` and the
// CUDA error string.
absl::Status CudaStatus(cudaError_t err, const char* what);

}  // namespace dfa

#define CUDA_RETURN_IF_ERROR(expr) RETURN_IF_ERROR(::dfa::CudaStatus((expr), #expr))
