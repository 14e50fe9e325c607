// absl::Status <-> grpc::Status at the RPC boundary (the codes are numerically the same).
#pragma once

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"
#include "kernels/status.h"

namespace dfa {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// `context` prefixes the message, e.g. "worker w1 (host:port) OpenSession".
inline absl::Status FromGrpcStatus(const grpc::Status& s, absl::string_view context) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(context, ": ", s.error_message()));
}

}  // namespace dfa
