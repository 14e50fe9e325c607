// The client's same-host GPU path through the whole service (GPU machine; skips without a GPU):
// a real coordinator and one cuda worker per GPU (up to 2) as processes, this test as the
// client. Q, K, V, dO go to the workers from CUDA memory by CUDA IPC, forward and backward run,
// and O, LSE, dQ, dK, dV come back by IPC into CUDA memory (dQ as fp32 into a seq-major
// [S, B, H, D] buffer: the strided cast path). Everything is checked against the same job done
// with host uploads/downloads on the same cluster.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <tuple>
#include <string>
#include <vector>

#include "client/cuda_tensor_io.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/gpu/service/gpu_test_util.h"

namespace dfa {
namespace {

using client::DeviceTensor;
using client::HostTensor;

// Programs packed for the GPU machine sit beside this test (.gpu-service/bin); in a build tree
// LocalCluster finds them relative to the test.
std::string SiblingBinDir() {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  const auto dir = self.parent_path();
  return std::filesystem::exists(dir / "dfa-worker") ? dir.string() : "";
}

// A device copy of `t`'s bytes (freed by the test).
void* ToDevice(const HostTensor& t) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, t.bytes.size()), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, t.bytes.data(), t.bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  return p;
}
void* DeviceZeros(size_t bytes) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
  EXPECT_EQ(cudaMemset(p, 0, bytes), cudaSuccess);
  return p;
}
std::vector<float> F32Of(const HostTensor& t) {
  if (t.row_stats) {
    std::vector<float> v(t.bytes.size() / 4);
    std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
    return v;
  }
  const HostTensor f = client::ToF32(t);
  std::vector<float> v(f.bytes.size() / 4);
  std::memcpy(v.data(), f.bytes.data(), f.bytes.size());
  return v;
}
// The device tensor's bytes in a host tensor shaped like `like`.
HostTensor FromDevice(const void* p, HostTensor like) {
  EXPECT_EQ(cudaMemcpy(like.bytes.data(), p, like.bytes.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return like;
}

// max |got - want| <= tol * max |want|, and `want` is not all zero.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double tol,
                 const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i]) && got[i] == want[i]) continue;  // rows that see no key
    max_ref = std::max(max_ref, std::fabs(double{want[i]}));
    max_diff = std::max(max_diff, std::fabs(double{got[i]} - want[i]));
  }
  EXPECT_GT(max_ref, 0) << what;
  EXPECT_LE(max_diff, tol * max_ref)
      << what << ": max |ipc - host| " << max_diff << " against max |host| " << max_ref;
}

// Parameters: causal, and the IPC session's schedule ("heads": each worker holds all rows of its
// heads, so the client's refs are head slices of its tensors; the host reference stays balanced).
class DeviceIpcServiceTest : public ::testing::TestWithParam<std::tuple<bool, std::string>> {
 protected:
  // One cluster per suite (cuda workers take seconds to start); sessions per test.
  static void SetUpTestSuite() {
    if (VisibleGpus() < 1) return;
    client::LocalClusterOptions o;
    o.backend = "cuda";
    o.workers = std::min(2, VisibleGpus());
    o.threads_per_worker = 0;
    o.bin_dir = SiblingBinDir();
    o.start_timeout = absl::Seconds(60);
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
    SKIP_UNLESS_GPUS(1);
    ASSERT_NE(cluster_, nullptr) << (start_error_ ? *start_error_ : absl::UnknownError("?"));
    auto c = client::Client::Connect(cluster_->client_options());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  }
  void TearDown() override {
    for (void* p : device_) cudaFree(p);
  }
  std::unique_ptr<client::Session> NewSession(const v1::AttentionSpec& spec,
                                              const std::string& schedule = "") {
    client::SessionOptions so;
    so.spec = spec;
    so.schedule = schedule;
    auto s = client_->CreateSession(so);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }
  void* Track(void* p) {
    device_.push_back(p);
    return p;
  }

  static client::LocalCluster* cluster_;
  static absl::Status* start_error_;
  std::unique_ptr<client::Client> client_;
  std::vector<void*> device_;
};

client::LocalCluster* DeviceIpcServiceTest::cluster_ = nullptr;
absl::Status* DeviceIpcServiceTest::start_error_ = nullptr;

