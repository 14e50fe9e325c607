// Bad inputs through the client path, against real daemons: each is answered with the right
// gRPC status and a message naming the field, and no daemon crashes (a good job runs after).
#include <gtest/gtest.h>

#include "client/grpc_util.h"
#include "tests/integration/cluster_fixture.h"
#include "core/wire/crc32c.h"

namespace dfa::testing {
namespace {

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = StartClusterOrSkip(2, {"--max_seq_len=65536"});
    if (!cluster_) GTEST_SKIP() << "dfa-coordinator / dfa-worker not built";
    auto c = client::Client::Connect(cluster_->coordinator_address());
    ASSERT_TRUE(c.ok());
    client_ = std::move(*c);
  }
  void TearDown() override {
    if (!cluster_) return;
    // Still serving: a good job runs to the end and matches the reference.
    const auto spec = MakeSpec(1, 64, 2, 2, 16, true);
    const TrainingInputs in = RandomInputs(spec, 5);
    RunResult r = RunTraining(client_.get(), spec, 2, "balanced", in);
    ExpectMatchesReference(spec, in, r);
    EXPECT_TRUE(cluster_->Stop().ok()) << "a daemon crashed or did not stop cleanly";
  }

  // Sends the request straight to the coordinator (bypassing the library's own checks).
  absl::Status RawCreate(const v1::AttentionSpec& spec) {
    grpc::ClientContext ctx;
    client::SetDeadline(&ctx, absl::Seconds(10));
    v1::CreateSessionRequest req;
    *req.mutable_spec() = spec;
    req.set_client_id(client_->client_id());
    v1::CreateSessionResponse resp;
    return client::FromGrpc(client_->coordinator()->CreateSession(&ctx, req, &resp), "raw");
  }

