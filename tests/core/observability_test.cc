// core/observability: the metrics port's /healthz, /readyz and /metrics (MetricsHttpServer), the
// process metrics read from /proc/self, dfa_build_info, and readiness mirrored into gRPC health.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/observability/metrics_http_server.h"
#include "core/observability/process_metrics.h"
#include "core/observability/readiness.h"
#include "core/version.h"
#include "prometheus/counter.h"

namespace dfa {
namespace {

struct Http {
  int status = -1;
  std::string headers, body;
};

Http Request(int port, const std::string& method, const std::string& path) {
  Http out;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
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
      absl::StrCat(method, " ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  std::string resp;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) resp.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t split = resp.find("\r\n\r\n");
  if (resp.size() < 12 || split == std::string::npos) return out;
  out.status = std::atoi(resp.substr(9, 3).c_str());
  out.headers = resp.substr(0, split);
  out.body = resp.substr(split + 4);
  return out;
}

const prometheus::MetricFamily* Find(const std::vector<prometheus::MetricFamily>& families,
                                     const std::string& name) {
  for (const auto& f : families) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

TEST(ProcessCollectorTest, ReportsThisProcess) {
  ProcessCollector collector;
  const std::vector<prometheus::MetricFamily> families = collector.Collect();
  for (const char* name : {"process_cpu_seconds_total", "process_resident_memory_bytes",
                           "process_virtual_memory_bytes", "process_open_fds", "process_max_fds",
                           "process_start_time_seconds"}) {
    const prometheus::MetricFamily* f = Find(families, name);
    ASSERT_NE(f, nullptr) << name;
    ASSERT_EQ(f->metric.size(), 1u) << name;
  }
  EXPECT_EQ(Find(families, "process_cpu_seconds_total")->type, prometheus::MetricType::Counter);
  EXPECT_EQ(Find(families, "process_open_fds")->type, prometheus::MetricType::Gauge);
  EXPECT_GE(Find(families, "process_cpu_seconds_total")->metric[0].counter.value, 0);
  // Resident memory: more than a megabyte (gtest alone), less than the virtual size.
  const double rss = Find(families, "process_resident_memory_bytes")->metric[0].gauge.value;
  EXPECT_GT(rss, 1 << 20);
  EXPECT_LE(rss, Find(families, "process_virtual_memory_bytes")->metric[0].gauge.value);
  // Started within the last hour, not in the future (clock-tick rounding: 1 s of slack).
  const double start = Find(families, "process_start_time_seconds")->metric[0].gauge.value;
  const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  EXPECT_LE(start, now + 1);
  EXPECT_GT(start, now - 3600);
  // Open descriptors: opening one more shows.
  const double fds = Find(families, "process_open_fds")->metric[0].gauge.value;
  EXPECT_GE(fds, 3);
  const int fd = open("/proc/self/stat", O_RDONLY);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(Find(collector.Collect(), "process_open_fds")->metric[0].gauge.value, fds + 1);
  close(fd);
  EXPECT_GE(Find(families, "process_max_fds")->metric[0].gauge.value, fds);
}

TEST(MetricsHttpServerTest, ServesProbesBesideMetrics) {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter()
      .Name("dfa_test_total")
      .Help("test")
      .Register(*registry)
      .Add({})
      .Increment(3);
  std::atomic<bool> ready{false};
  MetricsHttpServer server;
  absl::StatusOr<int> port = server.Start(
      "127.0.0.1:0", registry, [&]() -> std::string { return ready ? "" : "no live worker"; });
  ASSERT_TRUE(port.ok()) << port.status();
  ASSERT_GT(*port, 0);
  EXPECT_EQ(server.port(), *port);

  Http h = Request(*port, "GET", "/healthz");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.body, "ok\n");
  h = Request(*port, "GET", "/readyz");
  EXPECT_EQ(h.status, 503);
  EXPECT_EQ(h.body, "not ready: no live worker\n");
  EXPECT_TRUE(absl::StrContains(h.headers, "Content-Type: text/plain")) << h.headers;
  ready = true;
  h = Request(*port, "GET", "/readyz");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.body, "ready\n");
  h = Request(*port, "HEAD", "/readyz");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.body, "");
  EXPECT_EQ(Request(*port, "POST", "/healthz").status, 405);
  EXPECT_EQ(Request(*port, "GET", "/readyz/x").status, 404);

