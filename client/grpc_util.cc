#include "client/grpc_util.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace dfa::client {

absl::Status FromGrpc(const grpc::Status& s, const std::string& context) {
  if (s.ok()) return absl::OkStatus();
  std::string message = absl::StrCat(context, ": ", s.error_message());
  // A TLS server refusing the connection shows up as a bare "Socket closed" (plaintext client,
  // or a client certificate it does not trust) or a handshake error: say what to check.
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

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) {
  return MakeChannel(address, *RpcSecurity::Insecure());
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const RpcSecurity& security) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  // Each channel its own TCP connection: parallel uploads to different workers never share one.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Reconnect quickly: a daemon that is starting (or restarting) is reached within ~0.1 s
  // instead of after gRPC's default 1 s+ exponential backoff.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return security.CreateChannel(address, args);
}

void SetDeadline(grpc::ClientContext* ctx, absl::Duration timeout) {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::microseconds(absl::ToInt64Microseconds(timeout)));
}

}  // namespace dfa::client
