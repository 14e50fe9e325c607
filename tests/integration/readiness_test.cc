// Readiness through a coordinator outage, on real processes: dfa-coordinator and dfa-worker from
// this build tree on loopback ports. What a Kubernetes probe or a load balancer sees:
//   - /healthz is 200 while the process runs;
//   - /readyz is 200 only when the daemon can serve (a coordinator with a live worker; a worker
//     registered with its coordinator, or standalone), else 503 with a one-line reason;
//   - the standard gRPC health service reports the same for "dfa.v1.Coordinator" /
//     "dfa.v1.Worker" and "" (the whole server).
// The outage: the coordinator is killed (SIGKILL); the worker must turn not ready within one
// lease plus a margin, stay alive, and be ready again soon after a coordinator comes back on the
// same address.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"

#ifndef DFA_COORDINATOR_BINARY
#error "DFA_COORDINATOR_BINARY must name the dfa-coordinator binary (tests/integration)"
#endif
#ifndef DFA_WORKER_BINARY
#error "DFA_WORKER_BINARY must name the dfa-worker binary (tests/integration)"
#endif

namespace {

constexpr int kLeaseMs = 900;
// Worker not ready after the coordinator dies: one lease after the last answered heartbeat
// (sent up to a heartbeat period before the kill), plus the health mirror's 100 ms period and
// scheduling slack on a loaded 2-core machine.
const absl::Duration kOutageBound = absl::Milliseconds(kLeaseMs + 2000);
// Registered and ready after a start: the registrar's retry and reconnect backoff are capped at
// a heartbeat period; the rest is process start-up.
constexpr absl::Duration kReadyBound = absl::Seconds(10);

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  const int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

struct HttpAnswer {
  int status = -1;  // -1: no HTTP answer (connection refused, ...)
  std::string body;
};

HttpAnswer HttpGet(int port, const std::string& path) {
  HttpAnswer out;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return out;
  timeval tv{3, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return out;
  }
  const std::string req =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return out;
  }
  std::string resp;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) resp.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t body = resp.find("\r\n\r\n");
  if (!absl::StartsWith(resp, "HTTP/1.") || body == std::string::npos || resp.size() < 12) {
    return out;
  }
  out.status = std::atoi(resp.substr(9, 3).c_str());
  out.body = resp.substr(body + 4);
  return out;
}

// grpc.health.v1.Health/Check of `service` at `address`: 1 SERVING, 2 NOT_SERVING, 0 unknown;
// -1 when the call fails (-2 for NOT_FOUND: the name is not registered).
int GrpcHealth(const std::string& address, const std::string& service) {
  static auto* const channels = new std::map<std::string, std::shared_ptr<grpc::Channel>>;
  auto& channel = (*channels)[address];
  if (!channel) channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  std::string bytes;
  if (!service.empty()) {  // field 1 (string), a name shorter than 128 bytes
    bytes.push_back(0x0a);
    bytes.push_back(static_cast<char>(service.size()));
    bytes += service;
  }
  grpc::Slice slice(bytes);
  const grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) return -2;
  if (!status.ok()) return -1;
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return -1;
  std::string got;
  for (const grpc::Slice& s : slices)
    got.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // HealthCheckResponse {ServingStatus status = 1;}: 0x08 <varint>; empty means UNKNOWN (0).
  if (got.size() >= 2 && got[0] == 0x08) return static_cast<uint8_t>(got[1]);
  return 0;
}

// Whether gRPC health of `service` at `address` reads `want` within `bound` (the daemon's
// statuses follow its readiness every 100 ms; the port answers shortly after the metrics port).
::testing::AssertionResult HealthBecomes(const std::string& address, const std::string& service,
                                         int want, absl::Duration bound = absl::Seconds(3)) {
  const absl::Time deadline = absl::Now() + bound;
  int got = GrpcHealth(address, service);
  while (got != want && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
    got = GrpcHealth(address, service);
  }
  if (got == want) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "gRPC health of '" << service << "' at " << address << " is " << got << " after "
         << absl::FormatDuration(bound) << ", want " << want
         << " (1 SERVING, 2 NOT_SERVING, -1 no answer)";
}

