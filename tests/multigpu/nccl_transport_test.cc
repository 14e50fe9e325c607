// NcclTransport on the GPUs of this machine: one thread per rank, one GPU per rank (two ranks
// share a GPU when there is only one). Skipped without GPUs.
#include "core/gpu/nccl_transport.h"
#include "worker/transport/nccl_bootstrap.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "tests/gpu/service/gpu_test_util.h"

namespace dfa {
namespace {

constexpr int kRanks = 2;

// Creates one transport per rank on its own thread and runs `body(rank, transport, stream)`.
void RunRanks(int ranks, const std::function<void(int, NcclTransport*, cudaStream_t)>& body,
              absl::Duration init_timeout = absl::Seconds(60)) {
  auto id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  const int gpus = VisibleGpus();
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      NcclTransportOptions o;
      o.device = r % gpus;
      o.rank = r;
      o.size = ranks;
      o.unique_id = *id;
      o.init_timeout = init_timeout;
      auto t = NcclTransport::Create(o);
      ASSERT_TRUE(t.ok()) << t.status();
      cudaSetDevice(o.device);
      cudaStream_t s;
      ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
      body(r, t->get(), s);
      cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(NcclTransportOptionsTest, BadOptionsNameTheField) {
  NcclTransportOptions o;
  o.size = 2;
  o.rank = 2;
  o.unique_id = std::string(128, 'x');
  auto t = NcclTransport::Create(o);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("rank"), std::string::npos);
  o.rank = 0;
  o.unique_id = "short";
  t = NcclTransport::Create(o);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("unique_id"), std::string::npos);
  o.unique_id = std::string(128, 'x');
  o.size = 0;
  t = NcclTransport::Create(o);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("size"), std::string::npos);
}

// Ring exchange over several steps, each step's receive double-buffered, sends ordered after
// a memset queued on the compute stream, results read back on the compute stream after Wait:
// no host synchronisation between steps.
TEST(NcclTransportTest, RingStepsDeliverInOrderWithoutHostSync) {
  SKIP_UNLESS_GPUS(2);  // NCCL refuses two ranks of one communicator on one GPU
  constexpr size_t kBytes = 8 << 20;
  constexpr int kSteps = 6;
  RunRanks(kRanks, [&](int rank, NcclTransport* t, cudaStream_t s) {
    const int next = (rank + 1) % kRanks, prev = (rank + kRanks - 1) % kRanks;
    void* send = nullptr;
    void* recv[2] = {nullptr, nullptr};
    ASSERT_EQ(cudaMalloc(&send, kBytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&recv[0], kBytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&recv[1], kBytes), cudaSuccess);
    std::vector<uint8_t> got(kSteps);
    std::vector<std::unique_ptr<PendingGroup>> groups;
    for (int step = 0; step < kSteps; ++step) {
      // "Compute" producing this step's payload: value = 16 * rank + step.
      ASSERT_EQ(cudaMemsetAsync(send, 16 * rank + step, kBytes, s), cudaSuccess);
      TransportMessage out{next, send, kBytes};
      TransportMessage in{prev, recv[step % 2], kBytes};
      auto g = t->Post({&out, 1}, {&in, 1}, s);
      ASSERT_TRUE(g.ok()) << g.status();
      ASSERT_TRUE((*g)->Wait(s, absl::Seconds(30)).ok());
      // Consumer on the compute stream: reads the last byte of the received buffer.
      ASSERT_EQ(cudaMemcpyAsync(&got[step], static_cast<char*>(recv[step % 2]) + kBytes - 1, 1,
                                cudaMemcpyDeviceToHost, s),
                cudaSuccess);
      groups.push_back(std::move(*g));
    }
    ASSERT_TRUE(t->Drain(absl::Seconds(30)).ok());
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    for (int step = 0; step < kSteps; ++step) EXPECT_EQ(got[step], 16 * prev + step) << step;
    EXPECT_EQ(t->bytes_sent(), int64_t{kSteps} * kBytes);
    EXPECT_EQ(t->bytes_received(), int64_t{kSteps} * kBytes);
    EXPECT_TRUE(t->status().ok());
    auto idle = t->CollectComputeIdleSeconds();
    ASSERT_TRUE(idle.ok()) << idle.status();
    EXPECT_GE(*idle, 0.0);
    EXPECT_LT(*idle, 10.0);
    groups.clear();
    cudaFree(send);
    cudaFree(recv[0]);
    cudaFree(recv[1]);
  });
}

