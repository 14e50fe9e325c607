// mTLS and the client token on real processes over loopback (docs/security.md). Certificates
// are made here with the `openssl` command (skipped when it is missing): a cluster CA signs the
// daemons' certificate ("node", SAN 127.0.0.1) and a client's; another CA signs a "rogue" one.
// One coordinator + 2 workers run with mTLS everywhere and --auth_token; the suite checks a
// verified forward+backward job, then that every wrong caller is refused with UNAVAILABLE or
// UNAUTHENTICATED and a message saying why, and that the daemons keep serving afterwards.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/child_process.h"
#include "client/grpc_util.h"
#include "dfa/v1/worker.grpc.pb.h"
#include "core/rpc_security.h"
#include "tests/integration/cluster_fixture.h"

namespace dfa::testing {
namespace {

namespace fs = std::filesystem;

constexpr char kToken[] = "s3cret-token";

// A refused connection's message points at the TLS setup (the client library's hint, or the
// handshake error itself).
bool SaysWhy(const absl::Status& s) {
  return absl::StrContains(s.message(), "signed by the server's CA") ||
         absl::StrContains(absl::AsciiStrToLower(s.message()), "handshake");
}

bool HaveOpenssl() { return std::system("openssl version >/dev/null 2>&1") == 0; }

// Runs a shell command in `dir`; false (with the output in the failure) when it fails.
bool Sh(const std::string& dir, const std::string& cmd) {
  const std::string log = dir + "/openssl.log";
  const int rc =
      std::system(absl::StrCat("cd '", dir, "' && (", cmd, ") >>'", log, "' 2>&1").c_str());
  if (rc != 0) {
    std::ifstream in(log);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ADD_FAILURE() << cmd << " failed:\n" << text;
  }
  return rc == 0;
}

// A CA (self-signed, P-256) named `name` in dir/name.{pem,key}.
bool MakeCa(const std::string& dir, const std::string& name) {
  return Sh(dir, absl::StrCat("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
                              "-nodes -days 2 -subj /CN=",
                              name, " -keyout ", name, ".key -out ", name, ".pem"));
}

// A leaf certificate for 127.0.0.1/localhost, usable as server and client, signed by `ca`.
bool MakeLeaf(const std::string& dir, const std::string& name, const std::string& ca) {
  {
    std::ofstream ext(dir + "/" + name + ".ext");
    ext << "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
           "extendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n";
  }
  return Sh(dir, absl::StrCat("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
                              "-nodes -subj /CN=",
                              name, " -keyout ", name, ".key -out ", name, ".csr")) &&
         Sh(dir,
            absl::StrCat("openssl x509 -req -days 2 -in ", name, ".csr -CA ", ca, ".pem -CAkey ",
                         ca, ".key -CAcreateserial -extfile ", name, ".ext -out ", name, ".pem"));
}

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!HaveOpenssl()) {
      skip_reason_ = new std::string("the openssl command is not installed");
      return;
    }
    std::string templ = (fs::temp_directory_path() / "dfa-security-XXXXXX").string();
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    dir_ = new std::string(templ);
    ASSERT_TRUE(MakeCa(*dir_, "ca") && MakeCa(*dir_, "other_ca") && MakeLeaf(*dir_, "node", "ca") &&
                MakeLeaf(*dir_, "client", "ca") && MakeLeaf(*dir_, "rogue", "other_ca"));

