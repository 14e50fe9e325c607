// The NCCL client path's data plane on two GPUs (skips with fewer: NCCL refuses two ranks of
// one communicator on one GPU, and the client is a rank beside its workers): a real coordinator
// and one cuda worker on GPU 1 as processes, this test as the client on GPU 0.
//   - Q, K, V, dO go to the worker by NCCL (NcclTensorIo::Upload) and O, LSE, dQ, dK, dV come
//     back by NCCL into CUDA memory; each equals the same job on the same cluster with host
//     uploads/downloads (Session::Upload/Download): O and LSE within 1e-5, the gradients within
//     1e-2 of their largest magnitude (bf16).
//   - The group is made once and reused by a second session.
//   - Faults, each bounded: a client that never joins its group (the worker's transfer fails
//     naming the client rank), a client that aborts its communicator mid-transfer; the worker
//     keeps serving the other session's NCCL transfers afterwards.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "client/grpc_util.h"
#include "client/nccl_tensor_io.h"
#include "core/gpu/nccl_transport.h"
#include "core/session_capability.h"
#include "tests/gpu/service/gpu_test_util.h"
#include "tests/integration/cluster_fixture.h"

namespace dfa {
namespace {

using client::DeviceTensor;
using client::HostTensor;
using client::NcclTensorIo;

constexpr int kClientGpu = 0;
constexpr int kWorkerGpu = 1;

std::string SiblingBinDir() {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  const auto dir = self.parent_path();
  return std::filesystem::exists(dir / "dfa-worker") ? dir.string() : "";
}

void* ToDevice(const HostTensor& t) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, t.bytes.size()), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, t.bytes.data(), t.bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  return p;
}

