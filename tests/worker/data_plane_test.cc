// Worker.Upload and Worker.Download (worker/data_plane_reactors.h) through a gRPC server that
// serves WorkerServiceImpl on a loopback port, called by method name through the generated
// stub: tensors round-trip exactly in many chunks, bad streams answer the field-naming errors,
// many streams run at once, a stalled reader holds the worker back to a few chunks in flight,
// and a cancelled or expired call ends its stream (counted) while the worker keeps serving.
#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/planner/plan_proto.h"
#include "core/planner/planner.h"
#include "core/wire/crc32c.h"
#include "dfa/v1/worker.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "kernels/attention_backend.h"
#include "worker/job_runner.h"
#include "worker/memory_budget.h"
#include "worker/session_registry.h"
#include "worker/worker_metrics.h"
#include "tests/worker/worker_test_util.h"
#include "worker/worker_service.h"

namespace dfa {
namespace {

using grpc::StatusCode;

constexpr char kClient[] = "client-a";

// batch 2, 4 query heads, 2 kv heads, head_dim 16, fp32: Q rows of 256 bytes, K/V of 128.
v1::AttentionSpec SmallSpec(int64_t seq_len) {
  v1::AttentionSpec s;
  s.set_batch(2);
  s.set_q_heads(4);
  s.set_kv_heads(2);
  s.set_head_dim(16);
  s.set_seq_len(seq_len);
  s.set_causal(true);
  s.set_dtype(v1::DTYPE_F32);
  return s;
}

// batch 1, 32 heads of 128, bf16: rows of 8 KiB (as the data-plane benchmark).
v1::AttentionSpec WideSpec(int64_t seq_len) {
  v1::AttentionSpec s;
  s.set_batch(1);
  s.set_q_heads(32);
  s.set_kv_heads(32);
  s.set_head_dim(128);
  s.set_seq_len(seq_len);
  s.set_causal(true);
  s.set_dtype(v1::DTYPE_BF16);
  return s;
}

int64_t RowBytes(const v1::AttentionSpec& s, v1::TensorKind kind) {
  const int heads = kind == v1::TENSOR_Q ? s.q_heads() : s.kv_heads();
  return int64_t{heads} * s.head_dim() * (s.dtype() == v1::DTYPE_F32 ? 4 : 2);
}

// Sum of the counter series of `name` whose labels include `labels`.
double Counter(const WorkerMetrics& m, const std::string& name,
               const std::map<std::string, std::string>& labels) {
  double sum = 0;
  for (const prometheus::MetricFamily& f : m.registry()->Collect()) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& c : f.metric) {
      int matched = 0;
      for (const prometheus::ClientMetric::Label& l : c.label) {
        auto it = labels.find(l.name);
        if (it != labels.end() && it->second == l.value) ++matched;
      }
      if (matched == static_cast<int>(labels.size())) sum += c.counter.value;
    }
  }
  return sum;
}