// Polls `pred` every 50 ms until it holds or `bound` passes; returns how long it took or
// InfiniteDuration on timeout.
absl::Duration WaitFor(absl::Duration bound, const std::function<bool()>& pred) {
  const absl::Time start = absl::Now();
  while (true) {
    if (pred()) return absl::Now() - start;
    if (absl::Now() - start > bound) return absl::InfiniteDuration();
    absl::SleepFor(absl::Milliseconds(50));
  }
}

// One daemon process; its output goes to <TempDir>/readiness_<name>_<pid>.log. Killed (SIGKILL)
// when destroyed.
class Daemon {
 public:
  Daemon(std::string name, const char* binary, std::vector<std::string> args)
      : log_(absl::StrCat(::testing::TempDir(), "/readiness_", name, "_", getpid(), ".log")) {
    args.insert(args.begin(), binary);
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(binary, argv.data());
      dprintf(2, "execv %s: %s\n", binary, std::strerror(errno));
      _exit(127);
    }
  }
  // The log stays for a failed test (its messages name it) and goes otherwise.
  ~Daemon() {
    Kill();
    if (!::testing::Test::HasFailure()) unlink(log_.c_str());
  }

  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  bool Running() const { return pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0; }
  const std::string& log() const { return log_; }

 private:
  std::string log_;
  pid_t pid_ = -1;
};

std::unique_ptr<Daemon> StartCoordinator(int port, int metrics_port) {
  return std::make_unique<Daemon>(
      "coordinator", DFA_COORDINATOR_BINARY,
      std::vector<std::string>{absl::StrCat("--listen=127.0.0.1:", port),
                               absl::StrCat("--metrics_port=", metrics_port),
                               absl::StrCat("--lease_ms=", kLeaseMs)});
}

std::unique_ptr<Daemon> StartWorker(int port, int metrics_port, const std::string& coordinator) {
  std::vector<std::string> args = {absl::StrCat("--listen=127.0.0.1:", port),
                                   absl::StrCat("--metrics_port=", metrics_port), "--threads=1",
                                   "--memory_limit_bytes=268435456"};
  if (!coordinator.empty()) args.push_back(absl::StrCat("--coordinator=", coordinator));
  return std::make_unique<Daemon>("worker", DFA_WORKER_BINARY, args);
}

bool Ready(int metrics_port) { return HttpGet(metrics_port, "/readyz").status == 200; }
bool NotReady(int metrics_port) { return HttpGet(metrics_port, "/readyz").status == 503; }

TEST(ReadinessTest, CoordinatorWithoutWorkersIsAliveButNotReady) {
  const int port = FreePort(), metrics = FreePort();
  ASSERT_GT(port, 0);
  auto coordinator = StartCoordinator(port, metrics);
  const std::string address = absl::StrCat("127.0.0.1:", port);
  ASSERT_NE(WaitFor(kReadyBound, [&] { return HttpGet(metrics, "/healthz").status == 200; }),
            absl::InfiniteDuration())
      << "no /healthz; log " << coordinator->log();
  EXPECT_EQ(HttpGet(metrics, "/healthz").body, "ok\n");
  const HttpAnswer ready = HttpGet(metrics, "/readyz");
  EXPECT_EQ(ready.status, 503);
  EXPECT_EQ(ready.body, "not ready: no live worker (none registered with a valid lease)\n");
  EXPECT_TRUE(HealthBecomes(address, "dfa.v1.Coordinator", 2));
  EXPECT_TRUE(HealthBecomes(address, "", 2));
  EXPECT_EQ(HttpGet(metrics, "/nope").status, 404);
  // /metrics is still the Prometheus endpoint beside the probes.
  EXPECT_TRUE(absl::StrContains(HttpGet(metrics, "/metrics").body, "dfa_build_info{"));
}

TEST(ReadinessTest, StandaloneWorkerIsReady) {
  const int port = FreePort(), metrics = FreePort();
  auto worker = StartWorker(port, metrics, "");
  ASSERT_NE(WaitFor(kReadyBound, [&] { return Ready(metrics); }), absl::InfiniteDuration())
      << HttpGet(metrics, "/readyz").body << "; log " << worker->log();
  EXPECT_EQ(HttpGet(metrics, "/readyz").body, "ready\n");
  const std::string address = absl::StrCat("127.0.0.1:", port);
  EXPECT_TRUE(HealthBecomes(address, "dfa.v1.Worker", 1));
  EXPECT_TRUE(HealthBecomes(address, "", 1));
}