    client::LocalClusterOptions o;
    o.workers = 2;
    o.threads_per_worker = 1;
    o.start_timeout = absl::Seconds(20);
    o.security = Files("node", "ca");
    o.security.auth_token = kToken;
    auto cluster = client::LocalCluster::Start(o);
    if (cluster.status().code() == absl::StatusCode::kNotFound) {
      skip_reason_ = new std::string("dfa-coordinator / dfa-worker not built");
      return;
    }
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }

  static void TearDownTestSuite() {
    if (cluster_ != nullptr) {
      EXPECT_TRUE(cluster_->Stop().ok()) << "daemons must stop cleanly on SIGTERM";
      delete cluster_;
      cluster_ = nullptr;
    }
    if (dir_ != nullptr) {
      std::error_code ec;
      fs::remove_all(*dir_, ec);
      delete dir_;
      dir_ = nullptr;
    }
  }

  void SetUp() override {
    if (skip_reason_ != nullptr) GTEST_SKIP() << *skip_reason_;
    ASSERT_NE(cluster_, nullptr);
  }

  static RpcSecurityOptions Files(const std::string& leaf, const std::string& ca) {
    RpcSecurityOptions s;
    s.cert_file = absl::StrCat(*dir_, "/", leaf, ".pem");
    s.key_file = absl::StrCat(*dir_, "/", leaf, ".key");
    s.ca_file = absl::StrCat(*dir_, "/", ca, ".pem");
    return s;
  }

  // A client of the cluster with `security`, short deadlines.
  static std::unique_ptr<client::Client> Connect(const RpcSecurityOptions& security) {
    client::ClientOptions o;
    o.coordinator = cluster_->coordinator_address();
    o.security = security;
    o.rpc_timeout = absl::Seconds(3);
    auto c = client::Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  static RpcSecurityOptions GoodClient() {
    RpcSecurityOptions s = Files("client", "ca");
    s.auth_token = kToken;
    return s;
  }

  // A worker call over `channel` (CloseSession of a session it never had: answered, once the
  // connection is accepted, with an application status, never UNAVAILABLE).
  static grpc::Status CallWorker(const std::shared_ptr<grpc::Channel>& channel) {
    auto stub = v1::Worker::NewStub(channel);
    grpc::ClientContext ctx;
    client::SetDeadline(&ctx, absl::Seconds(3));
    v1::CloseSessionRequest req;
    req.set_session_id("s-no-such-session");
    v1::CloseSessionResponse resp;
    return stub->CloseSession(&ctx, req, &resp);
  }

  // The properly configured client still gets answers from the coordinator and both workers.
  static void ExpectClusterStillServes() {
    auto good = Connect(GoodClient());
    ASSERT_NE(good, nullptr);
    auto workers = good->ListWorkers();
    ASSERT_TRUE(workers.ok()) << workers.status();
    int alive = 0;
    for (const auto& w : workers->workers()) alive += w.alive() ? 1 : 0;
    EXPECT_EQ(alive, 2);
    auto security = RpcSecurity::Load(GoodClient());
    ASSERT_TRUE(security.ok()) << security.status();
    for (const auto& w : cluster_->workers()) {
      grpc::Status s = CallWorker((*security)->CreateChannel(w.address));
      EXPECT_NE(s.error_code(), grpc::StatusCode::UNAVAILABLE)
          << w.address << ": " << s.error_message();
    }
  }

  static std::string* dir_;
  static std::string* skip_reason_;
  static client::LocalCluster* cluster_;
};

std::string* SecurityTest::dir_ = nullptr;
std::string* SecurityTest::skip_reason_ = nullptr;
client::LocalCluster* SecurityTest::cluster_ = nullptr;

TEST_F(SecurityTest, MutualTlsClusterRunsVerifiedForwardAndBackward) {
  auto c = Connect(GoodClient());
  ASSERT_NE(c, nullptr);
  const auto spec = MakeSpec(/*batch=*/1, /*seq=*/256, /*q_heads=*/4, /*kv_heads=*/2,
                             /*head_dim=*/32, /*causal=*/true);
  const TrainingInputs in = RandomInputs(spec, 7);
  // gRPC path: every shard and every output crosses a TLS connection to its worker.
  RunResult r = RunTraining(c.get(), spec, 2, "balanced", in, client::TransferPath::kGrpc);
  EXPECT_EQ(r.num_workers, 2);
  EXPECT_EQ(r.forward.state(), v1::JOB_SUCCEEDED);
  EXPECT_EQ(r.backward.state(), v1::JOB_SUCCEEDED);
  ExpectMatchesReference(spec, in, r);
}

TEST_F(SecurityTest, PlaintextClientIsRefused) {
  RpcSecurityOptions plain;
  plain.auth_token = kToken;
  auto c = Connect(plain);
  ASSERT_NE(c, nullptr);
  auto status = c->GetStatus();
  EXPECT_EQ(status.status().code(), absl::StatusCode::kUnavailable) << status.status();
  EXPECT_TRUE(SaysWhy(status.status())) << status.status();
  grpc::Status w = CallWorker(client::MakeChannel(cluster_->workers()[0].address));
  EXPECT_EQ(w.error_code(), grpc::StatusCode::UNAVAILABLE) << w.error_message();
  ExpectClusterStillServes();
}