// Several messages to the same peer in one group are matched in posting order, and sends and
// receives of both directions in one group cannot deadlock.
TEST(NcclTransportTest, ManyMessagesPerPeerMatchInPostingOrder) {
  SKIP_UNLESS_GPUS(2);  // NCCL refuses two ranks of one communicator on one GPU
  constexpr int kMsgs = 5;
  constexpr size_t kBytes = 1 << 16;
  RunRanks(kRanks, [&](int rank, NcclTransport* t, cudaStream_t s) {
    const int peer = 1 - rank;
    std::vector<void*> out(kMsgs), in(kMsgs);
    std::vector<TransportMessage> sends, recvs;
    for (int i = 0; i < kMsgs; ++i) {
      ASSERT_EQ(cudaMalloc(&out[i], kBytes * (i + 1)), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&in[i], kBytes * (i + 1)), cudaSuccess);
      ASSERT_EQ(cudaMemsetAsync(out[i], 100 + 10 * rank + i, kBytes * (i + 1), s), cudaSuccess);
      sends.push_back({peer, out[i], kBytes * (i + 1)});
      recvs.push_back({peer, in[i], kBytes * (i + 1)});
    }
    auto g = t->Post(sends, recvs, s);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE((*g)->Wait(s, absl::Seconds(30)).ok());
    std::vector<uint8_t> first(kMsgs);
    for (int i = 0; i < kMsgs; ++i) {
      cudaMemcpyAsync(&first[i], static_cast<char*>(in[i]) + kBytes * (i + 1) - 1, 1,
                      cudaMemcpyDeviceToHost, s);
    }
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    for (int i = 0; i < kMsgs; ++i) EXPECT_EQ(first[i], 100 + 10 * peer + i);
    g->reset();
    for (int i = 0; i < kMsgs; ++i) {
      cudaFree(out[i]);
      cudaFree(in[i]);
    }
  });
}

// The executor's early group of a step may hold only receives whose sends sit in the peer's
// late group of the same step (the balanced plan's dK/dV partials at P = 2). With one NCCL
// communicator, groups run in issue order, so two ranks doing this wait on each other for ever;
// the transport's per-direction lanes must let it complete.
TEST(NcclTransportTest, ReceiveOnlyGroupBeforeSendOnlyGroupDoesNotDeadlock) {
  SKIP_UNLESS_GPUS(2);  // NCCL refuses two ranks of one communicator on one GPU
  constexpr size_t kBytes = size_t{256} << 20;  // far beyond what NCCL buffers without a receiver
  RunRanks(kRanks, [&](int rank, NcclTransport* t, cudaStream_t s) {
    const int peer = 1 - rank;
    void *out = nullptr, *in = nullptr;
    ASSERT_EQ(cudaMalloc(&out, kBytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&in, kBytes), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(out, 7 + rank, kBytes, s), cudaSuccess);
    TransportMessage recv{peer, in, kBytes};
    TransportMessage send{peer, out, kBytes};
    auto early = t->Post({}, {&recv, 1}, s);
    ASSERT_TRUE(early.ok()) << early.status();
    auto late = t->Post({&send, 1}, {}, s);
    ASSERT_TRUE(late.ok()) << late.status();
    ASSERT_TRUE((*early)->Wait(s, absl::Seconds(20)).ok());
    ASSERT_TRUE((*late)->Wait(s, absl::Seconds(20)).ok());
    absl::Status st = t->Drain(absl::Seconds(30));
    EXPECT_TRUE(st.ok()) << st;
    uint8_t last = 0;
    cudaMemcpyAsync(&last, static_cast<char*>(in) + kBytes - 1, 1, cudaMemcpyDeviceToHost, s);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(last, 7 + peer);
    early->reset();
    late->reset();
    cudaFree(out);
    cudaFree(in);
  });
}

TEST(NcclTransportTest, BadMessagesAreRejected) {
  SKIP_UNLESS_GPUS(2);  // NCCL refuses two ranks of one communicator on one GPU
  RunRanks(kRanks, [&](int rank, NcclTransport* t, cudaStream_t s) {
    TransportMessage self{rank, nullptr, 0};
    auto g = t->Post({&self, 1}, {}, s);
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    TransportMessage null_data{1 - rank, nullptr, 16};
    g = t->Post({}, {&null_data, 1}, s);
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(t->status().ok());  // rejected before touching NCCL: transport still healthy
  });
}

