// Running out of file descriptors, on real daemons: both workers' RLIMIT_NOFILE is lowered
// (prlimit) to what they hold plus 160. New sessions are then refused with RESOURCE_EXHAUSTED
// naming the descriptors (worker/session_admission.h) before the workers run out, and every
// session opened before keeps working: its forward job runs. Releasing one makes room again.
#include <sys/resource.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "client/client.h"
#include "tests/fault/hostile_util.h"

namespace dfa::testing {
namespace {

TEST(FdLimitTest, OutOfDescriptorsRefusesNewSessionsAndOpenOnesKeepWorking) {
  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  auto c = client::Client::Connect(cluster->client_options());
  ASSERT_TRUE(c.ok()) << c.status();
  for (int i = 0; i < 2; ++i) {
    const pid_t pid = cluster->worker_process(i)->pid();
    const int held = ProcFds(pid);
    ASSERT_GT(held, 0);
    rlimit low{static_cast<rlim_t>(held + 160), static_cast<rlim_t>(held + 160)};
    ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, &low, nullptr), 0) << std::strerror(errno);
  }
  client::SessionOptions so;
  so.spec = SmallSpec(64);
  so.num_workers = 2;
  std::vector<std::unique_ptr<client::Session>> sessions;
  absl::Status refused;
  for (int i = 0; i < 60; ++i) {
    auto s = (*c)->CreateSession(so);
    if (!s.ok()) {
      refused = s.status();
      break;
    }
    sessions.push_back(std::move(*s));
  }
  ASSERT_FALSE(refused.ok()) << "60 sessions of 2 workers fit in 160 descriptors";
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "file descriptor")) << refused;
  ASSERT_GE(sessions.size(), 2u) << refused;
  std::printf("%zu sessions open, the next refused: %s\n", sessions.size(),
              std::string(refused.message()).c_str());
  // Every open session still runs a job (its peers' connections included).
  for (size_t i = 0; i < sessions.size(); ++i) {
    ASSERT_TRUE(sessions[i]->GenerateInputs(i, false).ok()) << i;
    auto job = sessions[i]->Run(v1::JOB_FORWARD);
    ASSERT_TRUE(job.ok()) << i << ": " << job.status();
    EXPECT_EQ(job->state(), v1::JOB_SUCCEEDED) << i << ": " << job->error_message();
  }
  // A released session makes room for a new one.
  ASSERT_TRUE(sessions.back()->Release().ok());
  sessions.pop_back();
  auto again = (*c)->CreateSession(so);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE((*again)->GenerateInputs(99, false).ok());
  auto job = (*again)->Run(v1::JOB_FORWARD);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_SUCCEEDED) << job->error_message();
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(cluster->worker_process(i)->Running());
  sessions.clear();
  (void)(*again)->Release();
  EXPECT_TRUE(cluster->Stop().ok()) << "logs in " << cluster->log_dir();
}

}  // namespace
}  // namespace dfa::testing
