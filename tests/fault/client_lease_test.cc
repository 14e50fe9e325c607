// Fault: a client process SIGKILLed while it holds a session gives the session back within the
// coordinator's client-lease grace, not at the session's time-to-live (Coordinator.HoldLease).
// Real processes on loopback (daemons.h): dfa-coordinator with short lease settings, two CPU
// dfa-worker daemons, and the client being killed is the `dfa submit` command in the middle of
// a long forward job whose inputs went over shared memory. A second, live client (this test,
// through the client library, with its own lease and shared-memory segments) is untouched.
//
// Also over the real coordinator: a lease's secret is needed to create a session under it or
// to re-attach (PERMISSION_DENIED), a re-attach within the grace keeps the sessions, a session
// without a lease keeps its time-to-live, and the limits answer RESOURCE_EXHAUSTED; HoldLease
// needs the client token like every client rpc.
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/child_process.h"
#include "client/client.h"
#include "client/host_tensor.h"
#include "client/local_cluster.h"
#include "core/session_capability.h"
#include "gtest/gtest.h"
#include "tests/fault/daemons.h"
#include "tests/integration/metrics_scrape.h"

namespace dfa {
namespace {

using testing::Context;
using testing::Daemons;

constexpr int kGraceMs = 1500;
const std::vector<std::string> kLeaseFlags = {
    "--client_lease_beat_ms=200", "--client_lease_timeout_ms=1000",
    absl::StrCat("--client_lease_grace_ms=", kGraceMs), "--lease_ms=1000"};

// Shared-memory segments a worker holds: its memfds (worker/shm_mappings.cc names them).
int MemfdCount(pid_t pid) {
  const std::string dir = absl::StrCat("/proc/", pid, "/fd");
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) {
    char target[256] = {0};
    const std::string link = absl::StrCat(dir, "/", e->d_name);
    const ssize_t len = readlink(link.c_str(), target, sizeof(target) - 1);
    if (len > 0 && absl::StartsWith(target, "/memfd:dfa-shm")) ++n;
  }
  closedir(d);
  return n;
}

v1::ClusterStatus Status(Daemons& d, const std::string& token = "") {
  v1::ClusterStatus st;
  grpc::Status s = d.stub()->GetStatus(Context(token).get(), v1::GetStatusRequest(), &st);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return st;
}

// What the workers hold, as they report it.
struct WorkerState {
  int sessions = 0;   // dfa_worker_sessions, summed
  double memory = 0;  // dfa_worker_memory_used_bytes, summed
  int segments = 0;   // memfds, summed
  bool operator==(const WorkerState& o) const {
    return sessions == o.sessions && memory == o.memory && segments == o.segments;
  }
};
std::ostream& operator<<(std::ostream& os, const WorkerState& w) {
  return os << "{sessions " << w.sessions << ", memory " << w.memory << " bytes, segments "
            << w.segments << "}";
}

// A TCP relay on 127.0.0.1 to `target_port` whose connections Cut() resets at once: a network
// blip between a client and the coordinator. Thread per connection; for tests only.
class BlipProxy {
 public:
  explicit BlipProxy(int target_port) : target_(target_port) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 ||
        listen(listen_fd_, 16) != 0 ||
        getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ADD_FAILURE() << "BlipProxy: " << std::strerror(errno);
      return;
    }
    port_ = ntohs(a.sin_port);
    accept_ = std::thread([this] { Accept(); });
  }
  ~BlipProxy() {
    stop_ = true;
    shutdown(listen_fd_, SHUT_RDWR);
    close(listen_fd_);
    Cut();
    if (accept_.joinable()) accept_.join();
    for (std::thread& t : pumps_) t.join();
  }
  int port() const { return port_; }
  // Resets every open connection (both sides see it end).
  void Cut() {
    std::lock_guard<std::mutex> l(mu_);
    for (int fd : open_) {
      linger off{1, 0};  // RST, as the kernel sends for a killed peer
      setsockopt(fd, SOL_SOCKET, SO_LINGER, &off, sizeof(off));
      shutdown(fd, SHUT_RDWR);
    }
    open_.clear();
  }

 private:
  void Accept() {
    while (!stop_) {
      const int in = accept(listen_fd_, nullptr, nullptr);
      if (in < 0) return;
      const int out = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<uint16_t>(target_));
      if (connect(out, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        close(in);
        close(out);
        continue;
      }
      std::lock_guard<std::mutex> l(mu_);
      open_.push_back(in);
      open_.push_back(out);
      pumps_.emplace_back([in, out] { Pump(in, out); });
    }
  }
  static void Pump(int a, int b) {
    char buf[1 << 14];
    pollfd fds[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
    while (poll(fds, 2, 200) >= 0) {
      bool done = false;
      for (int i = 0; i < 2 && !done; ++i) {
        if (fds[i].revents == 0) continue;
        const ssize_t n = read(fds[i].fd, buf, sizeof(buf));
        // send(MSG_NOSIGNAL): a peer that is gone fails the write instead of raising SIGPIPE.
        done = n <= 0 || send(fds[1 - i].fd, buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n;
      }
      if (done) break;
    }
    close(a);
    close(b);
  }

  const int target_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread accept_;
  std::mutex mu_;
  std::vector<int> open_;
  std::vector<std::thread> pumps_;
};

class ClientLeaseFaultTest : public ::testing::Test {
 protected:
  void Start(std::vector<std::string> coordinator_args, const std::string& token = "") {
    auto d = Daemons::Create();
    ASSERT_TRUE(d.ok()) << d.status();
    d_ = std::move(*d);
    token_ = token;
    auto metrics = client::LocalCluster::FreePort();
    ASSERT_TRUE(metrics.ok());
    coordinator_metrics_port_ = *metrics;
    coordinator_args.push_back(absl::StrCat("--metrics_port=", *metrics));
    ASSERT_TRUE(d_->StartCoordinator(std::move(coordinator_args), token).ok());
    for (int i = 0; i < 2; ++i) {
      auto port = client::LocalCluster::FreePort();
      ASSERT_TRUE(port.ok());
      metrics_ports_.push_back(*port);
      ASSERT_TRUE(d_->StartWorker(i, {absl::StrCat("--metrics_port=", *port)}).ok());
    }
    ASSERT_TRUE(d_->WaitForWorkers(2, absl::Seconds(30), token).ok());
  }

  WorkerState Workers() {
    WorkerState w;
    for (int i = 0; i < 2; ++i) {
      auto body = testing::ScrapeMetrics(metrics_ports_[i]);
      EXPECT_TRUE(body.ok()) << body.status();
      if (!body.ok()) continue;
      w.sessions += static_cast<int>(testing::SumMetric(*body, "dfa_worker_sessions"));
      w.memory += testing::SumMetric(*body, "dfa_worker_memory_used_bytes");
      w.segments += MemfdCount(d_->worker(i)->pid());
    }
    return w;
  }

  double CoordinatorMetric(const std::string& name,
                           const std::map<std::string, std::string>& labels = {}) {
    auto body = testing::ScrapeMetrics(coordinator_metrics_port_);
    EXPECT_TRUE(body.ok()) << body.status();
    return body.ok() ? testing::SumMetric(*body, name, labels) : -1;
  }

  grpc::Status Release(const v1::CreateSessionResponse& session) {
    v1::ReleaseSessionRequest req;
    req.set_session_id(session.session_id());
    req.set_client_id("raw-lease-test");
    auto ctx = Context(token_);
    AttachCapability(ctx.get(), session.session_capability());
    v1::ReleaseSessionResponse resp;
    return d_->stub()->ReleaseSession(ctx.get(), req, &resp);
  }

  // A raw HoldLease stream (the protocol as any client speaks it).
  struct RawLease {
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::ClientReaderWriter<v1::LeaseBeat, v1::LeaseState>> stream;
    v1::LeaseState state;
    grpc::Status status;  // when the first answer did not come
  };
  RawLease OpenLease(const std::string& id = "", const std::string& secret = "") {
    RawLease l;
    l.ctx = std::make_unique<grpc::ClientContext>();
    if (!token_.empty()) l.ctx->AddMetadata("authorization", "Bearer " + token_);
    l.stream = d_->stub()->HoldLease(l.ctx.get());
    v1::LeaseBeat beat;
    beat.set_lease_id(id);
    beat.set_lease_secret(secret);
    beat.set_client_id("raw-lease-test");
    if (!l.stream->Write(beat) || !l.stream->Read(&l.state)) {
      l.status = l.stream->Finish();
      l.stream.reset();
    }
    return l;
  }

  grpc::Status CreateSession(const std::string& lease_id, const std::string& secret,
                             v1::CreateSessionResponse* resp) {
    v1::CreateSessionRequest req;
    *req.mutable_spec() = testing::SmallSpec();
    req.set_client_id("raw-lease-test");
    req.set_lease_id(lease_id);
    auto ctx = Context(token_);
    if (!secret.empty()) ctx->AddMetadata(kLeaseSecretMetadata, secret);
    return d_->stub()->CreateSession(ctx.get(), req, resp);
  }

  std::unique_ptr<Daemons> d_;
  std::string token_;
  int coordinator_metrics_port_ = 0;
  std::vector<int> metrics_ports_;
};

TEST_F(ClientLeaseFaultTest, KilledClientsSessionAndSegmentsAreReclaimedWithinTheGrace) {
  ASSERT_NO_FATAL_FAILURE(Start(kLeaseFlags));
  // The live client: a session under its own lease, its Q sent over shared memory.
  std::unique_ptr<client::Client> live = testing::ConnectClient(*d_);
  ASSERT_NE(live, nullptr);
  client::SessionOptions so;
  so.spec = testing::SmallSpec();
  auto session = live->CreateSession(so);
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_TRUE(absl::StartsWith(live->lease_id(), "l-")) << live->lease_id();
  auto q = client::MakeTensor(so.spec, v1::TENSOR_Q);
  ASSERT_TRUE(q.ok());
  client::FillRandom(7, &*q);
  client::TransferOptions shm;
  shm.path = client::TransferPath::kSharedMemory;
  ASSERT_TRUE((*session)->Upload(v1::TENSOR_Q, *q, shm).ok());
  // A session without a lease (an older client): only its time-to-live applies to it.
  v1::CreateSessionResponse unleased;
  ASSERT_TRUE(CreateSession("", "", &unleased).ok());
  ASSERT_EQ(Status(*d_).sessions(), 2);
  const WorkerState before = Workers();
  ASSERT_GE(before.segments, 2) << "the live client's segments, one per worker";

  // The client to kill: `dfa submit` with a forward job long enough to be killed inside it.
  auto dfa = client::LocalCluster::FindBinary("", "client", "dfa");
  ASSERT_TRUE(dfa.ok()) << dfa.status();
  auto victim = client::ChildProcess::Start(
      "dfa submit",
      {*dfa, "submit", "--coordinator", d_->coordinator_address(), "--seq", "64K", "--heads", "4",
       "--head-dim", "64", "--forward-only", "--path", "shm"},
      absl::StrCat(d_->log_dir(), "/submit.log"));
  ASSERT_TRUE(victim.ok()) << victim.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (Status(*d_).jobs_running() < 1) {
    ASSERT_TRUE((*victim)->Running()) << (*victim)->LogTail(20);
    ASSERT_LT(absl::Now(), deadline) << "dfa submit never started its job";
    absl::SleepFor(absl::Milliseconds(20));
  }
  const WorkerState during = Workers();
  EXPECT_EQ(Status(*d_).sessions(), 3);
  EXPECT_EQ(Status(*d_).client_leases(), 2);
  EXPECT_GT(during.segments, before.segments) << "dfa submit sent its inputs by shared memory";
  EXPECT_GT(during.memory, before.memory);

  (*victim)->Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  // Back to what the live clients hold: the coordinator's sessions, then the workers'.
  absl::Duration sessions_back = absl::InfiniteDuration();
  absl::Duration workers_back = absl::InfiniteDuration();
  WorkerState now;
  while (absl::Now() - killed < absl::Milliseconds(kGraceMs) + absl::Seconds(5)) {
    if (sessions_back == absl::InfiniteDuration() && Status(*d_).sessions() == 2 &&
        Status(*d_).jobs_running() == 0) {
      sessions_back = absl::Now() - killed;
    }
    now = Workers();
    if (sessions_back != absl::InfiniteDuration() && now == before) {
      workers_back = absl::Now() - killed;
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::cout << "sessions back after " << sessions_back << ", workers' memory and segments after "
            << workers_back << " (grace " << kGraceMs << " ms)" << std::endl;
  ASSERT_NE(sessions_back, absl::InfiniteDuration()) << "the killed client's session is kept";
  EXPECT_GE(sessions_back, absl::Milliseconds(kGraceMs - 100)) << "released before the grace";
  ASSERT_NE(workers_back, absl::InfiniteDuration())
      << "workers hold " << now << ", want " << before;
  EXPECT_EQ(Status(*d_).client_leases(), 1);
  EXPECT_EQ(CoordinatorMetric("dfa_coordinator_lease_reclaimed_sessions_total"), 1);
  EXPECT_EQ(CoordinatorMetric("dfa_coordinator_client_leases"), 1);

  // One line in the coordinator's log says so.
  std::ifstream log(d_->coordinator()->log_path());
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(absl::StrContains(text, "lost (its stream ended without a close)") &&
              absl::StrContains(text, "released its 1 sessions"))
      << d_->coordinator()->LogTail(10);

  // The live client's session is untouched: its Q comes back, a forward job runs on it.
  client::HostTensor back;
  ASSERT_TRUE((*session)->Download(v1::TENSOR_Q, &back, shm).ok());
  EXPECT_EQ(0, std::memcmp(back.data(), q->data(), static_cast<size_t>(q->size_bytes())));
  ASSERT_TRUE((*session)->GenerateInputs(3, false).ok());
  EXPECT_TRUE((*session)->Run(v1::JOB_FORWARD).ok());
  // And the session without a lease is still there (its time-to-live is minutes).
  EXPECT_TRUE(Release(unleased).ok());
  ASSERT_TRUE((*session)->Release().ok());
  EXPECT_EQ(Status(*d_).sessions(), 0);
}

TEST_F(ClientLeaseFaultTest, ReattachWithinTheGraceKeepsTheSessions) {
  ASSERT_NO_FATAL_FAILURE(Start(kLeaseFlags));
  RawLease lease = OpenLease();
  ASSERT_NE(lease.stream, nullptr) << lease.status.error_message();
  const std::string id = lease.state.lease_id();
  const std::string secret = lease.state.lease_secret();
  ASSERT_FALSE(id.empty());
  ASSERT_FALSE(secret.empty());
  EXPECT_EQ(lease.state.grace_ms(), kGraceMs);
  EXPECT_EQ(lease.state.beat_interval_ms(), 200);
  v1::CreateSessionResponse session;
  grpc::Status s = CreateSession(id, secret, &session);
  ASSERT_TRUE(s.ok()) << s.error_message();

  // The connection breaks (as in a network blip); the client re-attaches within the grace.
  lease.ctx->TryCancel();
  (void)lease.stream->Finish();
  absl::SleepFor(absl::Milliseconds(kGraceMs / 3));
  RawLease again = OpenLease(id, secret);
  ASSERT_NE(again.stream, nullptr) << again.status.error_message();
  EXPECT_EQ(again.state.lease_id(), id);
  EXPECT_TRUE(again.state.lease_secret().empty()) << "the secret is sent only once";
  EXPECT_EQ(again.state.sessions(), 1);
  // Beats keep it well past the grace; the session stays.
  const absl::Time until = absl::Now() + absl::Milliseconds(2 * kGraceMs + 500);
  while (absl::Now() < until) {
    v1::LeaseBeat beat;
    ASSERT_TRUE(again.stream->Write(beat));
    ASSERT_TRUE(again.stream->Read(&again.state));
    EXPECT_EQ(again.state.sessions(), 1);
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_EQ(Status(*d_).sessions(), 1);
  EXPECT_EQ(CoordinatorMetric("dfa_coordinator_lease_reclaimed_sessions_total"), 0);

  // A clean close ends the lease; the session keeps its time-to-live (released here).
  v1::LeaseBeat close;
  close.set_close(true);
  ASSERT_TRUE(again.stream->Write(close));
  again.stream->WritesDone();
  grpc::Status closed = again.stream->Finish();
  EXPECT_TRUE(closed.ok()) << closed.error_message();
  EXPECT_EQ(Status(*d_).client_leases(), 0);
  absl::SleepFor(absl::Milliseconds(kGraceMs + 500));
  EXPECT_EQ(Status(*d_).sessions(), 1);
  EXPECT_TRUE(Release(session).ok());
  // The ended lease cannot be re-attached to: NOT_FOUND (a client then opens a new one).
  RawLease late = OpenLease(id, secret);
  EXPECT_EQ(late.stream, nullptr);
  EXPECT_EQ(late.status.error_code(), grpc::StatusCode::NOT_FOUND) << late.status.error_message();
}

TEST_F(ClientLeaseFaultTest, TheLibraryReattachesAfterANetworkBlipAndKeepsItsSession) {
  std::vector<std::string> args = kLeaseFlags;
  args.push_back("--client_lease_grace_ms=4000");  // the last one wins: room for a reconnect
  ASSERT_NO_FATAL_FAILURE(Start(args));
  const int coordinator_port =
      std::stoi(d_->coordinator_address().substr(d_->coordinator_address().rfind(':') + 1));
  BlipProxy proxy(coordinator_port);
  ASSERT_GT(proxy.port(), 0);
  client::ClientOptions o;
  o.coordinator = absl::StrCat("127.0.0.1:", proxy.port());
  o.rpc_timeout = absl::Seconds(10);
  auto c = client::Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  client::SessionOptions so;
  so.spec = testing::SmallSpec();
  auto session = (*c)->CreateSession(so);
  ASSERT_TRUE(session.ok()) << session.status();
  const std::string lease = (*c)->lease_id();
  ASSERT_FALSE(lease.empty());
  // The connection is reset under the lease stream; the library re-attaches on a new one.
  proxy.Cut();
  absl::SleepFor(absl::Milliseconds(4000 + 2000));  // past the grace
  EXPECT_EQ(Status(*d_).sessions(), 1) << "the session survived the blip";
  EXPECT_EQ(Status(*d_).client_leases(), 1);
  EXPECT_EQ((*c)->lease_id(), lease) << "the same lease, re-attached";
  // The cut really ended a lease stream (answered CANCELLED), and a new one holds the lease.
  EXPECT_GE(CoordinatorMetric("dfa_coordinator_requests_total",
                              {{"rpc", "HoldLease"}, {"code", "CANCELLED"}}),
            1);
  EXPECT_EQ(CoordinatorMetric("dfa_coordinator_lease_reclaimed_sessions_total"), 0);
  ASSERT_TRUE((*session)->GenerateInputs(1, false).ok());
  EXPECT_TRUE((*session)->Run(v1::JOB_FORWARD).ok());
  ASSERT_TRUE((*session)->Release().ok());
}

TEST_F(ClientLeaseFaultTest, AnotherClientsLeaseCannotBeUsedOrTaken) {
  ASSERT_NO_FATAL_FAILURE(Start(kLeaseFlags));
  RawLease victim = OpenLease();
  ASSERT_NE(victim.stream, nullptr) << victim.status.error_message();
  const std::string id = victim.state.lease_id();
  std::string wrong = victim.state.lease_secret();
  wrong[5] = wrong[5] == 'x' ? 'y' : 'x';
  v1::CreateSessionResponse session;
  ASSERT_TRUE(CreateSession(id, victim.state.lease_secret(), &session).ok());

  // Creating under it without, or with a wrong, secret: PERMISSION_DENIED naming the field.
  for (const std::string& secret : {std::string(), wrong}) {
    v1::CreateSessionResponse resp;
    grpc::Status s = CreateSession(id, secret, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_TRUE(absl::StrContains(s.error_message(), "lease_secret")) << s.error_message();
  }
  v1::CreateSessionResponse resp;
  grpc::Status unknown = CreateSession("l-0123456789abcdef0123456789abcdef", wrong, &resp);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND) << unknown.error_message();
  // Re-attaching with a wrong secret is refused and ends nothing of the victim's.
  RawLease thief = OpenLease(id, wrong);
  EXPECT_EQ(thief.stream, nullptr);
  EXPECT_EQ(thief.status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << thief.status.error_message();
  absl::SleepFor(absl::Milliseconds(kGraceMs + 500));
  v1::LeaseBeat beat;
  ASSERT_TRUE(victim.stream->Write(beat));
  ASSERT_TRUE(victim.stream->Read(&victim.state));
  EXPECT_EQ(victim.state.sessions(), 1);
  EXPECT_EQ(Status(*d_).sessions(), 1);

  // The victim's own process dies (its stream is cut): its session goes after the grace.
  victim.ctx->TryCancel();
  (void)victim.stream->Finish();
  const absl::Time cut = absl::Now();
  while (Status(*d_).sessions() != 0 && absl::Now() - cut < absl::Seconds(10)) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(Status(*d_).sessions(), 0);
  EXPECT_GE(absl::Now() - cut, absl::Milliseconds(kGraceMs - 100));
}

TEST_F(ClientLeaseFaultTest, AfterACoordinatorRestartTheClientTakesANewLease) {
  ASSERT_NO_FATAL_FAILURE(Start(kLeaseFlags));
  std::unique_ptr<client::Client> c = testing::ConnectClient(*d_);
  ASSERT_NE(c, nullptr);
  client::SessionOptions so;
  so.spec = testing::SmallSpec();
  auto first = c->CreateSession(so);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string old_lease = c->lease_id();
  ASSERT_FALSE(old_lease.empty());
  // The coordinator dies (its sessions and leases with it) and comes back on its address.
  d_->KillCoordinator();
  std::vector<std::string> args = kLeaseFlags;
  args.push_back(absl::StrCat("--metrics_port=", coordinator_metrics_port_));
  ASSERT_TRUE(d_->StartCoordinator(args).ok());
  ASSERT_TRUE(d_->WaitForWorkers(2, absl::Seconds(30)).ok());
  // At once, before the lease stream noticed: the old lease is unknown, the library takes a new
  // one and the session is created under it.
  auto second = c->CreateSession(so);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(c->lease_id(), old_lease);
  EXPECT_TRUE(absl::StartsWith(c->lease_id(), "l-")) << c->lease_id();
  EXPECT_EQ(Status(*d_).client_leases(), 1);
  EXPECT_EQ(Status(*d_).sessions(), 1);
  first->reset();  // its release answers NOT_FOUND (the coordinator forgot it): no matter
  ASSERT_TRUE((*second)->Release().ok());
  // A clean end of the client closes its lease at once.
  c.reset();
  EXPECT_EQ(Status(*d_).client_leases(), 0);
}

TEST_F(ClientLeaseFaultTest, LimitsAndTheTokenApplyToLeases) {
  const std::string token = "lease-test-token-0123456789";
  std::vector<std::string> args = kLeaseFlags;
  args.push_back("--max_client_leases=2");
  args.push_back("--max_sessions_per_lease=1");
  args.push_back("--auth_token=" + token);
  ASSERT_NO_FATAL_FAILURE(Start(args, token));
  // Without the token: UNAUTHENTICATED, like every client rpc.
  {
    grpc::ClientContext ctx;
    auto stream = d_->stub()->HoldLease(&ctx);
    v1::LeaseBeat beat;
    v1::LeaseState state;
    EXPECT_FALSE(stream->Write(beat) && stream->Read(&state));
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  RawLease a = OpenLease();
  ASSERT_NE(a.stream, nullptr) << a.status.error_message();
  RawLease b = OpenLease();
  ASSERT_NE(b.stream, nullptr) << b.status.error_message();
  RawLease c = OpenLease();
  EXPECT_EQ(c.stream, nullptr);
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StrContains(c.status.error_message(), "--max_client_leases"))
      << c.status.error_message();

  v1::CreateSessionResponse first, second;
  ASSERT_TRUE(CreateSession(a.state.lease_id(), a.state.lease_secret(), &first).ok());
  grpc::Status s = CreateSession(a.state.lease_id(), a.state.lease_secret(), &second);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "--max_sessions_per_lease"))
      << s.error_message();
  EXPECT_EQ(Status(*d_, token).sessions(), 1);

  // The client library through the same limits: a third lease is refused with the message.
  auto lib = testing::ConnectClient(*d_, token);
  ASSERT_NE(lib, nullptr);
  client::SessionOptions so;
  so.spec = testing::SmallSpec();
  auto refused = lib->CreateSession(so);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "--max_client_leases"))
      << refused.status();
  // A client that holds no lease (ClientOptions::hold_lease = false) is not limited by them; its
  // session has the time-to-live alone.
  client::ClientOptions o;
  o.coordinator = d_->coordinator_address();
  o.security.auth_token = token;
  o.hold_lease = false;
  auto unleased = client::Client::Connect(o);
  ASSERT_TRUE(unleased.ok()) << unleased.status();
  auto session = (*unleased)->CreateSession(so);
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ((*unleased)->lease_id(), "");
  EXPECT_EQ(Status(*d_, token).client_leases(), 2);
  ASSERT_TRUE((*session)->Release().ok());
  EXPECT_TRUE(Release(first).ok());
}

}  // namespace
}  // namespace dfa
