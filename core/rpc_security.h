// Transport security of every gRPC connection in the service: mutual TLS between all processes
// (coordinator, workers, clients) and the bearer token clients send to the coordinator.
// Linked by both daemons and the client library (target dfa_rpc_security).
//
//   RpcSecurityOptions o;  o.cert_file = "node.pem";  o.key_file = "node.key";
//   o.ca_file = "ca.pem";
//   ASSIGN_OR_RETURN(auto security, RpcSecurity::Load(o));
//   builder.AddListeningPort(addr, security->ServerCredentials());  // requires client certs
//   auto channel = security->CreateChannel(peer, args);             // verifies the server
//
// Modes (chosen by which files are given; see docs/security.md):
//   - none of cert/key/ca: insecure (plaintext), the default of the local demo;
//   - all three: mTLS. Servers require a client certificate signed by the CA and verify it;
//     clients verify the server certificate against the CA (and the server's name, see
//     server_name) and present their own certificate;
//   - anything in between is INVALID_ARGUMENT naming the missing flag.
// auth_token is independent of TLS: when non-empty every call on channels made here carries
// metadata "authorization: Bearer <token>" (what dfa-coordinator --auth_token checks). A worker
// sends its worker token instead on its channel to the coordinator (WithToken; what
// dfa-coordinator --worker_token checks).
//
// Files are read and checked once, in Load (PEM syntax, key matches certificate, CA parses);
// a later change on disk needs a restart. Thread safety: an RpcSecurity is immutable after Load
// and may be shared by any number of threads and channels (hold it by shared_ptr).
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "core/status.h"

namespace dfa {

struct RpcSecurityOptions {
  std::string cert_file;  // --tls_cert: PEM certificate (chain) this process presents
  std::string key_file;   // --tls_key: PEM private key of cert_file
  std::string ca_file;    // --tls_ca: PEM CA certificate(s) peers must be signed by
  // --tls_server_name: when set, clients check servers' certificates against this name instead
  // of the host in the address (one certificate for every daemon behind changing addresses).
  std::string server_name;
  std::string auth_token;  // --auth_token: sent by clients; never checked here

  bool tls() const { return !cert_file.empty() || !key_file.empty() || !ca_file.empty(); }
};

// OK for a token that can travel as gRPC metadata (printable ASCII, no spaces; "" means none);
// INVALID_ARGUMENT naming `flag` otherwise.
absl::Status ValidateToken(const std::string& token, absl::string_view flag);

// The token in the file at `path` (--..._token_file), without trailing newline or spaces.
// INVALID_ARGUMENT naming `flag` when the file cannot be read, is empty, or holds a bad token.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path, absl::string_view flag);

// True when one of the call's "authorization" metadata values is "Bearer <token>" (compared in
// constant time). `token` must not be empty.
bool CarriesBearerToken(const grpc::ServerContextBase& ctx, absl::string_view token);

// The name under which a worker process's health service reports SERVING, so that the
// coordinator can check which process serves an address (RegisterWorkerRequest.boot_id).
inline std::string WorkerBootHealthService(absl::string_view boot_id) {
  return std::string("dfa.v1.Worker/boot/").append(boot_id.data(), boot_id.size());
}

class RpcSecurity {
 public:
  // Reads and checks the files. INVALID_ARGUMENT naming the flag (--tls_cert, --tls_key,
  // --tls_ca) for a partial set, an unreadable file, bad PEM or a key that does not match the
  // certificate.
  static absl::StatusOr<std::shared_ptr<const RpcSecurity>> Load(const RpcSecurityOptions& options);
  // Plaintext and no token.
  static std::shared_ptr<const RpcSecurity> Insecure();

  bool tls() const { return tls_; }
  const std::string& auth_token() const { return auth_token_; }
  // "mTLS" or "insecure" (for logs).
  std::string Describe() const;

  // Insecure, or TLS that requires and verifies client certificates against the CA.
  std::shared_ptr<grpc::ServerCredentials> ServerCredentials() const;
  // Insecure, or TLS verifying the server against the CA and presenting our certificate.
  std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials() const;
  // A channel to `address` with these credentials and `args` (server_name applied), whose calls
  // carry the bearer token when one is set.
  std::shared_ptr<grpc::Channel> CreateChannel(const std::string& address,
                                               grpc::ChannelArguments args) const;
  std::shared_ptr<grpc::Channel> CreateChannel(const std::string& address) const {
    return CreateChannel(address, grpc::ChannelArguments());
  }
  // The same credentials with `token` as the bearer token of its channels ("" for none).
  // INVALID_ARGUMENT naming `flag` for a token that cannot travel as metadata.
  absl::StatusOr<std::shared_ptr<const RpcSecurity>> WithToken(const std::string& token,
                                                               absl::string_view flag) const;

 private:
  RpcSecurity() = default;

  bool tls_ = false;
  std::string cert_pem_, key_pem_, ca_pem_;
  std::string server_name_;
  std::string auth_token_;
};

}  // namespace dfa
