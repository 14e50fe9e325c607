// UcxTransport between several ranks of one process (each with its own UCX worker and progress
// thread, as separate daemons have): exchanges, ordering, sizes, cancellation, timeouts.
#include "worker/transport/ucx_transport.h"

#include <cstdint>
#include <numeric>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace dfa {
namespace {

class UcxTransportTest : public ::testing::Test {
 protected:
  void Make(int n) {
    for (int r = 0; r < n; ++r) {
      auto t = UcxTransport::Create(r, n);
      ASSERT_TRUE(t.ok()) << t.status();
      addrs_.push_back((*t)->address());
      ts_.push_back(std::move(*t));
    }
  }
  void Begin(const std::string& job) {
    for (auto& t : ts_) ASSERT_TRUE(t->BeginJob(job, addrs_).ok());
  }
  std::vector<std::unique_ptr<UcxTransport>> ts_;
  std::vector<std::string> addrs_;
};

std::vector<float> Pattern(int rank, int step, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(rank * 1000003 + step * 7919 + i);
  return v;
}

TEST_F(UcxTransportTest, RingExchangeEveryRankEveryStepSmallAndLarge) {
  constexpr int kRanks = 3;
  Make(kRanks);
  Begin("job-ring");
  // Sizes cross UCX's eager/rendezvous boundary.
  for (size_t n : {size_t{1}, size_t{1000}, size_t{1} << 20}) {
    std::vector<std::thread> threads;
    std::vector<int> failures(kRanks, 0);
    for (int r = 0; r < kRanks; ++r) {
      threads.emplace_back([&, r] {
        const int next = (r + 1) % kRanks, prev = (r + kRanks - 1) % kRanks;
        for (int step = 0; step < 3; ++step) {
          std::vector<float> out = Pattern(r, step, n), in(n, -1.f);
          TransportMessage s{next, out.data(), n * 4}, rv{prev, in.data(), n * 4};
          auto g = ts_[r]->Post({&s, 1}, {&rv, 1}, nullptr);
          absl::Status st = g.ok() ? (*g)->Wait(nullptr, absl::Seconds(20)) : g.status();
          EXPECT_TRUE(st.ok()) << st;
          if (!st.ok() ||
              in != Pattern(prev, step, n)) {
            ++failures[r];
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < kRanks; ++r) EXPECT_EQ(failures[r], 0) << "rank " << r << " n " << n;
  }
  for (auto& t : ts_) {
    EXPECT_EQ(t->bytes_sent(), t->bytes_received());
    EXPECT_EQ(t->bytes_sent(), 3 * 4 * (1 + 1000 + (1 << 20)));
  }
  EXPECT_EQ(ts_[0]->bytes_sent_per_peer()[1], ts_[0]->bytes_sent());
  EXPECT_EQ(ts_[0]->bytes_received_per_peer()[2], ts_[0]->bytes_received());
}

TEST_F(UcxTransportTest, MessagesBetweenOnePairMatchInPostingOrderAcrossGroups) {
  Make(2);
  Begin("job-order");
  // Rank 0 posts three groups of two sends before rank 1 posts any receive.
  std::vector<std::vector<int32_t>> out(6);
  std::vector<std::unique_ptr<PendingGroup>> sends;
  for (int g = 0; g < 3; ++g) {
    TransportMessage m[2];
    for (int k = 0; k < 2; ++k) {
      out[2 * g + k].assign(100 + 10 * (2 * g + k), 2 * g + k);
      m[k] = {1, out[2 * g + k].data(), out[2 * g + k].size() * 4};
    }
    auto pg = ts_[0]->Post({m, 2}, {}, nullptr);
    ASSERT_TRUE(pg.ok());
    sends.push_back(std::move(*pg));
  }
  std::vector<std::vector<int32_t>> in(6);
  for (int g = 0; g < 3; ++g) {
    TransportMessage m[2];
    for (int k = 0; k < 2; ++k) {
      in[2 * g + k].assign(out[2 * g + k].size(), -1);
      m[k] = {0, in[2 * g + k].data(), in[2 * g + k].size() * 4};
    }
    auto pg = ts_[1]->Post({}, {m, 2}, nullptr);
    ASSERT_TRUE(pg.ok());
    ASSERT_TRUE((*pg)->Wait(nullptr, absl::Seconds(20)).ok());
  }
  for (auto& s : sends) EXPECT_TRUE(s->Wait(nullptr, absl::Seconds(20)).ok());
  EXPECT_EQ(in, out);
}

TEST_F(UcxTransportTest, SendToSelfAndEmptyGroup) {
  Make(1);
  Begin("self");
  std::vector<double> a(5000), b(5000, 0);
  std::iota(a.begin(), a.end(), 1.0);
  TransportMessage s{0, a.data(), a.size() * 8}, r{0, b.data(), b.size() * 8};
  auto g = ts_[0]->Post({&s, 1}, {&r, 1}, nullptr);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE((*g)->Wait(nullptr, absl::Seconds(20)).ok());
  EXPECT_EQ(a, b);
  auto empty = ts_[0]->Post({}, {}, nullptr);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE((*empty)->Wait(nullptr, absl::Seconds(1)).ok());
}

TEST_F(UcxTransportTest, SizeMismatchIsAnErrorNotACorruption) {
  Make(2);
  Begin("mismatch");
  std::vector<char> big(4096, 'x'), small(100, 0);
  TransportMessage s{1, big.data(), big.size()}, r{0, small.data(), small.size()};
  auto gs = ts_[0]->Post({&s, 1}, {}, nullptr);
  auto gr = ts_[1]->Post({}, {&r, 1}, nullptr);
  ASSERT_TRUE(gs.ok() && gr.ok());
  EXPECT_FALSE((*gr)->Wait(nullptr, absl::Seconds(20)).ok());
  (void)(*gs)->Wait(nullptr, absl::Seconds(5));
}

TEST_F(UcxTransportTest, AbortCancelsPendingReceiveAndNextJobWorks) {
  Make(2);
  Begin("job-1");
  std::vector<char> buf(1 << 16);
  TransportMessage r{0, buf.data(), buf.size()};
  auto g = ts_[1]->Post({}, {&r, 1}, nullptr);  // rank 0 never sends
  ASSERT_TRUE(g.ok());
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ts_[1]->Abort();
  });
  absl::Status st = (*g)->Wait(nullptr, absl::Seconds(20));
  aborter.join();
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
  // Posting after Abort fails at once.
  auto after = ts_[1]->Post({}, {&r, 1}, nullptr);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ((*after)->Wait(nullptr, absl::Seconds(5)).code(), absl::StatusCode::kCancelled);

  Begin("job-2");
  std::vector<char> out(1000, 'k'), in(1000, 0);
  TransportMessage s{1, out.data(), out.size()}, rr{0, in.data(), in.size()};
  auto gs = ts_[0]->Post({&s, 1}, {}, nullptr);
  auto gr = ts_[1]->Post({}, {&rr, 1}, nullptr);
  ASSERT_TRUE(gs.ok() && gr.ok());
  EXPECT_TRUE((*gr)->Wait(nullptr, absl::Seconds(20)).ok());
  EXPECT_TRUE((*gs)->Wait(nullptr, absl::Seconds(20)).ok());
  EXPECT_EQ(in, out);
}

TEST_F(UcxTransportTest, WaitTimesOutWithDeadlineExceeded) {
  Make(2);
  Begin("timeout");
  int32_t x = 0;
  TransportMessage r{0, &x, sizeof(x)};
  auto g = ts_[1]->Post({}, {&r, 1}, nullptr);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ((*g)->Wait(nullptr, absl::Milliseconds(50)).code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST_F(UcxTransportTest, BadArgumentsNameTheField) {
  EXPECT_EQ(UcxTransport::Create(2, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(UcxTransport::Create(0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  Make(2);
  absl::Status st = ts_[0]->BeginJob("j", {addrs_[0]});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("peer_transport_addresses"), std::string::npos);
  st = ts_[0]->BeginJob("j", {addrs_[0], ""});
  EXPECT_NE(st.message().find("peer_transport_addresses[1]"), std::string::npos) << st;
  ASSERT_TRUE(ts_[0]->BeginJob("j", addrs_).ok());
  char c = 0;
  TransportMessage bad{5, &c, 1};
  auto g = ts_[0]->Post({&bad, 1}, {}, nullptr);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find("sends[0].peer"), std::string::npos);
}

// Damaged, foreign and raw (unsealed) peer addresses never reach UCX: BeginJob answers
// UNAVAILABLE naming the field and the peer, and the transport still connects and exchanges
// with the right addresses afterwards (UCX itself aborts the process on most of them).
TEST_F(UcxTransportTest, DamagedPeerAddressesFailWithUnavailableNamingThePeer) {
  for (int r = 0; r < 2; ++r) {
    auto t = UcxTransport::Create(r, 2, {"worker-0 at 127.0.0.1:1", "worker-1 at 127.0.0.1:2"});
    ASSERT_TRUE(t.ok()) << t.status();
    addrs_.push_back((*t)->address());
    ts_.push_back(std::move(*t));
  }
  const std::string good = addrs_[1];
  std::vector<std::string> damaged = {
      "", "x", good.substr(0, good.size() / 2), good + "tail", std::string(good.size(), '\xff'),
      good.substr(16),  // the raw UCX bytes without the envelope
  };
  for (size_t i = 0; i < good.size(); i += 7) {
    std::string d = good;
    d[i] = static_cast<char>(d[i] ^ 0x5a);
    damaged.push_back(d);
  }
  for (const std::string& d : damaged) {
    absl::Status st = ts_[0]->BeginJob("bad", {addrs_[0], d});
    EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
    EXPECT_NE(st.message().find("peer_transport_addresses[1]"), std::string::npos) << st;
    EXPECT_NE(st.message().find("worker-1 at 127.0.0.1:2"), std::string::npos) << st;
  }
  // This rank's own entry is ignored (it connects to itself with its own address).
  Begin("good");
  ASSERT_TRUE(ts_[0]->BeginJob("good2", {"junk", addrs_[1]}).ok());
  ASSERT_TRUE(ts_[1]->BeginJob("good2", addrs_).ok());
  int32_t out = 42, in = 0;
  TransportMessage s{1, &out, sizeof(out)};
  TransportMessage r{0, &in, sizeof(in)};
  auto gs = ts_[0]->Post({&s, 1}, {}, nullptr);
  auto gr = ts_[1]->Post({}, {&r, 1}, nullptr);
  ASSERT_TRUE(gs.ok() && gr.ok());
  EXPECT_TRUE((*gs)->Wait(nullptr, absl::Seconds(10)).ok());
  EXPECT_TRUE((*gr)->Wait(nullptr, absl::Seconds(10)).ok());
  EXPECT_EQ(in, 42);
}

}  // namespace
}  // namespace dfa
