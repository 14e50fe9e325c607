#include "core/grpc_status.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace dfa {

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& s, absl::string_view context) {
  if (s.ok()) return absl::OkStatus();
  std::string message = absl::StrCat(context, ": ", s.error_message());
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE &&
      (absl::StrContains(s.error_message(), "Socket closed") ||
       absl::StrContains(s.error_message(), "Connection reset") ||
       absl::StrContains(s.error_message(), "andshake") ||
       absl::StrContains(s.error_message(), "ALERT"))) {
    absl::StrAppend(&message,
                    " (connection refused during setup: if the server runs with mTLS, the client "
                    "needs --tls-cert/--tls-key signed by the server's CA and --tls-ca naming "
                    "that CA; see docs/security.md)");
  }
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), message);
}

}  // namespace dfa
