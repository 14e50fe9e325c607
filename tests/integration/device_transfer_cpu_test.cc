// Worker.DeviceTransfer (same-host CUDA IPC) error paths that need no GPU, on real daemons: a
// cpu worker refuses the transfer with FAILED_PRECONDITION naming the reason, and malformed
// requests get INVALID_ARGUMENT / OUT_OF_RANGE naming the field, before any handle is opened.
// Plus the client's request building (offsets of owned rows inside strided tensors).
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "client/cuda_tensor_io.h"
#include "tests/integration/cluster_fixture.h"
#include "core/gpu/cuda_ipc.h"

namespace dfa {
namespace {

using client::DeviceTensor;
using client::MakeDeviceTransferRequest;

class DeviceTransferCpuTest : public ::testing::Test {
 protected:
  // One cluster for the suite (starting one costs ~2 s); a fresh session per test.
  static void SetUpTestSuite() { cluster_ = testing::StartClusterOrSkip(2).release(); }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  void SetUp() override {
    if (cluster_ == nullptr) GTEST_SKIP() << "daemons not built";
    auto c = client::Client::Connect(cluster_->client_options());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
    spec_ = testing::MakeSpec(2, 256, 4, 2, 32, /*causal=*/true, v1::DTYPE_BF16);
    client::SessionOptions so;
    so.spec = spec_;
    auto s = client_->CreateSession(so);
    ASSERT_TRUE(s.ok()) << s.status();
    session_ = std::move(*s);
    auto host = HostBootId();
    ASSERT_TRUE(host.ok()) << host.status();
    host_ = *host;
  }

  // A well-formed request for the first owned range of rank 0 (fake handle: never opened,
  // since every check below fails before).
  v1::DeviceTransferRequest Request(v1::TensorKind kind, bool upload) {
    const bool lse = kind == v1::TENSOR_LSE;
    const bool kv = kind == v1::TENSOR_K || kind == v1::TENSOR_V;
    const int64_t heads = kv ? spec_.kv_heads() : spec_.q_heads();
    DeviceTensor t = DeviceTensor::Dense(
        nullptr, lse ? DType::kF32 : DType::kBF16,
        lse ? std::vector<int64_t>{spec_.batch(), heads, spec_.seq_len()}
            : std::vector<int64_t>{spec_.batch(), spec_.seq_len(), heads, spec_.head_dim()});
    auto req = MakeDeviceTransferRequest(spec_, kind, t, std::string(64, '\0'), 0, 0,
                                         session_->info().shards(0).owned(0), upload, host_);
    EXPECT_TRUE(req.ok()) << req.status();
    return req.ok() ? *req : v1::DeviceTransferRequest{};
  }

  absl::Status Send(const v1::DeviceTransferRequest& req) {
    return session_->DataClient(0).DeviceTransfer(req).status();
  }

  static client::LocalCluster* cluster_;
  std::unique_ptr<client::Client> client_;
  std::unique_ptr<client::Session> session_;
  v1::AttentionSpec spec_;
  std::string host_;
};

client::LocalCluster* DeviceTransferCpuTest::cluster_ = nullptr;

TEST_F(DeviceTransferCpuTest, CpuWorkerRefusesWithFailedPrecondition) {
  for (v1::TensorKind kind : {v1::TENSOR_Q, v1::TENSOR_K}) {
    const absl::Status st = Send(Request(kind, /*upload=*/true));
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
    EXPECT_NE(st.message().find("cpu backend"), std::string::npos) << st;
  }
  const absl::Status st = Send(Request(v1::TENSOR_LSE, /*upload=*/false));
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("cpu backend"), std::string::npos) << st;
}

TEST_F(DeviceTransferCpuTest, OtherHostRefusedNamingHostId) {
  v1::DeviceTransferRequest req = Request(v1::TENSOR_Q, true);
  req.set_host_id("another-boot-id");
  absl::Status st = Send(req);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("host_id = 'another-boot-id'"), std::string::npos) << st;
  req.clear_host_id();
  st = Send(req);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("host_id must be set"), std::string::npos) << st;
}

