// core/random_id.h: ids and capabilities have their length and alphabet, never repeat, and
// spread their symbols evenly (what a CSPRNG gives; a constant or counter-based generator fails
// the counts); ConstantTimeEquals is equality.
#include "core/random_id.h"

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace dfa {
namespace {

constexpr int kSamples = 10000;
constexpr char kBase64Url[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

TEST(RandomIdTest, HexIdsHaveThePrefixLengthAndAlphabetAndNeverRepeat) {
  std::set<std::string> seen;
  std::array<int64_t, 16> counts{};
  for (int i = 0; i < kSamples; ++i) {
    const std::string id = RandomId("s-");
    ASSERT_EQ(id.size(), 2u + kRandomIdBits / 4) << id;
    ASSERT_EQ(id.substr(0, 2), "s-");
    for (char c : id.substr(2)) {
      const size_t digit = std::string("0123456789abcdef").find(c);
      ASSERT_NE(digit, std::string::npos) << "not lower-case hex: " << id;
      ++counts[digit];
    }
    ASSERT_TRUE(seen.insert(id).second) << "repeated after " << i << ": " << id;
  }
  // 320,000 digits: 20,000 expected per value, sigma ~137; +-10% is > 14 sigma.
  const double expected = kSamples * (kRandomIdBits / 4) / 16.0;
  for (int d = 0; d < 16; ++d) {
    EXPECT_GT(counts[d], 0.9 * expected) << "hex digit " << d;
    EXPECT_LT(counts[d], 1.1 * expected) << "hex digit " << d;
  }
  EXPECT_EQ(RandomId("").size(), 32u);
}

TEST(RandomIdTest, CapabilitiesAreBase64UrlOf256BitsAndNeverRepeat) {
  std::set<std::string> seen;
  std::array<int64_t, 64> counts{};
  int64_t ones = 0;
  for (int i = 0; i < kSamples; ++i) {
    const std::string cap = NewCapability();
    ASSERT_EQ(cap.size(), 43u) << cap;  // ceil(256 / 6)
    for (size_t k = 0; k < cap.size(); ++k) {
      const char* p = std::strchr(kBase64Url, cap[k]);
      ASSERT_TRUE(cap[k] != '\0' && p != nullptr) << "not base64url: " << cap;
      const int v = static_cast<int>(p - kBase64Url);
      if (k + 1 < cap.size()) {  // the last symbol carries 4 bits (two zero bits of padding)
        ++counts[v];
        ones += __builtin_popcount(v);
      } else {
        EXPECT_EQ(v & 3, 0) << "padding bits of " << cap;
      }
    }
    ASSERT_TRUE(seen.insert(cap).second) << "repeated after " << i << ": " << cap;
  }
  // 420,000 full symbols: ~6,560 per value, sigma ~80; +-20% is > 16 sigma.
  const double expected = kSamples * 42 / 64.0;
  for (int v = 0; v < 64; ++v) {
    EXPECT_GT(counts[v], 0.8 * expected) << "symbol " << kBase64Url[v];
    EXPECT_LT(counts[v], 1.2 * expected) << "symbol " << kBase64Url[v];
  }
  // Half of the 2,520,000 bits are ones (sigma ~800).
  const double bits = kSamples * 42 * 6.0;
  EXPECT_NEAR(static_cast<double>(ones) / bits, 0.5, 0.005);
}

TEST(RandomIdTest, ThreadsNeverDrawTheSameId) {
  constexpr int kThreads = 4;
  std::vector<std::vector<std::string>> ids(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&ids, t] {
      for (int i = 0; i < kSamples / kThreads; ++i) ids[t].push_back(RandomId("j-"));
    });
  }
  for (auto& th : threads) th.join();
  std::set<std::string> all;
  for (const auto& v : ids) all.insert(v.begin(), v.end());
  EXPECT_EQ(all.size(), static_cast<size_t>(kSamples));
}

TEST(RandomIdTest, FillRandomBytesFillsEveryByte) {
  // 4096 bytes all left at zero has probability 2^-32768; so does any fixed byte never changing
  // over 64 draws (2^-512).
  std::vector<uint8_t> a(4096, 0), b(4096, 0);
  FillRandomBytes(a.data(), a.size());
  FillRandomBytes(b.data(), b.size());
  EXPECT_NE(a, b);
  std::vector<uint8_t> ored(64, 0);
  for (int i = 0; i < 64; ++i) {
    std::vector<uint8_t> x(64);
    FillRandomBytes(x.data(), x.size());
    for (size_t k = 0; k < x.size(); ++k) ored[k] |= x[k];
  }
  for (size_t k = 0; k < ored.size(); ++k) EXPECT_NE(ored[k], 0) << "byte " << k;
}

TEST(RandomIdTest, ConstantTimeEqualsIsEquality) {
  const std::string cap = NewCapability();
  EXPECT_TRUE(ConstantTimeEquals(cap, std::string(cap)));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  for (size_t k : {size_t{0}, cap.size() / 2, cap.size() - 1}) {
    std::string other = cap;
    other[k] = other[k] == 'x' ? 'y' : 'x';
    EXPECT_FALSE(ConstantTimeEquals(cap, other)) << "differs at " << k;
  }
  EXPECT_FALSE(ConstantTimeEquals(cap, cap.substr(0, cap.size() - 1)));
  EXPECT_FALSE(ConstantTimeEquals(cap, cap + "A"));
  EXPECT_FALSE(ConstantTimeEquals(cap, ""));
}

}  // namespace
}  // namespace dfa