  std::unique_ptr<client::Session> GoodSession(client::Client* c) {
    client::SessionOptions o;
    o.spec = MakeSpec(1, 64, 2, 2, 16, true);
    o.num_workers = 2;
    auto s = c->CreateSession(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  std::unique_ptr<client::LocalCluster> cluster_;
  std::unique_ptr<client::Client> client_;
};

void ExpectError(const absl::Status& s, absl::StatusCode code, const std::string& field) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(s.message().find(field), std::string::npos) << "message should name '" << field
                                                         << "': " << s;
}

TEST_F(BadInputTest, BadSpecsAreInvalidArgumentNamingTheField) {
  struct BadSpec {
    v1::AttentionSpec spec;
    std::string field;
  };
  std::vector<BadSpec> cases = {
      {MakeSpec(0, 64, 2, 2, 16, true), "batch"},
      {MakeSpec(1, 0, 2, 2, 16, true), "seq_len"},
      {MakeSpec(1, -5, 2, 2, 16, true), "seq_len"},
      {MakeSpec(1, 64, 0, 1, 16, true), "q_heads"},
      {MakeSpec(1, 64, 6, 4, 16, true), "heads"},  // not divisible
      {MakeSpec(1, 64, 2, -1, 16, true), "kv_heads"},
      {MakeSpec(1, 64, 2, 2, 0, true), "head_dim"},
      {MakeSpec(1, 64, 2, 2, 16, true, v1::DTYPE_UNSPECIFIED), "dtype"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.spec.ShortDebugString());
    // The library refuses before sending ...
    client::SessionOptions o;
    o.spec = c.spec;
    ExpectError(client_->CreateSession(o).status(), absl::StatusCode::kInvalidArgument, c.field);
    // ... and so does the coordinator when a client skips those checks.
    ExpectError(RawCreate(c.spec), absl::StatusCode::kInvalidArgument, c.field);
  }
  // Unsupported head dimension (CPU backend: [1, 512]) and sizes over the configured limits.
  EXPECT_FALSE(RawCreate(MakeSpec(1, 64, 2, 2, 1000, true)).ok());
  absl::Status over = RawCreate(MakeSpec(1, 1 << 20, 2, 2, 16, true));
  EXPECT_TRUE(over.code() == absl::StatusCode::kInvalidArgument ||
              over.code() == absl::StatusCode::kOutOfRange ||
              over.code() == absl::StatusCode::kResourceExhausted)
      << over;
  EXPECT_NE(over.message().find("seq_len"), std::string::npos) << over;
}

TEST_F(BadInputTest, SessionThatWillNotFitIsResourceExhausted) {
  client::SessionOptions o;
  o.spec = MakeSpec(64, 65536, 64, 64, 128, true);  // 64 GiB per input tensor
  o.num_workers = 2;
  EXPECT_EQ(client_->CreateSession(o).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(BadInputTest, UnknownAndForeignSessions) {
  auto session = GoodSession(client_.get());
  ASSERT_NE(session, nullptr);
  // Unknown session id at the coordinator and at a worker.
  {
    grpc::ClientContext ctx;
    client::SetDeadline(&ctx, absl::Seconds(10));
    v1::SubmitJobRequest req;
    req.set_session_id("no-such-session");
    req.set_client_id(client_->client_id());
    req.set_kind(v1::JOB_FORWARD);
    v1::Job job;
    auto s = client::FromGrpc(client_->coordinator()->SubmitJob(&ctx, req, &job), "SubmitJob");
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  }
  {
    const auto& shard = session->info().shards(0);
    client::WorkerDataClient data(client_->WorkerChannel(shard.address()), shard.address(),
                                  "no-such-session", client_->client_id(),
                                  session->capability(), absl::Seconds(10));
    auto q = *client::MakeTensor(session->spec(), v1::TENSOR_Q);
    std::vector<v1::RowRange> owned(shard.owned().begin(), shard.owned().end());
    auto s = data.UploadGrpc(v1::TENSOR_Q, q, owned, 1 << 20, nullptr).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  }
  // Another client may not use this session.
  client::ClientOptions other_options;
  other_options.coordinator = cluster_->coordinator_address();
  other_options.client_id = "someone-else";
  auto other = client::Client::Connect(other_options);
  ASSERT_TRUE(other.ok());
  {
    grpc::ClientContext ctx;
    client::SetDeadline(&ctx, absl::Seconds(10));
    v1::SubmitJobRequest req;
    req.set_session_id(session->id());
    req.set_client_id("someone-else");
    req.set_kind(v1::JOB_FORWARD);
    v1::Job job;
    auto s = client::FromGrpc((*other)->coordinator()->SubmitJob(&ctx, req, &job), "SubmitJob");
    EXPECT_TRUE(s.code() == absl::StatusCode::kPermissionDenied ||
                s.code() == absl::StatusCode::kNotFound)
        << s;
  }
  {
    const auto& shard = session->info().shards(0);
    client::WorkerDataClient data((*other)->WorkerChannel(shard.address()), shard.address(),
                                  session->id(), "someone-else", /*capability=*/"",
                                  absl::Seconds(10));
    auto q = *client::MakeTensor(session->spec(), v1::TENSOR_Q);
    std::vector<v1::RowRange> owned(shard.owned().begin(), shard.owned().end());
    auto s = data.UploadGrpc(v1::TENSOR_Q, q, owned, 1 << 20, nullptr).status();
    EXPECT_TRUE(s.code() == absl::StatusCode::kPermissionDenied ||
                s.code() == absl::StatusCode::kNotFound)
        << s;
  }
}

TEST_F(BadInputTest, BadChunksAreRejected) {
  auto session = GoodSession(client_.get());
  ASSERT_NE(session, nullptr);
  client::WorkerDataClient& data = session->DataClient(0);
  const auto& owned = session->info().shards(0).owned(0);
  const int64_t row_bytes = 2 * 16 * 2;  // q_heads * head_dim * bf16
  auto chunk = [&](int64_t begin, int64_t end) {
    v1::TensorChunk c;
    c.set_kind(v1::TENSOR_Q);
    c.mutable_rows()->set_begin(begin);
    c.mutable_rows()->set_end(end);
    c.set_data(std::string(static_cast<size_t>((end - begin) * row_bytes), '\x3c'));
    c.set_crc32c(Crc32c(c.data().data(), c.data().size()));
    return c;
  };
  // A good chunk is accepted.
  v1::TensorChunk good = chunk(owned.begin(), owned.begin() + 1);
  auto ok = data.UploadChunks(std::vector<v1::TensorChunk>{good});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->bytes_received(), row_bytes);

  // Checksum mismatch: DATA_LOSS.
  v1::TensorChunk bad = good;
  bad.set_crc32c(good.crc32c() ^ 0x1);
  EXPECT_EQ(data.UploadChunks(std::vector<v1::TensorChunk>{bad}).status().code(),
            absl::StatusCode::kDataLoss);
  // Rows outside the worker's shard.
  const int64_t seq = session->spec().seq_len();
  const int64_t outside_begin = owned.end() < seq ? owned.end() : owned.begin() - 1;
  bad = chunk(outside_begin, outside_begin + 1);
  if (session->info().shards(0).owned_size() == 1) {
    auto s = data.UploadChunks(std::vector<v1::TensorChunk>{bad}).status();
    EXPECT_TRUE(s.code() == absl::StatusCode::kOutOfRange ||
                s.code() == absl::StatusCode::kInvalidArgument)
        << s;
    EXPECT_NE(s.message().find("rows"), std::string::npos) << s;
  }
  // Past the end of the sequence, and a negative batch index.
  bad = chunk(seq, seq + 2);
  EXPECT_FALSE(data.UploadChunks(std::vector<v1::TensorChunk>{bad}).ok());
  bad = good;
  bad.set_batch_index(-1);
  EXPECT_FALSE(data.UploadChunks(std::vector<v1::TensorChunk>{bad}).ok());
  // Data size not matching its rows.
  bad = good;
  bad.set_data(good.data() + "xy");
  bad.set_crc32c(Crc32c(bad.data().data(), bad.data().size()));
  EXPECT_FALSE(data.UploadChunks(std::vector<v1::TensorChunk>{bad}).ok());
  // A kind the client may not upload.
  bad = good;
  bad.set_kind(v1::TENSOR_O);
  EXPECT_FALSE(data.UploadChunks(std::vector<v1::TensorChunk>{bad}).ok());
}

TEST_F(BadInputTest, BackwardBeforeForwardIsFailedPrecondition) {
  auto session = GoodSession(client_.get());
  ASSERT_NE(session, nullptr);
  auto s = session->Submit(v1::JOB_BACKWARD).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  // The library's training flow refuses it locally too.
  client::AttentionJobOptions o;
  o.session.spec = session->spec();
  client::AttentionJob job(client_.get(), o);
  client::HostTensor dout = *client::MakeTensor(session->spec(), v1::TENSOR_DO);
  EXPECT_EQ(job.Backward(dout).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace dfa::testing