// Each malformed request names its field.
TEST_F(DeviceTransferCpuTest, BadTensorsNameTheField) {
  struct Case {
    const char* field;
    absl::StatusCode code;
    std::function<void(v1::DeviceTransferRequest*)> mutate;
  };
  const Case cases[] = {
      {"tensor.shape[2]", absl::StatusCode::kInvalidArgument,
       [](v1::DeviceTransferRequest* r) { r->mutable_tensor()->set_shape(2, 3); }},
      {"tensor.shape[1]", absl::StatusCode::kInvalidArgument,
       [](v1::DeviceTransferRequest* r) { r->mutable_tensor()->set_shape(1, 5); }},
      {"tensor.shape has 3", absl::StatusCode::kInvalidArgument,
       [](v1::DeviceTransferRequest* r) { r->mutable_tensor()->mutable_shape()->RemoveLast(); }},
      {"tensor.dtype = DTYPE_F16", absl::StatusCode::kInvalidArgument,
       [](v1::DeviceTransferRequest* r) { r->mutable_tensor()->set_dtype(v1::DTYPE_F16); }},
      {"tensor.strides[3]", absl::StatusCode::kInvalidArgument,
       [](v1::DeviceTransferRequest* r) { r->mutable_tensor()->set_strides(3, 2); }},
      {"tensor.strides[2]", absl::StatusCode::kInvalidArgument,
       [](v1::DeviceTransferRequest* r) { r->mutable_tensor()->set_strides(2, 16); }},
      {"tensor.strides[1]", absl::StatusCode::kInvalidArgument,  // rows overlap
       [](v1::DeviceTransferRequest* r) { r->mutable_tensor()->set_strides(1, 8); }},
      {"tensor.cuda_ipc_handle", absl::StatusCode::kInvalidArgument,
       [](v1::DeviceTransferRequest* r) { r->mutable_tensor()->set_cuda_ipc_handle("short"); }},
      {"tensor.offset", absl::StatusCode::kInvalidArgument,
       [](v1::DeviceTransferRequest* r) { r->mutable_tensor()->set_offset(-2); }},
      {"rows = ", absl::StatusCode::kOutOfRange,
       [](v1::DeviceTransferRequest* r) {
         r->mutable_rows()->set_end(r->rows().end() + 100000);
         r->mutable_tensor()->set_shape(1, r->rows().end() - r->rows().begin());
       }},
      {"kind = TENSOR_O", absl::StatusCode::kInvalidArgument,
       [](v1::DeviceTransferRequest* r) { r->set_kind(v1::TENSOR_O); }},
  };
  for (const Case& c : cases) {
    v1::DeviceTransferRequest req = Request(v1::TENSOR_Q, true);
    c.mutate(&req);
    const absl::Status st = Send(req);
    EXPECT_EQ(st.code(), c.code) << c.field << ": " << st;
    EXPECT_NE(st.message().find(c.field), std::string::npos) << c.field << ": " << st;
  }
  // Gradients may go to an fp32 tensor; LSE must be fp32 (then only the cpu check fails).
  v1::DeviceTransferRequest dq = Request(v1::TENSOR_DQ, false);
  dq.mutable_tensor()->set_dtype(v1::DTYPE_F32);
  EXPECT_EQ(Send(dq).code(), absl::StatusCode::kFailedPrecondition);
  v1::DeviceTransferRequest lse = Request(v1::TENSOR_LSE, false);
  lse.mutable_tensor()->set_dtype(v1::DTYPE_BF16);
  const absl::Status st = Send(lse);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("tensor.dtype"), std::string::npos) << st;
}

TEST_F(DeviceTransferCpuTest, UnknownSessionAndOtherClientRefused) {
  auto stub = v1::Worker::NewStub(client_->WorkerChannel(session_->info().shards(0).address()));
  v1::DeviceTransferRequest req = Request(v1::TENSOR_Q, true);
  req.set_session_id(session_->id());
  req.set_client_id("someone-else");
  v1::DeviceTransferResponse resp;
  {
    grpc::ClientContext ctx;
    EXPECT_EQ(stub->DeviceTransfer(&ctx, req, &resp).error_code(), grpc::PERMISSION_DENIED);
  }
  req.set_session_id("no-such-session");
  req.set_client_id(client_->client_id());
  grpc::ClientContext ctx;
  EXPECT_EQ(stub->DeviceTransfer(&ctx, req, &resp).error_code(), grpc::NOT_FOUND);
}