  h = Request(*port, "GET", "/metrics");
  EXPECT_EQ(h.status, 200);
  EXPECT_TRUE(absl::StrContains(h.body, "dfa_test_total 3")) << h.body;
  EXPECT_TRUE(absl::StrContains(h.body, "# TYPE process_cpu_seconds_total counter")) << h.body;
  EXPECT_TRUE(absl::StrContains(h.body, "# TYPE process_resident_memory_bytes gauge"));
  EXPECT_TRUE(absl::StrContains(
      h.body, absl::StrCat("dfa_build_info{build_type=\"", std::string(BuildType()),
                           "\",version=\"", std::string(ProjectVersion()), "\"} 1")))
      << h.body;

  // A second server on the same port cannot bind, and says where.
  MetricsHttpServer second;
  absl::StatusOr<int> busy = second.Start(absl::StrCat("127.0.0.1:", *port), registry, {});
  EXPECT_EQ(busy.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(busy.status().message(), absl::StrCat("127.0.0.1:", *port)))
      << busy.status();
  EXPECT_EQ(server.Start("127.0.0.1:0", registry, {}).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // Stop is prompt and final.
  const absl::Time t = absl::Now();
  server.Stop();
  EXPECT_LT(absl::Now() - t, absl::Seconds(1));
  EXPECT_EQ(Request(*port, "GET", "/healthz").status, -1);
  server.Stop();  // idempotent
}

TEST(MetricsHttpServerTest, TwoServersAnswerForThemselves) {
  MetricsHttpServer a, b;
  absl::StatusOr<int> pa = a.Start("127.0.0.1:0", nullptr, [] { return std::string("a"); });
  absl::StatusOr<int> pb = b.Start("127.0.0.1:0", nullptr, [] { return std::string(); });
  ASSERT_TRUE(pa.ok() && pb.ok());
  EXPECT_EQ(Request(*pa, "GET", "/readyz").body, "not ready: a\n");
  EXPECT_EQ(Request(*pb, "GET", "/readyz").status, 200);
  a.Stop();
  EXPECT_EQ(Request(*pb, "GET", "/readyz").status, 200);
}

// Records what the mirror sets (the real health service is gRPC's, tested by
// integration_readiness_test through a server).
class FakeHealth : public grpc::HealthCheckServiceInterface {
 public:
  void SetServingStatus(const std::string& name, bool serving) override {
    std::lock_guard<std::mutex> l(mu);
    status[name] = serving;
    ++calls;
  }
  void SetServingStatus(bool) override { ADD_FAILURE() << "the mirror must name its services"; }
  std::map<std::string, bool> Get() {
    std::lock_guard<std::mutex> l(mu);
    return status;
  }
  std::mutex mu;
  std::map<std::string, bool> status;
  int calls = 0;
};

TEST(GrpcHealthMirrorTest, FollowsTheCheckAndEndsNotServing) {
  FakeHealth health;
  std::atomic<bool> ready{true};
  GrpcHealthMirror mirror(
      &health, {"dfa.v1.Worker", ""}, [&]() -> std::string { return ready ? "" : "down"; },
      absl::Milliseconds(10));
  // Set in the constructor already.
  EXPECT_EQ(health.Get(), (std::map<std::string, bool>{{"", true}, {"dfa.v1.Worker", true}}));
  ready = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (health.Get()[""] && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(health.Get(), (std::map<std::string, bool>{{"", false}, {"dfa.v1.Worker", false}}));
  absl::SleepFor(absl::Milliseconds(50));
  {
    std::lock_guard<std::mutex> l(health.mu);
    EXPECT_EQ(health.calls, 4) << "statuses are set on change only";
  }
  ready = true;
  while (!health.Get()[""] && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_TRUE(health.Get()["dfa.v1.Worker"]);
  mirror.Stop();
  EXPECT_EQ(health.Get(), (std::map<std::string, bool>{{"", false}, {"dfa.v1.Worker", false}}));
  mirror.Stop();  // idempotent
}

}  // namespace
}  // namespace dfa
