// The coordinator's /metrics endpoint: scraped over HTTP like Prometheus does, it carries the
// names of docs/metrics.md with values that follow the cluster.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator_test_util.h"

namespace dfa::testing {
namespace {

// GET http://127.0.0.1:port/metrics; returns the whole response ("" on a socket error).
std::string Scrape(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
    }
  }
  close(fd);
  return out;
}

using MetricsTest = CoordinatorFixture;

TEST_F(MetricsTest, ExposesTheContractNamesWithLiveValues) {
  CoordinatorOptions o = TestOptions();
  o.metrics_port = 0;
  StartCoordinator(o);
  ASSERT_GT(server_->metrics_port(), 0);
  AddCpuWorkers(2);
  v1::CreateSessionResponse created;
  ASSERT_TRUE(CreateWithSpec(GoodSpec(), &created).ok());
  v1::Job job;
  ASSERT_TRUE(Submit(created.session_id(), v1::JOB_FORWARD, &job).ok());
  ASSERT_EQ(Watch(job.job_id()).back().state(), v1::JOB_SUCCEEDED);
  v1::Job bad;
  ASSERT_FALSE(Submit("s-unknown", v1::JOB_FORWARD, &bad).ok());
  absl::SleepFor(absl::Milliseconds(100));  // one tick refreshes the gauges

  const std::string text = Scrape(server_->metrics_port());
  for (const char* line : {
           "dfa_coordinator_live_workers 2",
           "dfa_coordinator_sessions 1",
           "dfa_coordinator_queue_depth 0",
           "dfa_coordinator_jobs_total{kind=\"forward\",state=\"succeeded\"} 1",
           "dfa_coordinator_jobs_total{kind=\"backward\",state=\"failed\"} 0",
           "dfa_coordinator_job_latency_seconds_count{kind=\"forward\"} 1",
           "dfa_coordinator_job_overhead_seconds_count{kind=\"forward\"} 1",
           "dfa_coordinator_job_overhead_seconds_count{kind=\"backward\"} 0",
           "dfa_grpc_errors_total{code=\"NOT_FOUND\",component=\"coordinator\","
           "method=\"SubmitJob\"} 1",
       }) {
    EXPECT_TRUE(absl::StrContains(text, line)) << "missing: " << line << "\n" << text;
  }
  // The control plane's share of the job is part of its latency (and not negative).
  auto value = [&](const std::string& series) {
    const size_t at = text.find(series + " ");
    EXPECT_NE(at, std::string::npos) << series;
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + series.size() + 1));
  };
  const double overhead = value("dfa_coordinator_job_overhead_seconds_sum{kind=\"forward\"}");
  const double latency = value("dfa_coordinator_job_latency_seconds_sum{kind=\"forward\"}");
  EXPECT_GE(overhead, 0.0);
  EXPECT_LE(overhead, latency);
  EXPECT_TRUE(absl::StrContains(text, "dfa_coordinator_memory_reserved_bytes"));
  EXPECT_TRUE(absl::StrContains(text, "dfa_coordinator_attention_flops_total{kind=\"forward\"}"));
}

}  // namespace
}  // namespace dfa::testing