// Worker.BindDeviceTensors (standing transfers done inside each job): every refusal names the
// job, the entry (transfers[i]) and its field, before any handle is opened; a cpu worker
// refuses well-formed bindings; an empty binding (clear) is accepted and jobs run as before.
TEST_F(DeviceTransferCpuTest, BindRefusalsNameTheEntryAndField) {
  auto bind = [&](v1::JobKind job, std::vector<v1::DeviceTransferRequest> ts) {
    v1::BindDeviceTensorsRequest req;
    req.set_job(job);
    for (v1::DeviceTransferRequest& t : ts) *req.add_transfers() = std::move(t);
    return session_->DataClient(0).BindDeviceTensors(req).status();
  };
  const v1::DeviceTransferRequest q = Request(v1::TENSOR_Q, true);
  const v1::DeviceTransferRequest o = Request(v1::TENSOR_O, false);
  struct Case {
    const char* text;
    absl::StatusCode code;
    v1::JobKind job;
    std::function<std::vector<v1::DeviceTransferRequest>()> transfers;
  };
  const Case cases[] = {
      {"job = 0 is not JOB_FORWARD or JOB_BACKWARD", absl::StatusCode::kInvalidArgument,
       v1::JOB_KIND_UNSPECIFIED, [&] { return std::vector{q}; }},
      {"transfers has 17 entries; at most 16", absl::StatusCode::kInvalidArgument,
       v1::JOB_FORWARD, [&] { return std::vector(17, q); }},
      {"transfers[1]: kind = TENSOR_DO with upload = 1 is not an input of JOB_FORWARD",
       absl::StatusCode::kInvalidArgument, v1::JOB_FORWARD,
       [&] { return std::vector{q, Request(v1::TENSOR_DO, true)}; }},
      {"transfers[0]: kind = TENSOR_Q with upload = 1 is not an input of JOB_BACKWARD",
       absl::StatusCode::kInvalidArgument, v1::JOB_BACKWARD, [&] { return std::vector{q}; }},
      {"transfers[1]: kind = TENSOR_O with upload = 0 is not an output of JOB_BACKWARD",
       absl::StatusCode::kInvalidArgument, v1::JOB_BACKWARD,
       [&] { return std::vector{Request(v1::TENSOR_DO, true), o}; }},
      {"transfers[1]: tensor.dtype = DTYPE_F16", absl::StatusCode::kInvalidArgument,
       v1::JOB_FORWARD,
       [&] {
         v1::DeviceTransferRequest bad = Request(v1::TENSOR_K, true);
         bad.mutable_tensor()->set_dtype(v1::DTYPE_F16);
         return std::vector{q, bad};
       }},
      {"transfers[0]: tensor.cuda_ipc_handle has 5 bytes", absl::StatusCode::kInvalidArgument,
       v1::JOB_FORWARD,
       [&] {
         v1::DeviceTransferRequest bad = q;
         bad.mutable_tensor()->set_cuda_ipc_handle("short");
         return std::vector{bad};
       }},
      {"transfers[0]: tensor.strides[2]", absl::StatusCode::kInvalidArgument, v1::JOB_FORWARD,
       [&] {
         v1::DeviceTransferRequest bad = q;
         bad.mutable_tensor()->set_strides(2, 16);
         return std::vector{bad};
       }},
      {"transfers[0]: rows = ", absl::StatusCode::kOutOfRange, v1::JOB_FORWARD,
       [&] {
         v1::DeviceTransferRequest bad = q;
         bad.mutable_rows()->set_end(bad.rows().end() + 100000);
         bad.mutable_tensor()->set_shape(1, bad.rows().end() - bad.rows().begin());
         return std::vector{bad};
       }},
      {"transfers[0]: host_id = 'another-boot-id'", absl::StatusCode::kFailedPrecondition,
       v1::JOB_FORWARD,
       [&] {
         v1::DeviceTransferRequest bad = q;
         bad.set_host_id("another-boot-id");
         return std::vector{bad};
       }},
      // Well-formed: a cpu worker cannot take CUDA IPC.
      {"transfers[0]: this worker computes on the cpu backend",
       absl::StatusCode::kFailedPrecondition, v1::JOB_FORWARD, [&] { return std::vector{q, o}; }},
  };
  for (const Case& c : cases) {
    const absl::Status st = bind(c.job, c.transfers());
    EXPECT_EQ(st.code(), c.code) << c.text << ": " << st;
    EXPECT_NE(st.message().find(c.text), std::string::npos) << c.text << ": " << st;
  }
  // Clearing is accepted, and the session's jobs run as before on host uploads.
  EXPECT_TRUE(bind(v1::JOB_FORWARD, {}).ok());
  EXPECT_TRUE(bind(v1::JOB_BACKWARD, {}).ok());
  ASSERT_TRUE(session_->GenerateInputs(7, /*with_grad_output=*/false).ok());
  auto job = session_->Run(v1::JOB_FORWARD);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_SUCCEEDED);
  EXPECT_EQ(job->workers(0).device_transfer_bytes(), 0);
}

TEST_F(DeviceTransferCpuTest, BindUnknownSessionAndOtherClientRefused) {
  auto stub = v1::Worker::NewStub(client_->WorkerChannel(session_->info().shards(0).address()));
  v1::BindDeviceTensorsRequest req;
  req.set_job(v1::JOB_FORWARD);
  req.set_session_id(session_->id());
  req.set_client_id("someone-else");
  v1::BindDeviceTensorsResponse resp;
  {
    grpc::ClientContext ctx;
    EXPECT_EQ(stub->BindDeviceTensors(&ctx, req, &resp).error_code(), grpc::PERMISSION_DENIED);
  }
  req.set_session_id("no-such-session");
  req.set_client_id(client_->client_id());
  grpc::ClientContext ctx;
  EXPECT_EQ(stub->BindDeviceTensors(&ctx, req, &resp).error_code(), grpc::NOT_FOUND);
}