class DataPlaneTest : public ::testing::Test {
 protected:
  void Start(int64_t memory_limit_bytes = 64 << 20) {
    budget_ = std::make_unique<MemoryBudget>(memory_limit_bytes);
    BackendOptions bo;
    bo.num_threads = 1;
    sessions_ = std::make_unique<SessionRegistry>("cpu", 0, budget_.get(),
                                                  [bo] { return CreateBackend("cpu", bo); });
    jobs_ = std::make_unique<JobRunner>(sessions_.get(), nullptr, absl::Seconds(30));
    metrics_ = std::make_unique<WorkerMetrics>("data-plane-test");
    service_ = std::make_unique<WorkerServiceImpl>(sessions_.get(), jobs_.get(), budget_.get(),
                                                   metrics_.get());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_TRUE(server_ != nullptr);
    ASSERT_GT(port, 0);
    address_ = "127.0.0.1:" + std::to_string(port);
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);  // 4 MiB chunks and their headers
    channel_ = grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args);
    stub_ = v1::Worker::NewStub(channel_);
  }
  void TearDown() override {
    if (server_) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
      server_->Wait();
    }
  }

  void Open(const std::string& id, const v1::AttentionSpec& spec) {
    PlanRequest pr;
    pr.schedule = "ring";
    pr.workers = 1;
    pr.seq_len = spec.seq_len();
    pr.causal = spec.causal();
    auto plan = MakePlan(pr);
    ASSERT_TRUE(plan.ok()) << plan.status();
    v1::OpenSessionRequest r;
    r.set_session_id(id);
    r.set_client_id(kClient);
    r.set_rank(0);
    r.set_transport("ucx");
    *r.mutable_spec() = spec;
    PlanToProto(*plan, r.mutable_plan());
    grpc::ClientContext ctx;
    v1::OpenSessionResponse resp;
    const grpc::Status st = stub_->OpenSession(&ctx, r, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }

  // Uploads `messages` as one stream; *resp gets the answer.
  grpc::Status UploadMessages(const std::vector<v1::UploadRequest>& messages,
                              v1::UploadResponse* resp) {
    grpc::ClientContext ctx;
    auto writer = stub_->Upload(&ctx, resp);
    for (const v1::UploadRequest& m : messages) {
      if (!writer->Write(m)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }

  // `tensor` (batch-major, [batch][seq_len rows]) of `kind` as chunks of `rows_per_chunk` rows.
  std::vector<v1::UploadRequest> ChunksOf(const std::string& id, const v1::AttentionSpec& spec,
                                          v1::TensorKind kind, const std::string& tensor,
                                          int64_t rows_per_chunk) {
    const int64_t row_bytes = RowBytes(spec, kind);
    std::vector<v1::UploadRequest> out;
    for (int b = 0; b < spec.batch(); ++b) {
      for (int64_t r0 = 0; r0 < spec.seq_len(); r0 += rows_per_chunk) {
        const int64_t r1 = std::min(spec.seq_len(), r0 + rows_per_chunk);
        v1::UploadRequest m;
        if (out.empty()) {
          m.set_session_id(id);
          m.set_client_id(kClient);
        }
        v1::TensorChunk* c = m.mutable_chunk();
        c->set_kind(kind);
        c->mutable_rows()->set_begin(r0);
        c->mutable_rows()->set_end(r1);
        c->set_batch_index(b);
        c->set_data(tensor.substr(static_cast<size_t>((b * spec.seq_len() + r0) * row_bytes),
                                  static_cast<size_t>((r1 - r0) * row_bytes)));
        c->set_crc32c(Crc32c(c->data().data(), c->data().size()));
        out.push_back(std::move(m));
      }
    }
    return out;
  }

  // Downloads `request`, placing each chunk at its batch and rows in *tensor (sized by the
  // caller, batch-major); returns the call's status and the chunks received.
  grpc::Status DownloadInto(const v1::DownloadRequest& request, const v1::AttentionSpec& spec,
                            std::string* tensor, std::vector<v1::TensorChunk>* chunks) {
    grpc::ClientContext ctx;
    auto reader = stub_->Download(&ctx, request);
    const int64_t row_bytes = RowBytes(spec, request.kind());
    v1::TensorChunk c;
    while (reader->Read(&c)) {
      EXPECT_EQ(Crc32c(c.data().data(), c.data().size()), c.crc32c());
      const int64_t at = (c.batch_index() * spec.seq_len() + c.rows().begin()) * row_bytes;
      EXPECT_EQ(static_cast<int64_t>(c.data().size()),
                (c.rows().end() - c.rows().begin()) * row_bytes);
      if (at >= 0 &&
          at + static_cast<int64_t>(c.data().size()) <= static_cast<int64_t>(tensor->size())) {
        std::memcpy(tensor->data() + at, c.data().data(), c.data().size());
      }
      chunks->push_back(c);
    }
    return reader->Finish();
  }

  v1::DownloadRequest DownloadReq(const std::string& id, v1::TensorKind kind, int32_t chunk_bytes) {
    v1::DownloadRequest r;
    r.set_session_id(id);
    r.set_client_id(kClient);
    r.set_kind(kind);
    r.set_chunk_bytes(chunk_bytes);
    return r;
  }

  double ClientBytes(const char* direction) const {
    return Counter(*metrics_, "dfa_worker_client_bytes_total",
                   {{"direction", direction}, {"path", "grpc"}});
  }
  double Errors(const char* method, const char* code) const {
    return Counter(*metrics_, "dfa_grpc_errors_total", {{"method", method}, {"code", code}});
  }

  std::unique_ptr<MemoryBudget> budget_;
  std::unique_ptr<SessionRegistry> sessions_;
  std::unique_ptr<JobRunner> jobs_;
  std::unique_ptr<WorkerMetrics> metrics_;
  std::unique_ptr<WorkerServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Worker::Stub> stub_;
};

std::string Pattern(size_t bytes, int seed) {
  std::string s(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) s[i] = static_cast<char>(i * 131 + seed * 17 + (i >> 9));
  return s;
}

TEST_F(DataPlaneTest, UploadThenDownloadRoundTripsEveryInputInManyChunks) {
  Start();
  const v1::AttentionSpec spec = SmallSpec(64);
  Open("s", spec);
  int seed = 0;
  for (v1::TensorKind kind : {v1::TENSOR_Q, v1::TENSOR_K, v1::TENSOR_V}) {
    SCOPED_TRACE(v1::TensorKind_Name(kind));
    const int64_t row_bytes = RowBytes(spec, kind);
    const std::string tensor = Pattern(static_cast<size_t>(2 * 64 * row_bytes), ++seed);
    const std::vector<v1::UploadRequest> chunks = ChunksOf("s", spec, kind, tensor, 5);
    v1::UploadResponse up;
    const double uploaded_before = ClientBytes("upload");
    const grpc::Status ust = UploadMessages(chunks, &up);
    ASSERT_TRUE(ust.ok()) << ust.error_message();
    EXPECT_EQ(up.bytes_received(), static_cast<int64_t>(tensor.size()));
    EXPECT_EQ(up.chunks_received(), static_cast<int32_t>(chunks.size()));
    EXPECT_EQ(ClientBytes("upload") - uploaded_before, static_cast<double>(tensor.size()));

    // 3 rows per chunk (the chunk size is not a multiple of the row size).
    std::string back(tensor.size(), '\0');
    std::vector<v1::TensorChunk> got;
    const double downloaded_before = ClientBytes("download");
    const grpc::Status dst = DownloadInto(
        DownloadReq("s", kind, static_cast<int32_t>(3 * row_bytes + 10)), spec, &back, &got);
    ASSERT_TRUE(dst.ok()) << dst.error_message();
    EXPECT_EQ(got.size(), size_t{2 * 22});  // ceil(64 / 3) chunks per batch
    for (const v1::TensorChunk& c : got) EXPECT_LE(c.rows().end() - c.rows().begin(), 3);
    EXPECT_TRUE(back == tensor) << "downloaded data differs from the uploaded";
    EXPECT_EQ(ClientBytes("download") - downloaded_before, static_cast<double>(tensor.size()));

    // One chunk per batch at the default chunk size; a row range sends only its rows.
    got.clear();
    std::string whole(tensor.size(), '\0');
    ASSERT_TRUE(DownloadInto(DownloadReq("s", kind, 0), spec, &whole, &got).ok());
    EXPECT_EQ(got.size(), size_t{2});
    EXPECT_TRUE(whole == tensor);
    got.clear();
    v1::DownloadRequest part = DownloadReq("s", kind, static_cast<int32_t>(8 * row_bytes));
    part.mutable_rows()->set_begin(10);
    part.mutable_rows()->set_end(50);
    std::string some(tensor.size(), '\0');
    ASSERT_TRUE(DownloadInto(part, spec, &some, &got).ok());
    ASSERT_EQ(got.size(), size_t{2 * 5});
    EXPECT_EQ(got.front().rows().begin(), 10);
    EXPECT_EQ(got.back().rows().end(), 50);
    for (int b = 0; b < 2; ++b) {
      const size_t at = static_cast<size_t>((b * 64 + 10) * row_bytes);
      const size_t n = static_cast<size_t>(40 * row_bytes);
      EXPECT_EQ(some.compare(at, n, tensor, at, n), 0) << "batch " << b;
    }
  }
}

TEST_F(DataPlaneTest, BadUploadStreamsNameWhatIsWrong) {
  Start();
  const v1::AttentionSpec spec = SmallSpec(64);
  Open("s", spec);
  Open("t", spec);
  const std::string q = Pattern(static_cast<size_t>(2 * 64 * RowBytes(spec, v1::TENSOR_Q)), 1);
  std::vector<v1::UploadRequest> good = ChunksOf("s", spec, v1::TENSOR_Q, q, 16);
  v1::UploadResponse resp;

  EXPECT_RPC_ERROR(UploadMessages({}, &resp), StatusCode::INVALID_ARGUMENT,
                   "empty upload stream (no session_id)");
  std::vector<v1::UploadRequest> no_id = good;
  no_id[0].clear_session_id();
  EXPECT_RPC_ERROR(UploadMessages(no_id, &resp), StatusCode::INVALID_ARGUMENT,
                   "session_id must be set on the first message");
  std::vector<v1::UploadRequest> other = good;
  other[1].set_session_id("t");
  EXPECT_RPC_ERROR(UploadMessages(other, &resp), StatusCode::INVALID_ARGUMENT,
                   "session_id = 't' differs from the stream's 's'");
  std::vector<v1::UploadRequest> missing = good;
  missing[2].clear_chunk();
  EXPECT_RPC_ERROR(UploadMessages(missing, &resp), StatusCode::INVALID_ARGUMENT,
                   "chunk is missing in message 2");
  std::vector<v1::UploadRequest> bad_crc = good;
  bad_crc[3].mutable_chunk()->set_crc32c(bad_crc[3].chunk().crc32c() ^ 1);
  EXPECT_RPC_ERROR(UploadMessages(bad_crc, &resp), StatusCode::DATA_LOSS,
                   "does not match the data");
  EXPECT_GE(Errors("Upload", "DATA_LOSS"), 1);
  EXPECT_GE(Errors("Upload", "INVALID_ARGUMENT"), 4);

  // A header-only first message, then the chunks.
  std::vector<v1::UploadRequest> header_first(1);
  header_first[0].set_session_id("s");
  header_first[0].set_client_id(kClient);
  for (v1::UploadRequest m : good) {
    m.clear_session_id();
    m.clear_client_id();
    header_first.push_back(std::move(m));
  }
  const grpc::Status st = UploadMessages(header_first, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.chunks_received(), static_cast<int32_t>(good.size()));
  EXPECT_EQ(resp.bytes_received(), static_cast<int64_t>(q.size()));
}

TEST_F(DataPlaneTest, BadDownloadRequestsNameTheField) {
  Start();
  const v1::AttentionSpec spec = SmallSpec(64);
  Open("s", spec);
  std::string sink(1 << 20, '\0');
  std::vector<v1::TensorChunk> got;
  EXPECT_RPC_ERROR(DownloadInto(DownloadReq("nope", v1::TENSOR_Q, 0), spec, &sink, &got),
                   StatusCode::NOT_FOUND, "session_id");
  v1::DownloadRequest stranger = DownloadReq("s", v1::TENSOR_Q, 0);
  stranger.set_client_id("client-b");
  EXPECT_RPC_ERROR(DownloadInto(stranger, spec, &sink, &got), StatusCode::PERMISSION_DENIED,
                   "session_id");
  EXPECT_RPC_ERROR(DownloadInto(DownloadReq("s", v1::TENSOR_Q, -1), spec, &sink, &got),
                   StatusCode::INVALID_ARGUMENT, "chunk_bytes = -1 must be >= 0");
  EXPECT_RPC_ERROR(DownloadInto(DownloadReq("s", v1::TENSOR_O, 0), spec, &sink, &got),
                   StatusCode::FAILED_PRECONDITION, "TENSOR_O");
  v1::DownloadRequest outside = DownloadReq("s", v1::TENSOR_Q, 0);
  outside.mutable_rows()->set_begin(60);
  outside.mutable_rows()->set_end(70);
  EXPECT_RPC_ERROR(DownloadInto(outside, spec, &sink, &got), StatusCode::OUT_OF_RANGE, "rows");
  EXPECT_TRUE(got.empty());
  EXPECT_GE(Errors("Download", "INVALID_ARGUMENT"), 1);

  // Request bytes that are not a DownloadRequest (field 1 with a truncated length).
  grpc::GenericStub generic(channel_);
  grpc::ClientContext ctx;
  const std::string junk("\x0a\x7f\x01", 3);
  grpc::Slice slice(junk);
  const grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  generic.UnaryCall(&ctx, "/dfa.v1.Worker/Download", grpc::StubOptions(), &request, &response,
                    [&done](grpc::Status s) { done.set_value(std::move(s)); });
  EXPECT_RPC_ERROR(done.get_future().get(), StatusCode::INVALID_ARGUMENT,
                   "is not a dfa.v1.DownloadRequest");
}

TEST_F(DataPlaneTest, ManyStreamsAtOnce) {
  Start();
  const v1::AttentionSpec spec = SmallSpec(64);
  constexpr int kStreams = 8;
  for (int i = 0; i < kStreams; ++i) Open(absl::StrCat("s", i), spec);
  const int64_t row_bytes = RowBytes(spec, v1::TENSOR_Q);
  std::vector<std::string> failures(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      const std::string id = absl::StrCat("s", i);
      const std::string q = Pattern(static_cast<size_t>(2 * 64 * row_bytes), 100 + i);
      for (int round = 0; round < 3; ++round) {
        v1::UploadResponse resp;
        const grpc::Status up = UploadMessages(ChunksOf(id, spec, v1::TENSOR_Q, q, 1 + i), &resp);
        if (!up.ok()) failures[i] = "upload: " + up.error_message();
        std::string back(q.size(), '\0');
        std::vector<v1::TensorChunk> got;
        const grpc::Status down =
            DownloadInto(DownloadReq(id, v1::TENSOR_Q, static_cast<int32_t>((1 + i) * row_bytes)),
                         spec, &back, &got);
        if (!down.ok()) failures[i] = "download: " + down.error_message();
        if (back != q) failures[i] = absl::StrCat("round ", round, " differs");
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kStreams; ++i) EXPECT_EQ(failures[i], "") << "stream " << i;
}

// A reader that stops reading holds the worker to what HTTP/2 flow control lets through: the
// worker fills and sends one chunk at a time and does not run ahead through the tensor.
TEST_F(DataPlaneTest, StalledReaderHoldsTheWorkerBack) {
  Start(int64_t{1} << 30);
  const v1::AttentionSpec spec = WideSpec(2048);  // Q: 16 MiB
  Open("big", spec);
  {
    grpc::ClientContext ctx;
    v1::GenerateInputsRequest g;
    g.set_session_id("big");
    g.set_client_id(kClient);
    g.set_seed(7);
    v1::GenerateInputsResponse gr;
    ASSERT_TRUE(stub_->GenerateInputs(&ctx, g, &gr).ok());
  }
  const int64_t total = spec.seq_len() * RowBytes(spec, v1::TENSOR_Q);
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 10);
  auto slow = v1::Worker::NewStub(
      grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args));
  const double before = ClientBytes("download");
  grpc::ClientContext ctx;
  auto reader = slow->Download(&ctx, DownloadReq("big", v1::TENSOR_Q, 64 << 10));
  v1::TensorChunk c;
  ASSERT_TRUE(reader->Read(&c));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const double sent_while_stalled = ClientBytes("download") - before;
  EXPECT_GT(sent_while_stalled, 0);
  // About two chunks get through a 64 KiB window; 16 of 256 leaves room for timing.
  EXPECT_LE(sent_while_stalled, 16.0 * (64 << 10)) << "the worker ran ahead of a stalled reader";
  int64_t got = static_cast<int64_t>(c.data().size());
  while (reader->Read(&c)) got += static_cast<int64_t>(c.data().size());
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(got, total);
  EXPECT_EQ(ClientBytes("download") - before, static_cast<double>(total));
}

TEST_F(DataPlaneTest, CancelledAndExpiredDownloadsEndAndTheWorkerKeepsServing) {
  Start(int64_t{1} << 30);
  const v1::AttentionSpec spec = WideSpec(2048);
  Open("big", spec);
  {
    grpc::ClientContext ctx;
    v1::GenerateInputsRequest g;
    g.set_session_id("big");
    g.set_client_id(kClient);
    g.set_seed(7);
    v1::GenerateInputsResponse gr;
    ASSERT_TRUE(stub_->GenerateInputs(&ctx, g, &gr).ok());
  }
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 10);
  auto slow = v1::Worker::NewStub(
      grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args));
  {
    grpc::ClientContext ctx;
    auto reader = slow->Download(&ctx, DownloadReq("big", v1::TENSOR_Q, 64 << 10));
    v1::TensorChunk c;
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(reader->Read(&c));
    ctx.TryCancel();
    while (reader->Read(&c)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), StatusCode::CANCELLED);
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
    auto reader = slow->Download(&ctx, DownloadReq("big", v1::TENSOR_Q, 64 << 10));
    v1::TensorChunk c;
    ASSERT_TRUE(reader->Read(&c));
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    while (reader->Read(&c)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), StatusCode::DEADLINE_EXCEEDED);
  }
  // The worker saw both calls end ("client went away") ...
  for (int i = 0; i < 100 && Errors("Download", "CANCELLED") < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(Errors("Download", "CANCELLED"), 2);
  // ... and serves the whole tensor afterwards.
  std::string all(static_cast<size_t>(spec.seq_len() * RowBytes(spec, v1::TENSOR_Q)), '\0');
  std::vector<v1::TensorChunk> got;
  const grpc::Status st = DownloadInto(DownloadReq("big", v1::TENSOR_Q, 0), spec, &all, &got);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(got.size(), size_t{4});  // 16 MiB in 4 MiB chunks
}

}  // namespace
}  // namespace dfa
