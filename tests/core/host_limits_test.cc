#include "core/host_limits.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <cmath>

namespace dfa {
namespace {

TEST(HostLimitsTest, ParsesCgroupV2CpuMax) {
  EXPECT_EQ(ParseCpuMax("max 100000"), 0);  // no limit
  EXPECT_DOUBLE_EQ(ParseCpuMax("400000 100000\n"), 4.0);
  EXPECT_DOUBLE_EQ(ParseCpuMax("150000 100000"), 1.5);
  EXPECT_DOUBLE_EQ(ParseCpuMax("50000 100000"), 0.5);
  EXPECT_EQ(ParseCpuMax(""), 0);  // unreadable file
  EXPECT_EQ(ParseCpuMax("garbage"), 0);
  EXPECT_EQ(ParseCpuMax("100000"), 0);  // no period
  EXPECT_EQ(ParseCpuMax("-5 100000"), 0);
  EXPECT_EQ(ParseCpuMax("100000 0"), 0);
}

TEST(HostLimitsTest, ParsesCgroupV1CfsQuota) {
  EXPECT_EQ(ParseCfsQuota("-1", "100000"), 0);  // no limit
  EXPECT_DOUBLE_EQ(ParseCfsQuota("800000\n", "100000\n"), 8.0);
  EXPECT_DOUBLE_EQ(ParseCfsQuota("25000", "50000"), 0.5);
  EXPECT_EQ(ParseCfsQuota("", "100000"), 0);
  EXPECT_EQ(ParseCfsQuota("100000", "x"), 0);
}

// What this process may use: within its affinity mask and, when its cgroup limits the CPU, within
// that limit rounded up; never below 1.
TEST(HostLimitsTest, UsableCpusRespectsAffinityAndCgroupLimit) {
  const int usable = UsableCpus();
  EXPECT_GE(usable, 1);
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_LE(usable, CPU_COUNT(&set));
  const double limit = CgroupCpuLimit();
  EXPECT_GE(limit, 0);
  if (limit > 0) {
    EXPECT_LE(usable, static_cast<int>(std::ceil(limit)));
  } else {
    EXPECT_EQ(usable, CPU_COUNT(&set));
  }
}

// A narrower affinity mask (what `taskset` or a pinned container gives) lowers the count.
TEST(HostLimitsTest, UsableCpusFollowsANarrowedAffinityMask) {
  cpu_set_t old_set;
  CPU_ZERO(&old_set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(old_set), &old_set), 0);
  int first = -1;
  for (int c = 0; c < CPU_SETSIZE && first < 0; ++c) {
    if (CPU_ISSET(c, &old_set)) first = c;
  }
  ASSERT_GE(first, 0);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  const int usable = UsableCpus();
  ASSERT_EQ(sched_setaffinity(0, sizeof(old_set), &old_set), 0);
  EXPECT_EQ(usable, 1);
}

TEST(HostLimitsTest, CgroupMemoryLimitIsNoneOrPositive) { EXPECT_GE(CgroupMemoryLimit(), 0); }

}  // namespace
}  // namespace dfa
