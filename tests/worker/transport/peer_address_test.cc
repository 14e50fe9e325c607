// The envelope of transport addresses between workers (worker/transport/peer_address.h): what
// a worker seals opens to the same bytes; every damage — each bit flipped, each truncation,
// appended bytes, foreign bytes, the other kind — is refused with a message saying what is
// wrong, so nothing damaged reaches UCX or NCCL.
#include "worker/transport/peer_address.h"

#include <random>
#include <string>

#include "gtest/gtest.h"

namespace dfa {
namespace {

std::string Payload(size_t n) {
  std::string p(n, '\0');
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<char>((i * 131 + 7) & 0xff);
  return p;
}

TEST(PeerAddressTest, SealedOpensToTheSameBytes) {
  for (size_t n : {size_t{1}, size_t{128}, size_t{517}, kMaxPeerAddressPayload}) {
    const std::string p = Payload(n);
    const std::string e = SealPeerAddress(PeerAddressKind::kUcx, p);
    EXPECT_EQ(e.size(), kPeerAddressHeaderBytes + n);
    auto opened = OpenPeerAddress(PeerAddressKind::kUcx, e);
    ASSERT_TRUE(opened.ok()) << opened.status();
    EXPECT_EQ(*opened, p);
  }
}

TEST(PeerAddressTest, EveryFlippedBitIsRefused) {
  const std::string e = SealPeerAddress(PeerAddressKind::kUcx, Payload(300));
  for (size_t i = 0; i < e.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string d = e;
      d[i] = static_cast<char>(d[i] ^ (1 << bit));
      auto opened = OpenPeerAddress(PeerAddressKind::kUcx, d);
      ASSERT_FALSE(opened.ok()) << "byte " << i << " bit " << bit;
      EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
    }
  }
}

TEST(PeerAddressTest, TruncatedExtendedEmptyAndForeignAreRefused) {
  const std::string e = SealPeerAddress(PeerAddressKind::kUcx, Payload(200));
  for (size_t n = 0; n < e.size(); ++n) {
    EXPECT_FALSE(OpenPeerAddress(PeerAddressKind::kUcx, e.substr(0, n)).ok()) << n;
  }
  auto st = OpenPeerAddress(PeerAddressKind::kUcx, e + "x").status();
  EXPECT_NE(st.message().find("declares"), std::string::npos) << st;
  st = OpenPeerAddress(PeerAddressKind::kUcx, "").status();
  EXPECT_NE(st.message().find("empty"), std::string::npos) << st;
  // A raw UCX address (what workers sent before the envelope) or any other junk.
  std::mt19937_64 rng(42);
  for (int i = 0; i < 1000; ++i) {
    std::string junk(static_cast<size_t>(rng() % 600), '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    EXPECT_FALSE(OpenPeerAddress(PeerAddressKind::kUcx, junk).ok());
  }
  st = OpenPeerAddress(PeerAddressKind::kUcx, std::string(64, 'A')).status();
  EXPECT_NE(st.message().find("magic"), std::string::npos) << st;
}

TEST(PeerAddressTest, KindAndSizeLimitsAreChecked) {
  const std::string nccl = SealPeerAddress(PeerAddressKind::kNccl, Payload(128));
  auto st = OpenPeerAddress(PeerAddressKind::kUcx, nccl).status();
  EXPECT_NE(st.message().find("is a nccl address, want ucx"), std::string::npos) << st;
  EXPECT_TRUE(OpenPeerAddress(PeerAddressKind::kNccl, nccl).ok());
  // A header that declares more than the limit (sealed by hand: SealPeerAddress's callers
  // never pass more).
  const std::string big = SealPeerAddress(PeerAddressKind::kUcx, Payload(kMaxPeerAddressPayload + 1));
  st = OpenPeerAddress(PeerAddressKind::kUcx, big).status();
  EXPECT_NE(st.message().find("declares a payload of"), std::string::npos) << st;
}

}  // namespace
}  // namespace dfa
