#include "core/wire/crc32c.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dfa {
namespace {

// Bit-at-a-time reference, straight from the definition.
uint32_t Reference(const uint8_t* p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? 0x82F63B78u : 0u);
  }
  return ~c;
}

TEST(Crc32cTest, KnownVectors) {
  const std::string check = "123456789";
  EXPECT_EQ(Crc32c(check.data(), check.size()), 0xE3069283u);
  EXPECT_EQ(Crc32c(nullptr, 0), 0u);
  // RFC 3720 B.4: 32 bytes of zeros and of 0xff.
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xff);
  EXPECT_EQ(Crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(ones.data(), ones.size()), 0x62A8AB43u);
}

TEST(Crc32cTest, DispatchedAndPortableAgreeWithReferenceAtEveryLengthAndOffset) {
  std::mt19937 rng(7);
  std::vector<uint8_t> buf(300);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t off = 0; off < 9; ++off) {
    for (size_t n = 0; n + off <= buf.size(); n += 7) {
      const uint32_t want = Reference(buf.data() + off, n);
      ASSERT_EQ(Crc32c(buf.data() + off, n), want) << "off=" << off << " n=" << n;
      ASSERT_EQ(Crc32cExtendPortable(0, buf.data() + off, n), want) << "off=" << off;
    }
  }
}

TEST(Crc32cTest, ExtendEqualsWhole) {
  std::vector<uint8_t> buf(1000);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 131 + 17);
  const uint32_t whole = Crc32c(buf.data(), buf.size());
  for (size_t cut : {0, 1, 7, 8, 333, 999, 1000}) {
    uint32_t c = Crc32cExtend(0, buf.data(), cut);
    c = Crc32cExtend(c, buf.data() + cut, buf.size() - cut);
    EXPECT_EQ(c, whole) << "cut=" << cut;
  }
}

TEST(Crc32cTest, DetectsSingleBitFlip) {
  std::vector<uint8_t> buf(4096, 0x5a);
  const uint32_t before = Crc32c(buf.data(), buf.size());
  buf[1234] ^= 0x10;
  EXPECT_NE(Crc32c(buf.data(), buf.size()), before);
}

}  // namespace
}  // namespace dfa
