// gRPC helpers of the client library: status conversion at the RPC boundary, channel creation
// with the message-size limits the data plane needs, and deadlines.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/time/time.h"
#include "core/status.h"
#include "core/grpc_status.h"
#include "core/rpc_security.h"

namespace dfa::client {

// grpc::Status -> absl::Status with the same code; the message is prefixed with `context`
// (e.g. "worker 127.0.0.1:7001 Upload").
absl::Status FromGrpc(const grpc::Status& s, const std::string& context);

// A channel to `address` that accepts messages up to 64 MiB (download chunks), with
// `security`'s credentials (mTLS or insecure) and bearer token (core/rpc_security.h).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const RpcSecurity& security);
// The same, insecure and without a token.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);

// Sets ctx's deadline `timeout` from now.
void SetDeadline(grpc::ClientContext* ctx, absl::Duration timeout);

}  // namespace dfa::client
