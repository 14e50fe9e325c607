#include "worker/rpc_outcome.h"

#include "absl/strings/str_cat.h"
#include "core/grpc_status.h"

namespace dfa {

absl::Status CheckIdle(const WorkerSession& s) {
  if (!s.job_running) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("session_id = '", s.id, "' is running job '",
                                                    s.running_job_id, "'; try again after it"));
}

grpc::Status AnswerRpc(WorkerMetrics* metrics, const char* method, const absl::Status& st) {
  if (st.ok()) return grpc::Status::OK;
  // The code's name as gRPC spells it: "NOT_FOUND", "DATA_LOSS", ...
  if (metrics) metrics->CountGrpcError(method, absl::StatusCodeToString(st.code()));
  return ToGrpcStatus(st);
}

}  // namespace dfa
