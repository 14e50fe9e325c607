// The C++ Client in a fork()ed child, against real daemons (client/lease_holder.h): the
// child's CreateSession on its parent's Client is FAILED_PRECONDITION at once (no rpc: gRPC
// does not survive fork()) and its lease_id() is ""; the parent keeps its one lease and its
// session runs a job past several lease timeouts and graces.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "absl/time/clock.h"
#include "tests/integration/cluster_fixture.h"

namespace dfa::testing {
namespace {

TEST(ClientForkTest, ChildIsRefusedAndParentLeaseKept) {
  auto cluster = StartClusterOrSkip(2, {"--client_lease_beat_ms=200",
                                        "--client_lease_timeout_ms=1000",
                                        "--client_lease_grace_ms=1000"});
  if (!cluster) GTEST_SKIP() << "dfa-coordinator / dfa-worker not built";
  auto c = client::Client::Connect(cluster->coordinator_address());
  ASSERT_TRUE(c.ok()) << c.status();
  client::Client* parent = c->get();
  const v1::AttentionSpec spec = MakeSpec(1, 128, 2, 2, 16, true);
  const TrainingInputs in = RandomInputs(spec, 3);
  ExpectMatchesReference(spec, in, RunTraining(parent, spec, 2, "balanced", in));
  client::SessionOptions o;
  o.spec = spec;
  o.num_workers = 2;
  auto held = parent->CreateSession(o);
  ASSERT_TRUE(held.ok()) << held.status();
  const std::string lease = parent->lease_id();
  ASSERT_FALSE(lease.empty());

  int report[2];
  ASSERT_EQ(pipe(report), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: only what this test checks, then _exit (no gtest reporting here).
    close(report[0]);
    const absl::Time t0 = absl::Now();
    auto s = parent->CreateSession(o);
    const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
    char line[1024];
    std::snprintf(line, sizeof(line), "%d|%.3f|%s|%s", static_cast<int>(s.status().code()), secs,
                  parent->lease_id().c_str(), std::string(s.status().message()).c_str());
    ssize_t n = write(report[1], line, std::strlen(line));
    (void)n;
    // The copy of the Client is left alone: destroying it here blocks in gRPC's channel
    // teardown (gRPC's threads are not in this process). _exit runs no destructors.
    _exit(0);
  }
  close(report[1]);
  std::string got;
  char buf[512];
  ssize_t n;
  while ((n = read(report[0], buf, sizeof(buf))) > 0) got.append(buf, static_cast<size_t>(n));
  close(report[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;

  const std::vector<std::string> f = [&] {
    std::vector<std::string> parts;
    size_t start = 0;
    for (int i = 0; i < 3; ++i) {
      const size_t bar = got.find('|', start);
      if (bar == std::string::npos) break;
      parts.push_back(got.substr(start, bar - start));
      start = bar + 1;
    }
    parts.push_back(got.substr(start));
    return parts;
  }();
  ASSERT_EQ(f.size(), 4u) << got;
  EXPECT_EQ(std::stoi(f[0]), static_cast<int>(absl::StatusCode::kFailedPrecondition)) << got;
  EXPECT_LT(std::stod(f[1]), 1.0) << "the child's CreateSession should answer at once: " << got;
  EXPECT_EQ(f[2], "") << "the child must not report the parent's lease: " << got;
  EXPECT_NE(f[3].find("fork"), std::string::npos) << got;

  // Three lease timeouts + graces later: the parent's lease is the same and its only one, and
  // its sessions are there.
  absl::SleepFor(absl::Seconds(3));
  EXPECT_EQ(parent->lease_id(), lease);
  auto st = parent->GetStatus();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->client_leases(), 1) << st->ShortDebugString();
  EXPECT_EQ(st->sessions(), 1) << st->ShortDebugString();
  RunResult after = RunTraining(parent, spec, 2, "balanced", in);
  ExpectMatchesReference(spec, in, after);
  held->reset();
  EXPECT_TRUE(cluster->Stop().ok());
}

}  // namespace
}  // namespace dfa::testing