std::vector<uint8_t> FromDevice(const void* p, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  EXPECT_EQ(cudaMemcpy(out.data(), p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

// The values of `t`'s bytes as floats (LSE: raw fp32; else converted from the dtype).
std::vector<float> F32Of(const HostTensor& t) {
  const HostTensor f = t.row_stats ? t : client::ToF32(t);
  std::vector<float> v(f.bytes.size() / 4);
  std::memcpy(v.data(), f.bytes.data(), f.bytes.size());
  return v;
}

// `bytes` from the device read into a tensor shaped like `like`, then compared with `like`:
// max |got - want| <= tol * max |want| (tol 0: equal), `want` not all zero.
void ExpectClose(const std::vector<uint8_t>& bytes, const HostTensor& like, double tol,
                 const std::string& what) {
  HostTensor got = like;
  ASSERT_EQ(bytes.size(), got.bytes.size()) << what;
  std::memcpy(got.bytes.data(), bytes.data(), bytes.size());
  const std::vector<float> g = F32Of(got), w = F32Of(like);
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (std::isinf(w[i]) && g[i] == w[i]) continue;  // rows that see no key
    max_ref = std::max(max_ref, std::fabs(double{w[i]}));
    max_diff = std::max(max_diff, std::fabs(double{g[i]} - w[i]));
  }
  EXPECT_GT(max_ref, 0) << what;
  EXPECT_LE(max_diff, tol * max_ref)
      << what << ": max |nccl - host| " << max_diff << " against max |host| " << max_ref;
}

std::vector<int64_t> ShapeOf(const v1::AttentionSpec& spec, v1::TensorKind kind) {
  const bool kv = kind == v1::TENSOR_K || kind == v1::TENSOR_V || kind == v1::TENSOR_DK ||
                  kind == v1::TENSOR_DV;
  const int64_t heads = kv ? spec.kv_heads() : spec.q_heads();
  if (kind == v1::TENSOR_LSE) return {spec.batch(), heads, spec.seq_len()};
  return {spec.batch(), spec.seq_len(), heads, spec.head_dim()};
}

class NcclClientGroupTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (VisibleGpus() < 2) return;
    client::LocalClusterOptions o;
    o.backend = "cuda";
    o.workers = 1;
    o.threads_per_worker = 0;
    o.bin_dir = SiblingBinDir();
    o.start_timeout = absl::Seconds(90);
    o.worker_args = {absl::StrCat("--device=", kWorkerGpu), "--device_memory_limit=0.25"};
    auto cluster = client::LocalCluster::Start(o);
    if (!cluster.ok()) {
      start_error_ = new absl::Status(cluster.status());
      return;
    }
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
    delete start_error_;
    start_error_ = nullptr;
  }

  void SetUp() override {
    SKIP_UNLESS_GPUS(2);
    ASSERT_NE(cluster_, nullptr) << (start_error_ ? *start_error_ : absl::UnknownError("?"));
    auto c = client::Client::Connect(cluster_->client_options());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
    ASSERT_EQ(cudaSetDevice(kClientGpu), cudaSuccess);
    spec_ = testing::MakeSpec(1, 2048, 8, 4, 128, /*causal=*/true, v1::DTYPE_BF16);
  }

  std::unique_ptr<client::Session> NewSession() {
    client::SessionOptions so;
    so.spec = spec_;
    auto s = client_->CreateSession(so);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  static client::LocalCluster* cluster_;
  static absl::Status* start_error_;
  std::unique_ptr<client::Client> client_;
  v1::AttentionSpec spec_;
};

client::LocalCluster* NcclClientGroupTest::cluster_ = nullptr;
absl::Status* NcclClientGroupTest::start_error_ = nullptr;

TEST_F(NcclClientGroupTest, ForwardBackwardOverNcclEqualsHostPath) {
  const testing::TrainingInputs in = testing::RandomInputs(spec_, 17);
  // The reference: host uploads and downloads.
  auto ref = NewSession();
  ASSERT_NE(ref, nullptr);
  ASSERT_TRUE(ref->Upload(v1::TENSOR_Q, in.q).ok());
  ASSERT_TRUE(ref->Upload(v1::TENSOR_K, in.k).ok());
  ASSERT_TRUE(ref->Upload(v1::TENSOR_V, in.v).ok());
  ASSERT_TRUE(ref->Run(v1::JOB_FORWARD).ok());
  std::map<v1::TensorKind, HostTensor> want;
  for (v1::TensorKind k : {v1::TENSOR_O, v1::TENSOR_LSE}) ASSERT_TRUE(ref->Download(k, &want[k]).ok());
  ASSERT_TRUE(ref->Upload(v1::TENSOR_DO, in.dout).ok());
  ASSERT_TRUE(ref->Run(v1::JOB_BACKWARD).ok());
  for (v1::TensorKind k : {v1::TENSOR_DQ, v1::TENSOR_DK, v1::TENSOR_DV}) {
    ASSERT_TRUE(ref->Download(k, &want[k]).ok());
  }

  NcclTensorIo io(client_.get());
  for (int round = 0; round < 2; ++round) {  // the second session reuses the group
    auto s = NewSession();
    ASSERT_NE(s, nullptr);
    void* q = ToDevice(in.q);
    void* k = ToDevice(in.k);
    void* v = ToDevice(in.v);
    void* dout = ToDevice(in.dout);
    const absl::Time start = absl::Now();
    auto up = io.Upload(*s, v1::TENSOR_Q, DeviceTensor::Dense(q, DType::kBF16, ShapeOf(spec_, v1::TENSOR_Q)));
    ASSERT_TRUE(up.ok()) << up.status();
    EXPECT_EQ(up->bytes, static_cast<int64_t>(in.q.bytes.size()));
    ASSERT_TRUE(io.Upload(*s, v1::TENSOR_K, DeviceTensor::Dense(k, DType::kBF16, ShapeOf(spec_, v1::TENSOR_K))).ok());
    ASSERT_TRUE(io.Upload(*s, v1::TENSOR_V, DeviceTensor::Dense(v, DType::kBF16, ShapeOf(spec_, v1::TENSOR_V))).ok());
    ASSERT_TRUE(s->Run(v1::JOB_FORWARD).ok());
    for (v1::TensorKind kind : {v1::TENSOR_O, v1::TENSOR_LSE}) {
      const HostTensor& w = want[kind];
      void* out = nullptr;
      ASSERT_EQ(cudaMalloc(&out, w.bytes.size()), cudaSuccess);
      auto d = io.Download(*s, kind,
                           DeviceTensor::Dense(out, kind == v1::TENSOR_LSE ? DType::kF32 : DType::kBF16,
                                               ShapeOf(spec_, kind)));
      ASSERT_TRUE(d.ok()) << v1::TensorKind_Name(kind) << ": " << d.status();
      // Forward: the same kernels on the same inputs; backward accumulations may differ in order.
      ExpectClose(FromDevice(out, w.bytes.size()), w,
                  kind == v1::TENSOR_O || kind == v1::TENSOR_LSE ? 1e-5 : 1e-2,
                  v1::TensorKind_Name(kind));
      cudaFree(out);
    }
    ASSERT_TRUE(io.Upload(*s, v1::TENSOR_DO, DeviceTensor::Dense(dout, DType::kBF16, ShapeOf(spec_, v1::TENSOR_DO))).ok());
    ASSERT_TRUE(s->Run(v1::JOB_BACKWARD).ok());
    for (v1::TensorKind kind : {v1::TENSOR_DQ, v1::TENSOR_DK, v1::TENSOR_DV}) {
      const HostTensor& w = want[kind];
      void* out = nullptr;
      ASSERT_EQ(cudaMalloc(&out, w.bytes.size()), cudaSuccess);
      auto d = io.Download(*s, kind, DeviceTensor::Dense(out, DType::kBF16, ShapeOf(spec_, kind)));
      ASSERT_TRUE(d.ok()) << v1::TensorKind_Name(kind) << ": " << d.status();
      // Forward: the same kernels on the same inputs; backward accumulations may differ in order.
      ExpectClose(FromDevice(out, w.bytes.size()), w,
                  kind == v1::TENSOR_O || kind == v1::TENSOR_LSE ? 1e-5 : 1e-2,
                  v1::TensorKind_Name(kind));
      cudaFree(out);
    }
    std::printf("round %d: one layer's tensors over NCCL in %.1f ms (GPU %d -> worker on GPU %d)\n",
                round, absl::ToDoubleMilliseconds(absl::Now() - start), kClientGpu, kWorkerGpu);
    for (void* p : {q, k, v, dout}) cudaFree(p);
    ASSERT_TRUE(s->Release().ok());
  }
  EXPECT_EQ(io.groups_joined(), 1);
}

// A group whose client never joins: the worker's transfer fails within about the group's init
// timeout, naming the client rank; a client that aborts mid-transfer fails within the
// transfer's timeout; afterwards the worker serves another group's transfers.
TEST_F(NcclClientGroupTest, PeersThatNeverJoinOrVanishFailBoundedAndTheWorkerKeepsServing) {
  auto s = NewSession();
  ASSERT_NE(s, nullptr);
  auto join = [&](int init_ms) -> v1::JoinClientGroupResponse {
    auto id = NewNcclUniqueId();
    EXPECT_TRUE(id.ok()) << id.status();
    v1::JoinClientGroupRequest r;
    r.set_session_id(s->id());
    r.set_client_id(client_->client_id());
    r.set_nccl_unique_id(id.ok() ? *id : std::string(128, 'x'));
    r.set_init_timeout_ms(init_ms);
    grpc::ClientContext ctx;
    client::SetDeadline(&ctx, absl::Seconds(30));
    AttachCapability(&ctx, s->capability());
    v1::JoinClientGroupResponse resp;
    EXPECT_TRUE(client_->coordinator()->JoinClientGroup(&ctx, r, &resp).ok());
    return resp;
  };
  v1::ClientGroupTransferRequest req;
  req.set_kind(v1::TENSOR_Q);
  *req.mutable_rows() = s->info().shards(0).owned(0);
  req.set_dtype(v1::DTYPE_BF16);
  const int64_t rows = req.rows().end() - req.rows().begin();
  req.set_byte_count(spec_.batch() * rows * spec_.q_heads() * spec_.head_dim() * 2);
  req.set_upload(true);
  req.set_timeout_ms(2000);

  // 1. Never joins.
  const v1::JoinClientGroupResponse lonely = join(1500);
  req.set_group_id(lonely.group_id());
  absl::Time start = absl::Now();
  absl::Status st = s->DataClient(0).ClientGroupTransfer(req, lonely.group_secret()).status();
  EXPECT_TRUE(st.code() == absl::StatusCode::kDeadlineExceeded ||
              st.code() == absl::StatusCode::kUnavailable)
      << st;
  EXPECT_NE(st.message().find("client rank 1"), std::string::npos) << st;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << st;
  // The failed group is gone.
  req.set_sequence(1);
  st = s->DataClient(0).ClientGroupTransfer(req, lonely.group_secret()).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;

  // 2. Joins, then vanishes (aborts its communicator) instead of sending.
  // This test is the client rank: its own unique id, its own NcclTransport.
  auto id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok());
  v1::JoinClientGroupRequest jr;
  jr.set_session_id(s->id());
  jr.set_client_id(client_->client_id());
  jr.set_nccl_unique_id(*id);
  jr.set_init_timeout_ms(20000);
  v1::JoinClientGroupResponse mine;
  {
    grpc::ClientContext ctx;
    client::SetDeadline(&ctx, absl::Seconds(30));
    AttachCapability(&ctx, s->capability());
    ASSERT_TRUE(client_->coordinator()->JoinClientGroup(&ctx, jr, &mine).ok());
  }
  NcclTransportOptions o;
  o.device = kClientGpu;
  o.rank = mine.client_rank();
  o.size = mine.size();
  o.unique_id = *id;
  o.init_timeout = absl::Seconds(20);
  auto t = NcclTransport::Create(o);
  ASSERT_TRUE(t.ok()) << t.status();
  req.set_group_id(mine.group_id());
  req.set_sequence(0);
  std::thread vanish([&] {
    absl::SleepFor(absl::Milliseconds(300));
    (*t)->Abort();  // the client is gone: it never posts its send
  });
  start = absl::Now();
  st = s->DataClient(0).ClientGroupTransfer(req, mine.group_secret()).status();
  vanish.join();
  EXPECT_TRUE(st.code() == absl::StatusCode::kDeadlineExceeded ||
              st.code() == absl::StatusCode::kUnavailable)
      << st;
  EXPECT_NE(st.message().find("client rank 1"), std::string::npos) << st;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << st;
  t->reset();

  // 3. The worker still serves: a fresh client's transfers on the same session.
  const testing::TrainingInputs in = testing::RandomInputs(spec_, 5);
  void* q = ToDevice(in.q);
  NcclTensorIo io(client_.get());
  auto up = io.Upload(*s, v1::TENSOR_Q, DeviceTensor::Dense(q, DType::kBF16, ShapeOf(spec_, v1::TENSOR_Q)));
  EXPECT_TRUE(up.ok()) << up.status();
  cudaFree(q);
}

}  // namespace
}  // namespace dfa
