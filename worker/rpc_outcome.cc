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
  // The code's name as gRPC spells it: "OK", "NOT_FOUND", "DATA_LOSS", ...
  if (metrics) {
    const std::string code = absl::StatusCodeToString(st.code());
    metrics->CountRequest(method, code);
    if (!st.ok()) metrics->CountGrpcError(method, code);
  }
  if (st.ok()) return grpc::Status::OK;
  return ToGrpcStatus(st);
}

}  // namespace dfa