// The client's checks before anything is exported or sent: kinds that are not the job's inputs
// or outputs, null tensors, and a job kind that has no bindings.
TEST_F(DeviceTransferCpuTest, ClientBindingsCheckedBeforeSending) {
  client::DeviceBindings bindings;
  DeviceTensor t = DeviceTensor::Dense(nullptr, DType::kBF16,
                                       {spec_.batch(), spec_.seq_len(), spec_.q_heads(),
                                        spec_.head_dim()});
  auto st = bindings.Bind(*session_, v1::JOB_FORWARD, {{v1::TENSOR_Q, &t, true}});
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument) << st.status();
  EXPECT_NE(st.status().message().find("bindings[0] (TENSOR_Q): tensor.data is null"),
            std::string::npos)
      << st.status();
  int64_t word = 0;
  t.data = &word;
  st = bindings.Bind(*session_, v1::JOB_FORWARD, {{v1::TENSOR_DO, &t, true}});
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument) << st.status();
  EXPECT_NE(st.status().message().find("bindings[0] (TENSOR_DO) with upload = 1 is not an "
                                       "input of JOB_FORWARD"),
            std::string::npos)
      << st.status();
  st = bindings.Bind(*session_, v1::JOB_BACKWARD, {{v1::TENSOR_O, &t, false}});
  EXPECT_NE(st.status().message().find("is not an output of JOB_BACKWARD"), std::string::npos)
      << st.status();
  st = bindings.Bind(*session_, v1::JOB_KIND_UNSPECIFIED, {});
  EXPECT_NE(st.status().message().find("job = JOB_KIND_UNSPECIFIED"), std::string::npos)
      << st.status();
  // Host memory is not a CUDA allocation: refused by the export, nothing sent.
  st = bindings.Bind(*session_, v1::JOB_FORWARD, {{v1::TENSOR_Q, &t, true}});
  EXPECT_FALSE(st.ok());
}

// Pure: the request for owned rows [r0, r1) of a strided tensor points at row r0 and keeps the
// strides; a slice of a seq-major [S, B, H, D] buffer viewed as BSHD works the same way.
TEST(MakeDeviceTransferRequestTest, OffsetsAndStridesOfOwnedRows) {
  const v1::AttentionSpec spec = testing::MakeSpec(2, 100, 4, 2, 8, true, v1::DTYPE_BF16);
  DeviceTensor t;
  t.dtype = DType::kBF16;
  t.shape = {2, 100, 4, 8};
  t.strides = {32, 64, 8, 1};  // [S, B, H, D] in memory
  v1::RowRange r;
  r.set_begin(30);
  r.set_end(55);
  auto req = MakeDeviceTransferRequest(spec, v1::TENSOR_Q, t, std::string(64, 'h'), 1000, 1, r,
                                       true, "boot");
  ASSERT_TRUE(req.ok()) << req.status();
  EXPECT_EQ(req->tensor().offset(), 1000 + 30 * 64 * 2);
  EXPECT_EQ(std::vector<int64_t>(req->tensor().shape().begin(), req->tensor().shape().end()),
            (std::vector<int64_t>{2, 25, 4, 8}));
  EXPECT_EQ(std::vector<int64_t>(req->tensor().strides().begin(), req->tensor().strides().end()),
            t.strides);
  EXPECT_EQ(req->tensor().dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(req->host_id(), "boot");

  // LSE: rows are the last dimension; dense strides derived.
  DeviceTensor lse = DeviceTensor::Dense(nullptr, DType::kF32, {2, 4, 100});
  req = MakeDeviceTransferRequest(spec, v1::TENSOR_LSE, lse, std::string(64, 'h'), 0, 0, r, false,
                                  "boot");
  ASSERT_TRUE(req.ok()) << req.status();
  EXPECT_EQ(req->tensor().offset(), 30 * 4);
  EXPECT_EQ(req->tensor().shape(2), 25);
  EXPECT_EQ(req->tensor().strides(0), 400);
  EXPECT_EQ(req->tensor().strides(1), 100);

  t.shape[1] = 99;
  req = MakeDeviceTransferRequest(spec, v1::TENSOR_Q, t, std::string(64, 'h'), 0, 0, r, true, "b");
  EXPECT_EQ(req.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(req.status().message().find("tensor.shape[1] = 99"), std::string::npos);
}

}  // namespace
}  // namespace dfa
