// The daemon's per-session transport choice (worker/transport/session_transport.h): the UCX
// transport names its peers from OpenSessionRequest.peers, and, where the worker is built with
// NCCL, a damaged or foreign rank-0 NCCL id is refused before NCCL sees it (no GPU is touched:
// the id is checked first).
#include "worker/transport/session_transport.h"

#include <string>

#include "gtest/gtest.h"
#include "worker/transport/peer_address.h"

namespace dfa {
namespace {

v1::OpenSessionRequest Request(int rank, int ranks) {
  v1::OpenSessionRequest r;
  r.set_session_id("s");
  r.set_rank(rank);
  for (int i = 0; i < ranks; ++i) {
    r.mutable_plan()->add_workers();
    v1::PeerInfo* p = r.add_peers();
    p->set_rank(i);
    p->set_worker_id("worker-" + std::to_string(i));
    p->set_address("10.0.0." + std::to_string(i) + ":7071");
  }
  return r;
}

TEST(SessionTransportTest, PeerNamesComeFromThePeersAndAreBounded) {
  v1::OpenSessionRequest r = Request(0, 3);
  r.mutable_peers(2)->set_worker_id(std::string(1000, 'w'));
  r.add_peers()->set_rank(7);  // outside the plan: ignored
  const std::vector<std::string> names = PeerNames(r);
  ASSERT_EQ(names.size(), 3u);
  EXPECT_EQ(names[1], "worker-1 at 10.0.0.1:7071");
  EXPECT_LT(names[2].size(), 300u);
}

TEST(SessionTransportTest, UcxAddressIsSealedAndNamesPeersInErrors) {
  auto t = CreateSessionTransport("cpu", Request(0, 2), 0);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(OpenPeerAddress(PeerAddressKind::kUcx, (*t)->address()).ok());
  auto job = (*t)->ForJob("j", {(*t)->address(), "junk"}, absl::Seconds(1));
  EXPECT_EQ(job.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(job.status().message().find("worker-1 at 10.0.0.1:7071"), std::string::npos)
      << job.status();
}

#ifdef DFA_HAVE_NCCL
TEST(SessionTransportTest, DamagedNcclIdsAreRefusedNamingRankZero) {
  const std::string id128(128, '\x42');
  for (const std::string& bad : {std::string("junk"), id128,
                                 SealPeerAddress(PeerAddressKind::kUcx, id128),
                                 SealPeerAddress(PeerAddressKind::kNccl, id128.substr(0, 64)),
                                 SealPeerAddress(PeerAddressKind::kNccl, id128).substr(0, 100)}) {
    v1::OpenSessionRequest r = Request(1, 2);
    r.set_transport("nccl");
    r.set_nccl_unique_id(bad);
    auto t = CreateSessionTransport("cuda", r, 0);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kUnavailable) << t.status();
    EXPECT_NE(t.status().message().find("nccl_unique_id from rank 0 (worker-0 at 10.0.0.0:7071)"),
              std::string::npos)
        << t.status();
  }
}
#endif

}  // namespace
}  // namespace dfa
