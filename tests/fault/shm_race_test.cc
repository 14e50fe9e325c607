// A client on the worker's host that attacks the shared-memory path, on real daemons: it tries
// to shrink (and grow, and punch holes in) the segment while the worker copies through it, and
// names shared-memory objects of its own making. The worker maps only the sealed segments it
// made for the session (worker/shm_mappings.h): the resizes fail with EPERM, every transfer
// answers a status, client-named objects are NOT_FOUND and never written, and the worker lives.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "tests/fault/hostile_util.h"

namespace dfa::testing {
namespace {

// Q of batch 1, 4096 rows, 8 heads, head_dim 128, f32: a 16 MiB block per transfer.
v1::AttentionSpec BigSpec() {
  v1::AttentionSpec s;
  s.set_batch(1);
  s.set_q_heads(8);
  s.set_kv_heads(8);
  s.set_head_dim(128);
  s.set_seq_len(4096);
  s.set_causal(true);
  s.set_dtype(v1::DTYPE_F32);
  return s;
}
constexpr int64_t kBlockBytes = int64_t{4096} * 8 * 128 * 4;

class ShmRaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = StartCluster(1);
    ASSERT_NE(cluster_, nullptr);
    auto c = client::Client::Connect(cluster_->client_options());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
    client::SessionOptions so;
    so.spec = BigSpec();
    so.num_workers = 1;
    auto s = client_->CreateSession(so);
    ASSERT_TRUE(s.ok()) << s.status();
    session_ = std::move(*s);
    stub_ = WorkerStub(session_->info().shards(0).address());
  }
  void TearDown() override {
    if (cluster_) {
      EXPECT_TRUE(cluster_->worker_process(0)->Running()) << cluster_->worker_process(0)->LogTail(20);
      EXPECT_TRUE(cluster_->Stop().ok()) << "logs in " << cluster_->log_dir();
    }
  }

  grpc::Status Transfer(const std::string& name, bool upload) {
    v1::SharedMemoryTransferRequest r;
    r.set_session_id(session_->id());
    r.set_client_id(client_->client_id());
    r.set_kind(v1::TENSOR_Q);
    r.set_shm_name(name);
    r.mutable_rows()->set_begin(0);
    r.mutable_rows()->set_end(BigSpec().seq_len());
    r.set_upload(upload);
    r.set_keep_mapping(true);
    v1::SharedMemoryTransferResponse resp;
    return stub_->SharedMemoryTransfer(Ctx(absl::Seconds(30), session_->capability()).get(), r,
                                       &resp);
  }

  // Runs `attack` on another thread while 40 transfers go through `name`; every answer must be
  // a status and the worker must live. Returns how many transfers succeeded.
  int TransfersUnder(const std::string& name, const std::function<void()>& attack) {
    std::atomic<bool> stop{false};
    std::thread attacker([&] {
      while (!stop) attack();
    });
    int ok = 0;
    for (int i = 0; i < 40 && cluster_->worker_process(0)->Running(); ++i) {
      const grpc::Status s = Transfer(name, i % 2 == 0);
      if (s.ok()) ++ok;
      EXPECT_NE(s.error_code(), grpc::StatusCode::UNAVAILABLE)
          << "transfer " << i << ": the worker went away: " << s.error_message();
    }
    stop = true;
    attacker.join();
    EXPECT_TRUE(cluster_->worker_process(0)->Running())
        << "the worker died under a resize race; log:\n" << cluster_->worker_process(0)->LogTail(20);
    return ok;
  }

  std::unique_ptr<client::LocalCluster> cluster_;
  std::unique_ptr<client::Client> client_;
  std::unique_ptr<client::Session> session_;
  std::unique_ptr<v1::Worker::Stub> stub_;
};

TEST_F(ShmRaceTest, TheWorkersSegmentCannotBeResizedUnderItsCopies) {
  v1::CreateSharedMemoryRequest req;
  req.set_session_id(session_->id());
  req.set_client_id(client_->client_id());
  req.set_bytes(kBlockBytes);
  v1::CreateSharedMemoryResponse seg;
  grpc::Status s = stub_->CreateSharedMemory(
      Ctx(absl::Seconds(10), session_->capability()).get(), req, &seg);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const int fd = open(seg.path().c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << seg.path() << ": " << std::strerror(errno);
  std::atomic<int> resized{0}, refused{0};
  const int ok = TransfersUnder(seg.shm_name(), [&] {
    for (off_t size : {off_t{0}, off_t{4096}, off_t{kBlockBytes / 2}, off_t{kBlockBytes * 2}}) {
      if (ftruncate(fd, size) == 0) {
        ++resized;
      } else if (errno == EPERM) {
        ++refused;
      }
    }
    // Punching holes is allowed (the pages come back as zeros on the next touch): no fault.
    (void)fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, kBlockBytes / 2);
  });
  close(fd);
  EXPECT_EQ(resized.load(), 0) << "the client resized the worker's segment";
  EXPECT_GT(refused.load(), 0);
  EXPECT_EQ(ok, 40) << "transfers through the sealed segment fail under the attack";
}

TEST_F(ShmRaceTest, ObjectsTheClientNamesAreNeverMappedOrWritten) {
  // The client's own POSIX object: shrunk and regrown during the calls, filled with 0xAB.
  const std::string name = absl::StrCat("/dfa-shm-race-", getpid());
  shm_unlink(name.c_str());
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, kBlockBytes), 0);
  auto* p = static_cast<uint8_t*>(
      mmap(nullptr, kBlockBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ASSERT_NE(p, MAP_FAILED);
  std::memset(p, 0xAB, kBlockBytes);
  // Inputs exist, so a download would have something to write.
  ASSERT_TRUE(session_->GenerateInputs(1, false).ok());
  const grpc::Status down = Transfer(name, /*upload=*/false);
  EXPECT_EQ(down.error_code(), grpc::StatusCode::NOT_FOUND) << down.error_message();
  bool untouched = true;
  for (int64_t i = 0; i < kBlockBytes; i += 4093) untouched = untouched && p[i] == 0xAB;
  EXPECT_TRUE(untouched) << "the worker wrote into an object the client named";
  munmap(p, kBlockBytes);
  const int ok = TransfersUnder(name, [&] {
    (void)ftruncate(fd, 0);
    (void)ftruncate(fd, kBlockBytes);
  });
  EXPECT_EQ(ok, 0) << "the worker accepted a segment it did not make";
  const grpc::Status up = Transfer(name, /*upload=*/true);
  EXPECT_EQ(up.error_code(), grpc::StatusCode::NOT_FOUND) << up.error_message();
  close(fd);
  shm_unlink(name.c_str());
}

}  // namespace
}  // namespace dfa::testing