TEST(ReadinessTest, WorkerFollowsItsCoordinatorThroughAnOutage) {
  const int cport = FreePort(), cmetrics = FreePort(), wport = FreePort(), wmetrics = FreePort();
  const std::string caddress = absl::StrCat("127.0.0.1:", cport);
  const std::string waddress = absl::StrCat("127.0.0.1:", wport);

  // A worker whose coordinator is not up yet: alive, not ready, saying why.
  auto worker = StartWorker(wport, wmetrics, caddress);
  ASSERT_NE(WaitFor(kReadyBound, [&] { return HttpGet(wmetrics, "/healthz").status == 200; }),
            absl::InfiniteDuration())
      << "log " << worker->log();
  HttpAnswer ready = HttpGet(wmetrics, "/readyz");
  EXPECT_EQ(ready.status, 503);
  EXPECT_EQ(ready.body,
            absl::StrCat("not ready: not registered with the coordinator at ", caddress, "\n"));
  EXPECT_TRUE(HealthBecomes(waddress, "dfa.v1.Worker", 2));
  EXPECT_TRUE(HealthBecomes(waddress, "", 2));
  auto coordinator = StartCoordinator(cport, cmetrics);
  ASSERT_NE(WaitFor(kReadyBound, [&] { return Ready(wmetrics) && Ready(cmetrics); }),
            absl::InfiniteDuration())
      << "worker: " << HttpGet(wmetrics, "/readyz").body
      << " coordinator: " << HttpGet(cmetrics, "/readyz").body << "; logs " << worker->log() << " "
      << coordinator->log();
  EXPECT_TRUE(HealthBecomes(waddress, "dfa.v1.Worker", 1));
  EXPECT_TRUE(HealthBecomes(waddress, "", 1));
  EXPECT_TRUE(HealthBecomes(caddress, "dfa.v1.Coordinator", 1));
  EXPECT_TRUE(HealthBecomes(caddress, "", 1));

  // The outage: the worker turns not ready within the bound, and stays alive.
  coordinator->Kill();
  const absl::Duration took = WaitFor(kOutageBound, [&] { return NotReady(wmetrics); });
  ASSERT_NE(took, absl::InfiniteDuration())
      << "worker still ready " << absl::FormatDuration(kOutageBound)
      << " after its coordinator died: " << HttpGet(wmetrics, "/readyz").body;
  std::printf("worker /readyz 503 %s after the coordinator was killed (lease %d ms)\n",
              absl::FormatDuration(took).c_str(), kLeaseMs);
  ready = HttpGet(wmetrics, "/readyz");
  EXPECT_TRUE(absl::StartsWith(ready.body, "not ready: "));
  EXPECT_TRUE(absl::StrContains(ready.body, caddress)) << ready.body;
  EXPECT_EQ(HttpGet(wmetrics, "/healthz").status, 200);
  // gRPC health follows within the mirror's period (100 ms; 500 ms allowed).
  EXPECT_TRUE(HealthBecomes(waddress, "dfa.v1.Worker", 2, absl::Milliseconds(500)));
  EXPECT_TRUE(HealthBecomes(waddress, "", 2, absl::Milliseconds(500)));
  EXPECT_TRUE(worker->Running());

  // A coordinator comes back on the same address: the worker is ready again.
  const int cmetrics2 = FreePort();
  coordinator = StartCoordinator(cport, cmetrics2);
  const absl::Duration back =
      WaitFor(kReadyBound, [&] { return Ready(wmetrics) && Ready(cmetrics2); });
  ASSERT_NE(back, absl::InfiniteDuration())
      << "worker: " << HttpGet(wmetrics, "/readyz").body
      << " coordinator: " << HttpGet(cmetrics2, "/readyz").body << "; logs " << worker->log() << " "
      << coordinator->log();
  std::printf("worker and coordinator ready %s after the coordinator restarted\n",
              absl::FormatDuration(back).c_str());
  EXPECT_TRUE(HealthBecomes(waddress, "dfa.v1.Worker", 1));
  EXPECT_TRUE(HealthBecomes(waddress, "", 1));
  EXPECT_TRUE(HealthBecomes(caddress, "dfa.v1.Coordinator", 1));
}

}  // namespace