TEST_P(DeviceIpcServiceTest, ForwardBackwardByIpcMatchesHostUploads) {
  const bool causal = std::get<0>(GetParam());
  const std::string schedule = std::get<1>(GetParam());
  const v1::AttentionSpec spec = testing::MakeSpec(2, 2048, 4, 2, 64, causal, v1::DTYPE_BF16);
  const testing::TrainingInputs in = testing::RandomInputs(spec, 11);
  const int64_t B = spec.batch(), S = spec.seq_len(), H = spec.q_heads(), D = spec.head_dim();

  // The reference: host tensors through Session::Upload/Download.
  auto host = NewSession(spec);
  ASSERT_NE(host, nullptr);
  for (auto [kind, t] :
       {std::pair{v1::TENSOR_Q, &in.q}, {v1::TENSOR_K, &in.k}, {v1::TENSOR_V, &in.v}}) {
    ASSERT_TRUE(host->Upload(kind, *t).ok());
  }
  ASSERT_TRUE(host->Run(v1::JOB_FORWARD).ok());
  std::map<v1::TensorKind, HostTensor> want;
  // O before the backward: the backward's gradients take its memory (docs/memory.md).
  for (v1::TensorKind k : {v1::TENSOR_O, v1::TENSOR_LSE}) {
    auto st = host->Download(k, &want[k]);
    ASSERT_TRUE(st.ok()) << client::TensorKindName(k) << ": " << st.status();
  }
  ASSERT_TRUE(host->Upload(v1::TENSOR_DO, in.dout).ok());
  ASSERT_TRUE(host->Run(v1::JOB_BACKWARD).ok());
  for (v1::TensorKind k : {v1::TENSOR_DQ, v1::TENSOR_DK, v1::TENSOR_DV}) {
    auto st = host->Download(k, &want[k]);
    ASSERT_TRUE(st.ok()) << client::TensorKindName(k) << ": " << st.status();
  }

  // The same job by CUDA IPC from this process's GPU 0.
  auto ipc = NewSession(spec, schedule);
  ASSERT_NE(ipc, nullptr);
  if (schedule == "heads" && ipc->num_workers() > 1) {  // the refs really are head slices
    for (const v1::ShardPlacement& p : ipc->info().shards()) {
      EXPECT_LT(p.kv_heads().end() - p.kv_heads().begin(), spec.kv_heads()) << p.DebugString();
    }
  }
  const std::vector<int64_t> q_shape{B, S, H, D}, kv_shape{B, S, spec.kv_heads(), D};
  const DeviceTensor q = DeviceTensor::Dense(Track(ToDevice(in.q)), DType::kBF16, q_shape);
  const DeviceTensor k = DeviceTensor::Dense(Track(ToDevice(in.k)), DType::kBF16, kv_shape);
  const DeviceTensor v = DeviceTensor::Dense(Track(ToDevice(in.v)), DType::kBF16, kv_shape);
  const DeviceTensor dout = DeviceTensor::Dense(Track(ToDevice(in.dout)), DType::kBF16, q_shape);
  for (auto [kind, t] : {std::pair{v1::TENSOR_Q, &q}, {v1::TENSOR_K, &k}, {v1::TENSOR_V, &v}}) {
    auto st = client::UploadDevice(*ipc, kind, *t);
    ASSERT_TRUE(st.ok()) << client::TensorKindName(kind) << ": " << st.status();
    EXPECT_EQ(st->bytes, int64_t{t->shape[0]} * S * t->shape[2] * D * 2);
  }
  ASSERT_TRUE(ipc->Run(v1::JOB_FORWARD).ok());
  const DeviceTensor o = DeviceTensor::Dense(Track(DeviceZeros(want[v1::TENSOR_O].bytes.size())),
                                             DType::kBF16, q_shape);
  const DeviceTensor lse = DeviceTensor::Dense(
      Track(DeviceZeros(want[v1::TENSOR_LSE].bytes.size())), DType::kF32, {B, H, S});
  ASSERT_TRUE(client::DownloadDevice(*ipc, v1::TENSOR_O, o).ok());
  ASSERT_TRUE(client::DownloadDevice(*ipc, v1::TENSOR_LSE, lse).ok());
  ASSERT_TRUE(client::UploadDevice(*ipc, v1::TENSOR_DO, dout).ok());
  ASSERT_TRUE(ipc->Run(v1::JOB_BACKWARD).ok());
  // dQ in fp32, seq-major [S, B, H, D] memory seen as BSHD through strides.
  DeviceTensor dq;
  dq.data = Track(DeviceZeros(static_cast<size_t>(S * B * H * D * 4)));
  dq.dtype = DType::kF32;
  dq.shape = q_shape;
  dq.strides = {H * D, B * H * D, D, 1};
  const DeviceTensor dk = DeviceTensor::Dense(Track(DeviceZeros(want[v1::TENSOR_DK].bytes.size())),
                                              DType::kBF16, kv_shape);
  const DeviceTensor dv = DeviceTensor::Dense(Track(DeviceZeros(want[v1::TENSOR_DV].bytes.size())),
                                              DType::kBF16, kv_shape);
  for (auto [kind, t] : {std::pair<v1::TensorKind, const DeviceTensor*>{v1::TENSOR_DQ, &dq},
                         {v1::TENSOR_DK, &dk},
                         {v1::TENSOR_DV, &dv}}) {
    auto st = client::DownloadDevice(*ipc, kind, *t);
    ASSERT_TRUE(st.ok()) << client::TensorKindName(kind) << ": " << st.status();
  }

  // bf16 results: the same kernels on the same inputs, so equal up to accumulation order.
  ExpectClose(F32Of(FromDevice(o.data, want[v1::TENSOR_O])), F32Of(want[v1::TENSOR_O]), 1e-2, "O");
  ExpectClose(F32Of(FromDevice(lse.data, want[v1::TENSOR_LSE])), F32Of(want[v1::TENSOR_LSE]), 1e-5,
              "LSE");
  ExpectClose(F32Of(FromDevice(dk.data, want[v1::TENSOR_DK])), F32Of(want[v1::TENSOR_DK]), 1e-2,
              "dK");
  ExpectClose(F32Of(FromDevice(dv.data, want[v1::TENSOR_DV])), F32Of(want[v1::TENSOR_DV]), 1e-2,
              "dV");
  // dQ delivered in fp32 (widened from the session's bf16) against the host path's bf16 dQ.
  std::vector<float> sbhd(static_cast<size_t>(S * B * H * D));
  ASSERT_EQ(cudaMemcpy(sbhd.data(), dq.data, sbhd.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<float> bshd(sbhd.size());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t s = 0; s < S; ++s) {
      std::copy_n(&sbhd[static_cast<size_t>((s * B + b) * H * D)], H * D,
                  &bshd[static_cast<size_t>((b * S + s) * H * D)]);
    }
  }
  ExpectClose(bshd, F32Of(want[v1::TENSOR_DQ]), 1e-2, "dQ (fp32, seq-major)");
}

