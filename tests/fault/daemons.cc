#include "tests/fault/daemons.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/local_cluster.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "grpcpp/security/credentials.h"

namespace dfa::testing {
namespace {

bool PortAccepts(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

std::unique_ptr<grpc::ClientContext> Context(const std::string& token, absl::Duration timeout) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!token.empty()) ctx->AddMetadata("authorization", absl::StrCat("Bearer ", token));
  return ctx;
}

absl::StatusOr<std::unique_ptr<Daemons>> Daemons::Create() {
  std::unique_ptr<Daemons> d(new Daemons());
  ASSIGN_OR_RETURN(d->coordinator_bin_,
                   client::LocalCluster::FindBinary("", "coordinator", "dfa-coordinator"));
  ASSIGN_OR_RETURN(d->worker_bin_, client::LocalCluster::FindBinary("", "worker", "dfa-worker"));
  const char* tmp = getenv("TMPDIR");
  std::string templ = absl::StrCat(tmp && *tmp ? tmp : "/tmp", "/dfa-fault-XXXXXX");
  if (mkdtemp(templ.data()) == nullptr) return absl::UnavailableError("mkdtemp failed");
  d->log_dir_ = templ;
  return d;
}

Daemons::~Daemons() {
  for (auto& [i, w] : workers_) {
    if (w) w->Signal(SIGTERM);
  }
  for (auto& [i, w] : workers_) {
    if (w) (void)w->Stop(absl::Seconds(5));
  }
  if (coordinator_) (void)coordinator_->Stop(absl::Seconds(5));
}

absl::Status Daemons::StartCoordinator(std::vector<std::string> args, const std::string& token) {
  if (coordinator_port_ == 0) {
    ASSIGN_OR_RETURN(coordinator_port_, client::LocalCluster::FreePort());
    coordinator_address_ = absl::StrCat("127.0.0.1:", coordinator_port_);
  }
  std::vector<std::string> argv = {coordinator_bin_,
                                   absl::StrCat("--listen=", coordinator_address_)};
  for (auto& a : args) argv.push_back(std::move(a));
  ASSIGN_OR_RETURN(coordinator_,
                   client::ChildProcess::Start("dfa-coordinator", std::move(argv),
                                               absl::StrCat(log_dir_, "/coordinator.log")));
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!PortAccepts(coordinator_port_)) {
    if (!coordinator_->Running() || absl::Now() > deadline) {
      return absl::UnavailableError(absl::StrCat("dfa-coordinator did not start. Log tail:\n",
                                                 coordinator_->LogTail(15)));
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  listening_at_ = absl::Now();
  // A fresh channel: one that saw the old coordinator die would wait out its reconnect backoff.
  stub_ = v1::Coordinator::NewStub(
      grpc::CreateChannel(coordinator_address_, grpc::InsecureChannelCredentials()));
  while (true) {
    v1::ClusterStatus status;
    grpc::Status s = stub_->GetStatus(Context(token, absl::Seconds(1)).get(),
                                      v1::GetStatusRequest(), &status);
    if (s.ok()) return absl::OkStatus();
    if (!coordinator_->Running() || absl::Now() > deadline) {
      return absl::UnavailableError(absl::StrCat("dfa-coordinator not answering: ",
                                                 s.error_message(), ". Log tail:\n",
                                                 coordinator_->LogTail(15)));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

void Daemons::KillCoordinator() {
  if (!coordinator_) return;
  coordinator_->Signal(SIGKILL);
  (void)coordinator_->Stop(absl::Seconds(5));  // reaps it
  coordinator_.reset();
}

absl::Status Daemons::StartWorker(int index, std::vector<std::string> args) {
  if (worker_ports_.count(index) == 0) {
    ASSIGN_OR_RETURN(worker_ports_[index], client::LocalCluster::FreePort());
  }
  const std::string address = worker_address(index);
  const std::string id = absl::StrCat("worker-", index);
  std::vector<std::string> argv = {worker_bin_,
                                   absl::StrCat("--listen=", address),
                                   absl::StrCat("--advertise=", address),
                                   absl::StrCat("--coordinator=", coordinator_address_),
                                   absl::StrCat("--worker_id=", id),
                                   "--backend=cpu",
                                   "--threads=1",
                                   "--memory_limit=512M"};
  for (auto& a : args) argv.push_back(std::move(a));
  const int n = worker_starts_[index]++;
  ASSIGN_OR_RETURN(workers_[index],
                   client::ChildProcess::Start(absl::StrCat("dfa-worker ", id), std::move(argv),
                                               absl::StrCat(log_dir_, "/", id, ".", n, ".log")));
  return absl::OkStatus();
}

void Daemons::KillWorker(int index) {
  auto it = workers_.find(index);
  if (it == workers_.end() || !it->second) return;
  it->second->Signal(SIGKILL);
  (void)it->second->Stop(absl::Seconds(5));
  it->second.reset();
}

absl::Status Daemons::MoveWorker(int index) {
  ASSIGN_OR_RETURN(worker_ports_[index], client::LocalCluster::FreePort());
  return absl::OkStatus();
}

std::string Daemons::worker_address(int index) const {
  return absl::StrCat("127.0.0.1:", worker_ports_.at(index));
}

bool Daemons::WaitForWorkerLog(int index, const std::string& needle, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    client::ChildProcess* w = workers_.at(index).get();
    if (w != nullptr && ReadAll(w->log_path()).find(needle) != std::string::npos) return true;
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
}

absl::StatusOr<v1::ListWorkersResponse> Daemons::ListWorkers(const std::string& token) {
  v1::ListWorkersResponse resp;
  grpc::Status s = stub_->ListWorkers(Context(token, absl::Seconds(2)).get(),
                                      v1::ListWorkersRequest(), &resp);
  if (!s.ok()) return absl::UnavailableError(absl::StrCat("ListWorkers: ", s.error_message()));
  return resp;
}

absl::Status Daemons::WaitForWorkers(int n, absl::Duration timeout, const std::string& token) {
  const absl::Time deadline = absl::Now() + timeout;
  int alive = 0;
  while (true) {
    auto list = ListWorkers(token);
    if (list.ok()) {
      alive = 0;
      for (const auto& w : list->workers()) alive += w.alive() ? 1 : 0;
      if (alive >= n) return absl::OkStatus();
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(alive, " of ", n, " workers alive after ",
                                                      absl::FormatDuration(timeout), "; logs in ",
                                                      log_dir_));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

v1::AttentionSpec SmallSpec() {
  v1::AttentionSpec spec;
  spec.set_batch(1);
  spec.set_q_heads(2);
  spec.set_kv_heads(1);
  spec.set_head_dim(32);
  spec.set_seq_len(256);
  spec.set_causal(true);
  spec.set_dtype(v1::DTYPE_F32);
  return spec;
}

std::unique_ptr<client::Client> ConnectClient(const Daemons& d, const std::string& token) {
  client::ClientOptions o;
  o.coordinator = d.coordinator_address();
  o.rpc_timeout = absl::Seconds(10);
  o.security.auth_token = token;
  auto c = client::Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

absl::StatusOr<std::unique_ptr<client::Session>> SessionWithForward(client::Client* c, int n,
                                                                    uint64_t seed) {
  client::SessionOptions so;
  so.spec = SmallSpec();
  so.num_workers = n;
  ASSIGN_OR_RETURN(std::unique_ptr<client::Session> session, c->CreateSession(so));
  RETURN_IF_ERROR(session->GenerateInputs(seed, /*with_grad_output=*/false));
  RETURN_IF_ERROR(session->Run(v1::JOB_FORWARD).status());
  return session;
}

}  // namespace dfa::testing
