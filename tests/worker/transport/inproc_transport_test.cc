#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "worker/transport/inproc_transport.h"

namespace dfa {
namespace {

std::unique_ptr<Transport> Endpoint(std::shared_ptr<InprocHub> hub, int rank) {
  absl::StatusOr<std::unique_ptr<Transport>> t = CreateInprocTransport(std::move(hub), rank);
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(*t);
}

TEST(InprocTransportTest, MatchesMessagesInPostingOrderAcrossGroups) {
  auto hub = *CreateInprocHub(2);
  auto a = Endpoint(hub, 0), b = Endpoint(hub, 1);
  int x1 = 11, x2 = 22, y1 = 0, y2 = 0;
  // Receiver posts both receives first, sender posts two groups.
  std::vector<TransportMessage> recvs = {{0, &y1, 4}, {0, &y2, 4}};
  auto gr = *b->Post({}, recvs, nullptr);
  std::vector<TransportMessage> s1 = {{1, &x1, 4}}, s2 = {{1, &x2, 4}};
  auto g1 = *a->Post(s1, {}, nullptr);
  auto g2 = *a->Post(s2, {}, nullptr);
  EXPECT_TRUE(gr->Wait(nullptr, absl::Seconds(5)).ok());
  EXPECT_TRUE(g1->Wait(nullptr, absl::Seconds(5)).ok());
  EXPECT_TRUE(g2->Wait(nullptr, absl::Seconds(5)).ok());
  EXPECT_EQ(y1, 11);
  EXPECT_EQ(y2, 22);
  EXPECT_EQ(a->bytes_sent(), 8);
  EXPECT_EQ(b->bytes_received(), 8);
}

TEST(InprocTransportTest, SizeMismatchFailsBothSides) {
  auto hub = *CreateInprocHub(2);
  auto a = Endpoint(hub, 0), b = Endpoint(hub, 1);
  int64_t x = 1, y = 0;
  std::vector<TransportMessage> s = {{1, &x, 8}}, r = {{0, &y, 4}};
  auto gs = *a->Post(s, {}, nullptr);
  auto gr = *b->Post({}, r, nullptr);
  EXPECT_EQ(gs->Wait(nullptr, absl::Seconds(5)).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(gr->Wait(nullptr, absl::Seconds(5)).code(), absl::StatusCode::kInternal);
}

TEST(InprocTransportTest, UnmatchedReceiveTimesOutAndAbortCancels) {
  auto hub = *CreateInprocHub(2);
  auto a = Endpoint(hub, 0), b = Endpoint(hub, 1);
  int y = 0;
  std::vector<TransportMessage> r = {{0, &y, 4}};
  auto gr = *b->Post({}, r, nullptr);
  EXPECT_EQ(gr->Wait(nullptr, absl::Milliseconds(20)).code(), absl::StatusCode::kDeadlineExceeded);
  std::thread aborter([&] { a->Abort(); });
  aborter.join();
  EXPECT_EQ(gr->Wait(nullptr, absl::Seconds(5)).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(b->Post({}, r, nullptr).status().code(), absl::StatusCode::kCancelled);
}

TEST(InprocTransportTest, RejectsBadRanksAndPeers) {
  auto hub = *CreateInprocHub(2);
  EXPECT_FALSE(CreateInprocTransport(hub, 2).ok());
  EXPECT_FALSE(CreateInprocHub(0).ok());
  auto a = Endpoint(hub, 0);
  int x = 0;
  std::vector<TransportMessage> s = {{5, &x, 4}};
  EXPECT_EQ(a->Post(s, {}, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dfa