INSTANTIATE_TEST_SUITE_P(MasksSchedules, DeviceIpcServiceTest,
                         ::testing::Combine(::testing::Values(true, false),
                                            ::testing::Values(std::string("balanced"),
                                                              std::string("heads"))),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "causal_" : "full_") +
                                  std::get<1>(info.param);
                         });

// Errors a GPU client meets: host memory is not exportable (client side), and an allocation
// smaller than the tensor it claims to hold is refused by the worker naming the range.
TEST_F(DeviceIpcServiceTest, HostPointerAndShortAllocationRefused) {
  // 4 MiB per tensor, so every worker's rows end past a 256 KiB allocation even if the driver
  // rounds allocations up to 2 MiB.
  const v1::AttentionSpec spec = testing::MakeSpec(1, 16384, 2, 2, 64, true, v1::DTYPE_BF16);
  auto s = NewSession(spec);
  ASSERT_NE(s, nullptr);
  const std::vector<int64_t> shape{1, 16384, 2, 64};
  const size_t bytes = 16384 * 2 * 64 * 2;
  std::vector<uint8_t> host_bytes(bytes);
  auto st = client::UploadDevice(*s, v1::TENSOR_Q,
                                 DeviceTensor::Dense(host_bytes.data(), DType::kBF16, shape));
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument) << st.status();

  const DeviceTensor tiny = DeviceTensor::Dense(Track(DeviceZeros(256 << 10)), DType::kBF16, shape);
  st = client::UploadDevice(*s, v1::TENSOR_Q, tiny);
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument) << st.status();
  EXPECT_NE(st.status().message().find("past the end of the allocation"), std::string::npos)
      << st.status();
  // Downloading O before any forward ran: FAILED_PRECONDITION, also by IPC.
  const DeviceTensor o = DeviceTensor::Dense(Track(DeviceZeros(bytes)), DType::kBF16, shape);
  st = client::DownloadDevice(*s, v1::TENSOR_O, o);
  EXPECT_EQ(st.status().code(), absl::StatusCode::kFailedPrecondition) << st.status();
}

}  // namespace
}  // namespace dfa
