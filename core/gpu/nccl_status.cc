#include "core/gpu/nccl_status.h"

namespace dfa {

absl::Status NcclStatus(ncclResult_t res, const char* what) {
  if (res == ncclSuccess || res == ncclInProgress) return absl::OkStatus();
  std::string msg = absl::StrCat(what, ": ", ncclGetErrorString(res));
  switch (res) {
    case ncclRemoteError:
    case ncclSystemError:
      return absl::UnavailableError(msg);
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace dfa
