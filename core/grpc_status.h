// absl::Status <-> grpc::Status at the RPC boundary (the codes are numerically the same). Every
// daemon and client converts through these two functions.
#pragma once

#include <string>

#include "absl/strings/string_view.h"
#include "core/status.h"
#include "grpcpp/support/status.h"

namespace dfa {

grpc::Status ToGrpcStatus(const absl::Status& s);

// `context` prefixes the message, e.g. "worker w1 (host:port) OpenSession". A TLS server that
// refuses the connection during setup (a bare "Socket closed", a handshake error) gets a hint
// naming the TLS flags to check.
absl::Status FromGrpcStatus(const grpc::Status& s, absl::string_view context);

}  // namespace dfa
