#include "core/rpc_security.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/random_id.h"
#include "grpcpp/support/client_interceptor.h"

namespace dfa {
namespace {

// Adds "authorization: Bearer <token>" to every call's initial metadata.
class TokenInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", *header_);
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;  // owned by the factory, which the channel keeps alive
};

class TokenInterceptorFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(const std::string& token)
      : header_(absl::StrCat("Bearer ", token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new TokenInterceptor(&header_);
  }

 private:
  const std::string header_;
};

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();  // NOLINT(runtime/int): OpenSSL's type
  ERR_clear_error();
  if (e == 0) return "no PEM data";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

absl::StatusOr<std::string> ReadFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read '", path, "'"));
  }
  std::ostringstream s;
  s << in.rdbuf();
  if (s.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": '", path, "' is empty"));
  }
  return s.str();
}

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioDeleter>;
using X509Ptr = std::unique_ptr<X509, X509Deleter>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyDeleter>;

BioPtr MemBio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

absl::StatusOr<X509Ptr> FirstCertificate(const std::string& flag, const std::string& path,
                                         const std::string& pem) {
  BioPtr bio = MemBio(pem);
  X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (!cert) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", path, "' holds no PEM certificate (", OpenSslError(), ")"));
  }
  return cert;
}

// The checks gRPC would otherwise only report at the first handshake, as a bare
// "handshake failed" on the peer's side.
absl::Status CheckPem(const RpcSecurityOptions& o, const std::string& cert_pem,
                      const std::string& key_pem, const std::string& ca_pem) {
  ASSIGN_OR_RETURN(X509Ptr cert, FirstCertificate("--tls_cert", o.cert_file, cert_pem));
  ASSIGN_OR_RETURN(X509Ptr ca, FirstCertificate("--tls_ca", o.ca_file, ca_pem));
  BioPtr bio = MemBio(key_pem);
  KeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (!key) {
    return absl::InvalidArgumentError(absl::StrCat("--tls_key: '", o.key_file,
                                                   "' holds no PEM private key (unencrypted) (",
                                                   OpenSslError(), ")"));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat("--tls_key: '", o.key_file,
                                                   "' does not match the certificate in '",
                                                   o.cert_file, "' (--tls_cert)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateToken(const std::string& token, absl::string_view flag) {
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag,
          ": only printable ASCII without spaces is allowed (it travels as gRPC metadata)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path, absl::string_view flag) {
  ASSIGN_OR_RETURN(std::string token, ReadFile(std::string(flag), path));
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' ||
                            token.back() == ' ' || token.back() == '\t')) {
    token.pop_back();
  }
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": '", path, "' holds no token"));
  }
  RETURN_IF_ERROR(ValidateToken(token, flag));
  return token;
}

bool CarriesBearerToken(const grpc::ServerContextBase& ctx, absl::string_view token) {
  if (token.empty()) return false;
  const std::string expected = absl::StrCat("Bearer ", token);
  bool found = false;
  auto range = ctx.client_metadata().equal_range("authorization");
  for (auto it = range.first; it != range.second; ++it) {
    // Every value is compared (no early exit), each in constant time.
    found |= ConstantTimeEquals(absl::string_view(it->second.data(), it->second.size()), expected);
  }
  return found;
}

absl::StatusOr<std::shared_ptr<const RpcSecurity>> RpcSecurity::WithToken(
    const std::string& token, absl::string_view flag) const {
  RETURN_IF_ERROR(ValidateToken(token, flag));
  std::shared_ptr<RpcSecurity> s(new RpcSecurity(*this));
  s->auth_token_ = token;
  return std::shared_ptr<const RpcSecurity>(std::move(s));
}

absl::StatusOr<std::shared_ptr<const RpcSecurity>> RpcSecurity::Load(const RpcSecurityOptions& o) {
  RETURN_IF_ERROR(ValidateToken(o.auth_token, "--auth_token"));
  std::shared_ptr<RpcSecurity> s(new RpcSecurity());
  s->auth_token_ = o.auth_token;
  s->server_name_ = o.server_name;
  if (!o.tls()) {
    if (!o.server_name.empty()) {
      return absl::InvalidArgumentError(
          "--tls_server_name: needs TLS (--tls_cert, --tls_key and --tls_ca)");
    }
    return std::shared_ptr<const RpcSecurity>(std::move(s));
  }
  const struct {
    const char* flag;
    const std::string& value;
  } required[] = {{"--tls_cert", o.cert_file}, {"--tls_key", o.key_file}, {"--tls_ca", o.ca_file}};
  for (const auto& r : required) {
    if (r.value.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          r.flag, ": missing; mutual TLS needs all of --tls_cert, --tls_key and --tls_ca"));
    }
  }
  ASSIGN_OR_RETURN(s->cert_pem_, ReadFile("--tls_cert", o.cert_file));
  ASSIGN_OR_RETURN(s->key_pem_, ReadFile("--tls_key", o.key_file));
  ASSIGN_OR_RETURN(s->ca_pem_, ReadFile("--tls_ca", o.ca_file));
  RETURN_IF_ERROR(CheckPem(o, s->cert_pem_, s->key_pem_, s->ca_pem_));
  s->tls_ = true;
  return std::shared_ptr<const RpcSecurity>(std::move(s));
}

std::shared_ptr<const RpcSecurity> RpcSecurity::Insecure() {
  return std::shared_ptr<const RpcSecurity>(new RpcSecurity());
}

std::string RpcSecurity::Describe() const {
  std::string d = tls_ ? "mTLS" : "insecure";
  if (!auth_token_.empty()) absl::StrAppend(&d, " + token");
  return d;
}

std::shared_ptr<grpc::ServerCredentials> RpcSecurity::ServerCredentials() const {
  if (!tls_) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions o(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = ca_pem_;
  o.pem_key_cert_pairs.push_back({key_pem_, cert_pem_});
  return grpc::SslServerCredentials(o);
}

std::shared_ptr<grpc::ChannelCredentials> RpcSecurity::ChannelCredentials() const {
  if (!tls_) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = ca_pem_;
  o.pem_private_key = key_pem_;
  o.pem_cert_chain = cert_pem_;
  return grpc::SslCredentials(o);
}

std::shared_ptr<grpc::Channel> RpcSecurity::CreateChannel(const std::string& address,
                                                          grpc::ChannelArguments args) const {
  if (tls_ && !server_name_.empty()) args.SetSslTargetNameOverride(server_name_);
  if (auth_token_.empty()) {
    return grpc::CreateCustomChannel(address, ChannelCredentials(), args);
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<TokenInterceptorFactory>(auth_token_));
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, ChannelCredentials(),
                                                                 args, std::move(factories));
}

}  // namespace dfa
