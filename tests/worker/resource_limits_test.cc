// The worker's bounds besides memory: StreamLimits (Upload/Download streams in total and per
// client; worker/stream_limits.h), SessionAdmission (sessions and their file descriptors;
// worker/session_admission.h) and the default memory limit (worker/memory_budget.h).
#include <sys/resource.h>

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "worker/memory_budget.h"
#include "worker/session_admission.h"
#include "worker/stream_limits.h"
#include "worker/transport/fd_usage.h"

namespace dfa {
namespace {

TEST(StreamLimitsTest, TotalAndPerClientCapsRefuseNamingTheFlagAndFreeOnRelease) {
  StreamLimitOptions o;
  o.max_streams = 3;
  o.max_streams_per_client = 2;
  o.idle_timeout = absl::ZeroDuration();
  StreamLimits limits(o);
  std::vector<std::unique_ptr<StreamLimits::Ticket>> held;
  for (int i = 0; i < 3; ++i) {
    auto t = limits.Open(nullptr, "Upload");
    ASSERT_TRUE(t.ok()) << t.status();
    held.push_back(std::move(*t));
  }
  auto over = limits.Open(nullptr, "Upload");
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("--max_data_streams = 3"), std::string::npos)
      << over.status();
  EXPECT_TRUE(held[0]->SetClient("a").ok());
  EXPECT_TRUE(held[1]->SetClient("a").ok());
  absl::Status third = held[2]->SetClient("a");
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.message().find("--max_data_streams_per_client = 2"), std::string::npos) << third;
  EXPECT_TRUE(held[2]->SetClient("b").ok());
  EXPECT_EQ(limits.open(), 3);
  held.erase(held.begin());  // one of client a's
  EXPECT_EQ(limits.open(), 2);
  auto again = limits.Open(nullptr, "Download");
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE((*again)->SetClient("a").ok());
}

TEST(SessionAdmissionTest, MaxSessionsAndTicketsReleaseTheirShare) {
  SessionAdmissionOptions o;
  o.max_sessions = 2;
  SessionAdmission admission(o);
  auto a = admission.Admit(2);
  auto b = admission.Admit(4);
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = admission.Admit(2);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("--max_sessions = 2"), std::string::npos) << c.status();
  a->reset();
  EXPECT_EQ(admission.sessions(), 1);
  EXPECT_TRUE(admission.Admit(2).ok());
  EXPECT_GT(SessionAdmission::FdsPerSession(8), SessionAdmission::FdsPerSession(2));
}

TEST(SessionAdmissionTest, RefusesBeforeTheDescriptorsRunOut) {
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  SessionAdmission admission(SessionAdmissionOptions{});
  const int open = CountOpenFds();
  ASSERT_GT(open, 0);
  rlimit low = saved;
  low.rlim_cur = static_cast<rlim_t>(open + 150);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<std::unique_ptr<SessionAdmission::Ticket>> held;
  absl::Status refused;
  for (int i = 0; i < 100 && refused.ok(); ++i) {
    auto t = admission.Admit(2);
    if (t.ok()) {
      held.push_back(std::move(*t));
    } else {
      refused = t.status();
    }
  }
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("file descriptor"), std::string::npos) << refused;
  // What was admitted fits: baseline, estimates and the reserve stay under the limit.
  EXPECT_GE(held.size(), 1u);
  EXPECT_LE(open + static_cast<int>(held.size()) * SessionAdmission::FdsPerSession(2), open + 150);
}

TEST(MemoryBudgetTest, DefaultLimitIsShareOfUsableMemory) {
  const int64_t usable = UsableMemoryBytes();
  ASSERT_GT(usable, 0);
  EXPECT_EQ(DefaultMemoryLimit(1), usable / 10 * 8);
  EXPECT_EQ(DefaultMemoryLimit(4), usable / 10 * 8 / 4);
  EXPECT_EQ(DefaultMemoryLimit(0), DefaultMemoryLimit(1));
  // Two workers of one host together admit 80% of it, not 160%.
  EXPECT_LE(2 * DefaultMemoryLimit(2), usable / 10 * 8);
}

}  // namespace
}  // namespace dfa