// A peer that never posts its matching receive: the job fails with DEADLINE_EXCEEDED within the
// step timeout instead of hanging, and the stuck NCCL kernel is released (streams drain).
TEST(NcclTransportTest, MissingPeerFailsTheGroupInsteadOfHanging) {
  SKIP_UNLESS_GPUS(2);  // NCCL refuses two ranks of one communicator on one GPU
  RunRanks(kRanks, [&](int rank, NcclTransport* t, cudaStream_t s) {
    if (rank == 1) {
      // Silent peer: posts nothing, then leaves without a clean shutdown.
      absl::SleepFor(absl::Seconds(2));
      t->Abort();
      EXPECT_EQ(t->status().code(), absl::StatusCode::kCancelled);
      return;
    }
    // Large enough that NCCL cannot complete it into its own buffers without a receiver.
    constexpr size_t kBytes = size_t{512} << 20;
    void* buf = nullptr;
    ASSERT_EQ(cudaMalloc(&buf, kBytes), cudaSuccess);
    TransportMessage out{1, buf, kBytes};
    auto g = t->Post({&out, 1}, {}, s);
    ASSERT_TRUE(g.ok()) << g.status();
    const absl::Time start = absl::Now();
    ASSERT_TRUE((*g)->Wait(s, absl::Milliseconds(500)).ok());  // queues the wait; returns at once
    absl::Status st = t->Drain(absl::Seconds(20));
    EXPECT_FALSE(st.ok());
    EXPECT_TRUE(st.code() == absl::StatusCode::kDeadlineExceeded ||
                st.code() == absl::StatusCode::kUnavailable)
        << st;
    EXPECT_LT(absl::Now() - start, absl::Seconds(15));
    // Later posts fail at once with the same error.
    EXPECT_EQ(t->Post({&out, 1}, {}, s).status().code(), st.code());
    // The compute stream, which waited on the aborted group, drains.
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    g->reset();
    cudaFree(buf);
  });
}

TEST(NcclTransportTest, InitTimesOutWhenPeersDoNotJoin) {
  SKIP_UNLESS_GPUS(1);
  auto id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  NcclTransportOptions o;
  o.rank = 0;
  o.size = 2;
  o.unique_id = *id;
  o.init_timeout = absl::Seconds(2);
  const absl::Time start = absl::Now();
  auto t = NcclTransport::Create(o);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDeadlineExceeded) << t.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(12));
}

TEST(NcclBootstrapTest, OnlyRankZeroMayCreateTheId) {
  auto b = NcclBootstrap::Start(0, 1, 2, "", absl::Seconds(1));
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("nccl_unique_id"), std::string::npos);
  EXPECT_EQ(NcclBootstrap::Start(0, 2, 2, "x", absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The service's sequence: rank 0 opens first and creates the id, rank 1 opens with it; both
// return at once and the transports are usable once Get() returns.
TEST(NcclBootstrapTest, RankZeroIdBootstrapsTheGroup) {
  SKIP_UNLESS_GPUS(2);  // NCCL refuses two ranks of one communicator on one GPU
  const int gpus = VisibleGpus();
  auto b0 = NcclBootstrap::Start(0, 0, 2, "", absl::Seconds(60));
  ASSERT_TRUE(b0.ok()) << b0.status();
  auto b1 = NcclBootstrap::Start(1 % gpus, 1, 2, (*b0)->unique_id(), absl::Seconds(60));
  ASSERT_TRUE(b1.ok()) << b1.status();
  EXPECT_EQ((*b0)->unique_id(), (*b1)->unique_id());
  auto t0 = (*b0)->Get(absl::Seconds(60));
  auto t1 = (*b1)->Get(absl::Seconds(60));
  ASSERT_TRUE(t0.ok()) << t0.status();
  ASSERT_TRUE(t1.ok()) << t1.status();
  EXPECT_EQ((*t0)->rank(), 0);
  EXPECT_EQ((*t1)->rank(), 1);
  EXPECT_EQ((*t1)->Name(), "nccl");
  EXPECT_NE((*b1)->nccl(), nullptr);
}

}  // namespace
}  // namespace dfa
