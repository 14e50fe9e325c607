// NCCL results turned into absl::Status by one macro, beside core/gpu/cuda_status.h's CUDA one.
//   NCCL_RETURN_IF_ERROR(ncclSend(...));   -> UNAVAILABLE / INTERNAL with NCCL's reason
#pragma once

#include <nccl.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "core/gpu/cuda_status.h"

namespace dfa {

// OK for ncclSuccess and ncclInProgress; UNAVAILABLE for remote/system errors (a lost peer),
// INVALID_ARGUMENT for ncclInvalidArgument/ncclInvalidUsage, INTERNAL otherwise.
absl::Status NcclStatus(ncclResult_t res, const char* what);

}  // namespace dfa

#define NCCL_RETURN_IF_ERROR(expr) RETURN_IF_ERROR(::dfa::NcclStatus((expr), #expr))