TEST_F(SecurityTest, ClientWithoutCertificateIsRefused) {
  // Verifies the server against the right CA but presents no certificate of its own.
  grpc::SslCredentialsOptions o;
  {
    std::ifstream in(Files("client", "ca").ca_file);
    o.pem_root_certs.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  auto creds = grpc::SslCredentials(o);
  auto coordinator =
      v1::Coordinator::NewStub(grpc::CreateChannel(cluster_->coordinator_address(), creds));
  grpc::ClientContext ctx;
  client::SetDeadline(&ctx, absl::Seconds(3));
  ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
  v1::ClusterStatus resp;
  grpc::Status s = coordinator->GetStatus(&ctx, {}, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  grpc::Status w = CallWorker(grpc::CreateChannel(cluster_->workers()[1].address, creds));
  EXPECT_EQ(w.error_code(), grpc::StatusCode::UNAVAILABLE) << w.error_message();
  ExpectClusterStillServes();
}

TEST_F(SecurityTest, CertificateFromAnotherCaIsRefused) {
  RpcSecurityOptions rogue = Files("rogue", "ca");  // trusts the cluster, signed by another CA
  rogue.auth_token = kToken;
  auto c = Connect(rogue);
  ASSERT_NE(c, nullptr);
  auto status = c->GetStatus();
  EXPECT_EQ(status.status().code(), absl::StatusCode::kUnavailable) << status.status();
  EXPECT_TRUE(SaysWhy(status.status())) << status.status();
  auto security = RpcSecurity::Load(rogue);
  ASSERT_TRUE(security.ok()) << security.status();
  grpc::Status w = CallWorker((*security)->CreateChannel(cluster_->workers()[0].address));
  EXPECT_EQ(w.error_code(), grpc::StatusCode::UNAVAILABLE) << w.error_message();
  ExpectClusterStillServes();
}

TEST_F(SecurityTest, ServerSignedByUnknownCaIsNotTrusted) {
  RpcSecurityOptions s = Files("client", "other_ca");  // our cert is fine; we trust the wrong CA
  s.auth_token = kToken;
  auto c = Connect(s);
  ASSERT_NE(c, nullptr);
  auto status = c->GetStatus();
  EXPECT_EQ(status.status().code(), absl::StatusCode::kUnavailable) << status.status();
  EXPECT_TRUE(absl::StrContains(status.status().message(), "certificate verify failed"))
      << status.status();
  EXPECT_TRUE(SaysWhy(status.status())) << status.status();
  ExpectClusterStillServes();
}

TEST_F(SecurityTest, WrongOrMissingTokenIsUnauthenticated) {
  for (const char* token : {"", "guess"}) {
    RpcSecurityOptions s = Files("client", "ca");
    s.auth_token = token;
    auto c = Connect(s);
    ASSERT_NE(c, nullptr);
    auto status = c->GetStatus();
    EXPECT_EQ(status.status().code(), absl::StatusCode::kUnauthenticated)
        << "token '" << token << "': " << status.status();
    EXPECT_TRUE(absl::StrContains(status.status().message(), "authorization")) << status.status();
    client::SessionOptions so;
    so.spec = MakeSpec(1, 256, 4, 4, 32, true);
    auto session = c->CreateSession(so);
    EXPECT_EQ(session.status().code(), absl::StatusCode::kUnauthenticated) << session.status();
  }
  ExpectClusterStillServes();
}

TEST_F(SecurityTest, IncompleteOrMismatchedTlsFilesAreNamed) {
  RpcSecurityOptions no_key = Files("node", "ca");
  no_key.key_file.clear();
  auto s = RpcSecurity::Load(no_key);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.status().message(), "--tls_key")) << s.status();

  RpcSecurityOptions mismatched = Files("node", "ca");
  mismatched.key_file = Files("client", "ca").key_file;
  s = RpcSecurity::Load(mismatched);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.status().message(), "does not match")) << s.status();

  RpcSecurityOptions missing = Files("node", "ca");
  missing.ca_file = *dir_ + "/no-such-ca.pem";
  s = RpcSecurity::Load(missing);
  EXPECT_TRUE(absl::StrContains(s.status().message(), "--tls_ca")) << s.status();

  RpcSecurityOptions not_pem = Files("node", "ca");
  not_pem.cert_file = *dir_ + "/node.ext";
  s = RpcSecurity::Load(not_pem);
  EXPECT_TRUE(absl::StrContains(s.status().message(), "--tls_cert")) << s.status();

  RpcSecurityOptions bad_token;
  bad_token.auth_token = "two words";
  s = RpcSecurity::Load(bad_token);
  EXPECT_TRUE(absl::StrContains(s.status().message(), "--auth_token")) << s.status();

  // A daemon given half the flags refuses to start and says which one is missing.
  auto bin = client::LocalCluster::FindBinary("", "coordinator", "dfa-coordinator");
  ASSERT_TRUE(bin.ok()) << bin.status();
  auto proc = client::ChildProcess::Start(
      "dfa-coordinator",
      {*bin, "--listen=127.0.0.1:0", absl::StrCat("--tls_cert=", no_key.cert_file),
       absl::StrCat("--tls_ca=", no_key.ca_file)},
      *dir_ + "/half-flags.log");
  ASSERT_TRUE(proc.ok()) << proc.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while ((*proc)->Running() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_FALSE((*proc)->Running()) << "dfa-coordinator must not start with --tls_key missing";
  EXPECT_NE((*proc)->exit_status(), 0);
  EXPECT_TRUE(absl::StrContains((*proc)->LogTail(5), "--tls_key")) << (*proc)->LogTail(5);
}

}  // namespace
}  // namespace dfa::testing
