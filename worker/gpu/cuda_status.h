// CUDA runtime and NCCL results turned into absl::Status by one macro each, so GPU code in the
// worker returns errors like the rest of the project instead of aborting.
//   CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(...));   -> INTERNAL "cudaMemcpyAsync(...): <reason>"
//   NCCL_RETURN_IF_ERROR(ncclSend(...));          -> UNAVAILABLE / INTERNAL with NCCL's reason
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/status.h"

namespace dfa {

// OK for cudaSuccess; otherwise INTERNAL (UNAVAILABLE for "no device" style errors) naming
// `what` and the CUDA error string.
absl::Status CudaStatus(cudaError_t err, const char* what);

// OK for ncclSuccess and ncclInProgress; UNAVAILABLE for remote/system errors (a lost peer),
// INVALID_ARGUMENT for ncclInvalidArgument/ncclInvalidUsage, INTERNAL otherwise.
absl::Status NcclStatus(ncclResult_t res, const char* what);

}  // namespace dfa

#define CUDA_RETURN_IF_ERROR(expr) RETURN_IF_ERROR(::dfa::CudaStatus((expr), #expr))
#define NCCL_RETURN_IF_ERROR(expr) RETURN_IF_ERROR(::dfa::NcclStatus((expr), #expr))
