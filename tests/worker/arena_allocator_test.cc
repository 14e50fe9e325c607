#include "worker/gpu/arena_allocator.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace dfa {
namespace {

TEST(ArenaAllocatorTest, AlignsAndAccounts) {
  ArenaAllocator a(4096, 256);
  auto x = a.Allocate(1);
  auto y = a.Allocate(300);
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_EQ(*x % 256, 0u);
  EXPECT_EQ(*y % 256, 0u);
  EXPECT_NE(*x, *y);
  EXPECT_EQ(a.used(), 256u + 512u);
  ASSERT_TRUE(a.Free(*x).ok());
  EXPECT_EQ(a.used(), 512u);
  EXPECT_EQ(a.peak_used(), 768u);
}

TEST(ArenaAllocatorTest, ExhaustionNamesSizes) {
  ArenaAllocator a(1024, 256);
  ASSERT_TRUE(a.Allocate(1024).ok());
  auto z = a.Allocate(1);
  ASSERT_EQ(z.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(z.status().message().find("1 bytes"), std::string::npos) << z.status();
}

TEST(ArenaAllocatorTest, FreeOfUnknownOffsetIsInvalid) {
  ArenaAllocator a(1024, 256);
  EXPECT_EQ(a.Free(256).code(), absl::StatusCode::kInvalidArgument);
  auto x = a.Allocate(256);
  ASSERT_TRUE(x.ok());
  ASSERT_TRUE(a.Free(*x).ok());
  EXPECT_EQ(a.Free(*x).code(), absl::StatusCode::kInvalidArgument);  // double free
}

TEST(ArenaAllocatorTest, CoalescesSoTheWholeArenaIsUsableAgain) {
  ArenaAllocator a(1 << 20, 256);
  std::vector<size_t> offs;
  for (int i = 0; i < 16; ++i) {
    auto o = a.Allocate(1 << 16);
    ASSERT_TRUE(o.ok());
    offs.push_back(*o);
  }
  EXPECT_FALSE(a.Allocate(1).ok());
  // Free in an interleaved order: odd ones, then even ones.
  for (size_t i = 1; i < offs.size(); i += 2) ASSERT_TRUE(a.Free(offs[i]).ok());
  EXPECT_EQ(a.largest_free(), size_t{1} << 16);
  for (size_t i = 0; i < offs.size(); i += 2) ASSERT_TRUE(a.Free(offs[i]).ok());
  EXPECT_EQ(a.largest_free(), size_t{1} << 20);
  EXPECT_TRUE(a.Allocate(1 << 20).ok());
}

TEST(ArenaAllocatorTest, RandomWorkloadKeepsRangesDisjoint) {
  ArenaAllocator a(1 << 24, 256);
  std::mt19937 rng(7);
  std::vector<std::pair<size_t, size_t>> live;  // offset, requested bytes
  for (int it = 0; it < 4000; ++it) {
    if (live.empty() || rng() % 3 != 0) {
      size_t bytes = 1 + rng() % (1 << 18);
      auto o = a.Allocate(bytes);
      if (!o.ok()) {
        ASSERT_EQ(o.status().code(), absl::StatusCode::kResourceExhausted);
        continue;
      }
      for (const auto& [off, n] : live) {
        ASSERT_TRUE(*o + bytes <= off || off + n <= *o) << "overlap at " << *o;
      }
      live.emplace_back(*o, bytes);
    } else {
      size_t i = rng() % live.size();
      ASSERT_TRUE(a.Free(live[i].first).ok());
      live.erase(live.begin() + i);
    }
  }
  for (const auto& [off, n] : live) ASSERT_TRUE(a.Free(off).ok());
  EXPECT_EQ(a.used(), 0u);
  EXPECT_EQ(a.largest_free(), a.capacity());
}

}  // namespace
}  // namespace dfa
