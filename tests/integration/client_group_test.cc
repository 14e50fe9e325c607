// The NCCL path of a client on another host, its control plane on real daemons (a coordinator
// and two cpu workers as processes on loopback), no GPU: Coordinator.JoinClientGroup and
// Worker.JoinClientGroup / ClientGroupTransfer refuse bad requests naming the field, refuse
// calls without the session's capability or for another client's session, refuse cpu workers
// naming the reason, answer NOT_FOUND for a group the worker never joined — each within a
// bounded time, and nothing reaches NCCL. The client's request building
// (PlanClientGroupTransfers) makes requests the worker's checks accept (they then stop at the
// unknown group), and ChooseDevicePath picks IPC only when every worker is on this host.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "client/grpc_util.h"
#include "client/nccl_tensor_io.h"
#include "core/random_id.h"
#include "core/session_capability.h"
#include "dfa/v1/worker.grpc.pb.h"
#include "tests/integration/cluster_fixture.h"

namespace dfa {
namespace {

using client::DeviceTensor;
using client::PlanClientGroupTransfers;
using client::PlannedClientTransfer;

constexpr absl::Duration kBound = absl::Seconds(5);  // every refusal comes back within this

class ClientGroupTest : public ::testing::Test {
 protected:
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
  }

  v1::JoinClientGroupRequest JoinRequest() const {
    v1::JoinClientGroupRequest r;
    r.set_session_id(session_->id());
    r.set_client_id(client_->client_id());
    r.set_nccl_unique_id(std::string(128, '\x01'));
    r.set_init_timeout_ms(1000);
    return r;
  }

  // Coordinator.JoinClientGroup with `capability` (default: the session's).
  absl::Status CoordinatorJoin(const v1::JoinClientGroupRequest& r,
                               const std::string* capability = nullptr) {
    grpc::ClientContext ctx;
    client::SetDeadline(&ctx, absl::Seconds(30));
    AttachCapability(&ctx, capability ? *capability : session_->capability());
    v1::JoinClientGroupResponse resp;
    const absl::Time start = absl::Now();
    absl::Status st = client::FromGrpc(client_->coordinator()->JoinClientGroup(&ctx, r, &resp),
                                       "JoinClientGroup");
    EXPECT_LT(absl::Now() - start, kBound) << st;
    return st;
  }

  v1::WorkerJoinClientGroupRequest WorkerJoinRequest() const {
    v1::WorkerJoinClientGroupRequest r;
    r.set_group_id("g-test");
    r.set_session_id(session_->id());
    r.set_client_id(client_->client_id());
    r.set_rank(0);
    r.set_size(3);
    r.set_nccl_unique_id(std::string(128, '\x01'));
    r.set_init_timeout_ms(1000);
    r.set_group_secret(NewCapability());
    r.set_expires_unix_ms(absl::ToUnixMillis(absl::Now() + absl::Minutes(5)));
    return r;
  }

  // Worker.JoinClientGroup on rank 0's worker, as the coordinator sends it.
  absl::Status WorkerJoin(const v1::WorkerJoinClientGroupRequest& r, bool with_capability = true) {
    auto stub = v1::Worker::NewStub(client::MakeChannel(session_->info().shards(0).address()));
    grpc::ClientContext ctx;
    client::SetDeadline(&ctx, absl::Seconds(30));
    if (with_capability) AttachCapability(&ctx, session_->capability());
    v1::WorkerJoinClientGroupResponse resp;
    const absl::Time start = absl::Now();
    absl::Status st =
        client::FromGrpc(stub->JoinClientGroup(&ctx, r, &resp), "Worker.JoinClientGroup");
    EXPECT_LT(absl::Now() - start, kBound) << st;
    return st;
  }

  DeviceTensor Tensor(v1::TensorKind kind) const {
    const bool lse = kind == v1::TENSOR_LSE;
    const bool kv = kind == v1::TENSOR_K || kind == v1::TENSOR_V || kind == v1::TENSOR_DK ||
                    kind == v1::TENSOR_DV;
    const int64_t heads = kv ? spec_.kv_heads() : spec_.q_heads();
    // Never dereferenced: the plan only computes offsets.
    return DeviceTensor::Dense(
        reinterpret_cast<void*>(uintptr_t{1} << 40), lse ? DType::kF32 : DType::kBF16,
        lse ? std::vector<int64_t>{spec_.batch(), heads, spec_.seq_len()}
            : std::vector<int64_t>{spec_.batch(), spec_.seq_len(), heads, spec_.head_dim()});
  }

  // A group naming the session's workers (ranks = session ranks), as the coordinator makes it.
  v1::JoinClientGroupResponse Group() const {
    v1::JoinClientGroupResponse g;
    g.set_group_id("g-unknown");
    g.set_group_secret("secret");
    g.set_client_rank(session_->num_workers());
    g.set_size(session_->num_workers() + 1);
    for (int i = 0; i < session_->num_workers(); ++i) {
      v1::ClientGroupMember* m = g.add_workers();
      m->set_rank(i);
      m->set_worker_id(session_->info().shards(i).worker_id());
    }
    return g;
  }

  // The first planned request for shard 0.
  v1::ClientGroupTransferRequest Request(v1::TensorKind kind, bool upload) {
    std::map<std::string, int64_t> seq;
    auto plan = PlanClientGroupTransfers(spec_, session_->info(), Group(), kind, Tensor(kind),
                                         upload, 1000, &seq);
    EXPECT_TRUE(plan.ok()) << plan.status();
    for (const PlannedClientTransfer& p : plan.ok() ? *plan : std::vector<PlannedClientTransfer>{}) {
      if (p.shard == 0) return p.request;
    }
    ADD_FAILURE() << "no request for shard 0";
    return {};
  }

  absl::Status Transfer(const v1::ClientGroupTransferRequest& r,
                        const std::string& secret = "secret") {
    const absl::Time start = absl::Now();
    absl::Status st = session_->DataClient(0).ClientGroupTransfer(r, secret).status();
    EXPECT_LT(absl::Now() - start, kBound) << st;
    return st;
  }

  static client::LocalCluster* cluster_;
  std::unique_ptr<client::Client> client_;
  std::unique_ptr<client::Session> session_;
  v1::AttentionSpec spec_;
};

client::LocalCluster* ClientGroupTest::cluster_ = nullptr;

TEST_F(ClientGroupTest, CoordinatorRefusesCpuSessionsNamingTheTransport) {
  const absl::Status st = CoordinatorJoin(JoinRequest());
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("session_id = " + session_->id()), std::string::npos) << st;
  EXPECT_NE(st.message().find("not NCCL"), std::string::npos) << st;
}

TEST_F(ClientGroupTest, CoordinatorRefusesBadRequestsNamingTheField) {
  struct Case {
    const char* field;
    std::function<void(v1::JoinClientGroupRequest*)> mutate;
  };
  const Case cases[] = {
      {"nccl_unique_id has 5 bytes",
       [](v1::JoinClientGroupRequest* r) { r->set_nccl_unique_id("short"); }},
      {"nccl_unique_id has 0 bytes",
       [](v1::JoinClientGroupRequest* r) { r->clear_nccl_unique_id(); }},
      {"init_timeout_ms = 50", [](v1::JoinClientGroupRequest* r) { r->set_init_timeout_ms(50); }},
      {"init_timeout_ms = 700000",
       [](v1::JoinClientGroupRequest* r) { r->set_init_timeout_ms(700000); }},
      {"client_device = -1", [](v1::JoinClientGroupRequest* r) { r->set_client_device(-1); }},
      {"session_id must be set", [](v1::JoinClientGroupRequest* r) { r->clear_session_id(); }},
  };
  for (const Case& c : cases) {
    v1::JoinClientGroupRequest r = JoinRequest();
    c.mutate(&r);
    const absl::Status st = CoordinatorJoin(r);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.field << ": " << st;
    EXPECT_NE(st.message().find(c.field), std::string::npos) << c.field << ": " << st;
  }
}

TEST_F(ClientGroupTest, CoordinatorRefusesOtherClientsAndMissingCapabilities) {
  const std::string none;
  absl::Status st = CoordinatorJoin(JoinRequest(), &none);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  const std::string forged = NewCapability();
  st = CoordinatorJoin(JoinRequest(), &forged);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  v1::JoinClientGroupRequest other = JoinRequest();
  other.set_client_id("someone-else");
  st = CoordinatorJoin(other);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  v1::JoinClientGroupRequest unknown = JoinRequest();
  unknown.set_session_id("s-does-not-exist");
  st = CoordinatorJoin(unknown);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
}

TEST_F(ClientGroupTest, WorkerJoinRefusesCpuBackendAndBadFields) {
  absl::Status st = WorkerJoin(WorkerJoinRequest());
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("cpu backend"), std::string::npos) << st;
  st = WorkerJoin(WorkerJoinRequest(), /*with_capability=*/false);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;

  struct Case {
    const char* field;
    absl::StatusCode code;
    std::function<void(v1::WorkerJoinClientGroupRequest*)> mutate;
  };
  const Case cases[] = {
      {"group_id has 0", absl::StatusCode::kInvalidArgument,
       [](v1::WorkerJoinClientGroupRequest* r) { r->clear_group_id(); }},
      {"size = 1", absl::StatusCode::kInvalidArgument,
       [](v1::WorkerJoinClientGroupRequest* r) { r->set_size(1); }},
      {"rank = 2 is not a worker rank", absl::StatusCode::kInvalidArgument,
       [](v1::WorkerJoinClientGroupRequest* r) { r->set_rank(2); }},  // the client's rank
      {"rank = 1 differs from this worker's rank 0", absl::StatusCode::kInvalidArgument,
       [](v1::WorkerJoinClientGroupRequest* r) { r->set_rank(1); }},
      {"nccl_unique_id has 3 bytes", absl::StatusCode::kInvalidArgument,
       [](v1::WorkerJoinClientGroupRequest* r) { r->set_nccl_unique_id("abc"); }},
      {"init_timeout_ms = 10", absl::StatusCode::kInvalidArgument,
       [](v1::WorkerJoinClientGroupRequest* r) { r->set_init_timeout_ms(10); }},
      {"group_secret has 0", absl::StatusCode::kInvalidArgument,
       [](v1::WorkerJoinClientGroupRequest* r) { r->clear_group_secret(); }},
      {"expires_unix_ms", absl::StatusCode::kInvalidArgument,
       [](v1::WorkerJoinClientGroupRequest* r) { r->set_expires_unix_ms(1000); }},
      {"client_id = 'intruder' does not own session", absl::StatusCode::kPermissionDenied,
       [](v1::WorkerJoinClientGroupRequest* r) { r->set_client_id("intruder"); }},
  };
  for (const Case& c : cases) {
    v1::WorkerJoinClientGroupRequest r = WorkerJoinRequest();
    c.mutate(&r);
    st = WorkerJoin(r);
    EXPECT_EQ(st.code(), c.code) << c.field << ": " << st;
    EXPECT_NE(st.message().find(c.field), std::string::npos) << c.field << ": " << st;
  }
}

// The client's planned requests pass every check of the worker that needs only the session;
// the worker then answers NOT_FOUND for the group it never joined.
TEST_F(ClientGroupTest, PlannedRequestsPassTheWorkersChecksUpToTheGroup) {
  for (v1::TensorKind kind : {v1::TENSOR_Q, v1::TENSOR_K, v1::TENSOR_V, v1::TENSOR_DO}) {
    const absl::Status st = Transfer(Request(kind, /*upload=*/true));
    EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << v1::TensorKind_Name(kind) << ": " << st;
    EXPECT_NE(st.message().find("group_id = 'g-unknown'"), std::string::npos) << st;
  }
  for (v1::TensorKind kind : {v1::TENSOR_O, v1::TENSOR_LSE, v1::TENSOR_DQ, v1::TENSOR_DV}) {
    const absl::Status st = Transfer(Request(kind, /*upload=*/false));
    EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << v1::TensorKind_Name(kind) << ": " << st;
  }
}

TEST_F(ClientGroupTest, TransferRefusesBadFieldsNamingTheField) {
  struct Case {
    const char* field;
    absl::StatusCode code;
    std::function<void(v1::ClientGroupTransferRequest*)> mutate;
  };
  const Case cases[] = {
      {"kind = 0", absl::StatusCode::kInvalidArgument,
       [](v1::ClientGroupTransferRequest* r) { r->set_kind(v1::TENSOR_KIND_UNSPECIFIED); }},
      {"kind = TENSOR_O", absl::StatusCode::kInvalidArgument,
       [](v1::ClientGroupTransferRequest* r) { r->set_kind(v1::TENSOR_O); }},
      {"rows = [", absl::StatusCode::kInvalidArgument,
       [](v1::ClientGroupTransferRequest* r) { r->mutable_rows()->set_end(r->rows().begin()); }},
      {"rows", absl::StatusCode::kOutOfRange,
       [](v1::ClientGroupTransferRequest* r) { r->mutable_rows()->set_end(100000); }},
      {"dtype = DTYPE_F16", absl::StatusCode::kInvalidArgument,
       [](v1::ClientGroupTransferRequest* r) { r->set_dtype(v1::DTYPE_F16); }},
      {"byte_count = 12", absl::StatusCode::kInvalidArgument,
       [](v1::ClientGroupTransferRequest* r) { r->set_byte_count(12); }},
      {"timeout_ms = -1", absl::StatusCode::kInvalidArgument,
       [](v1::ClientGroupTransferRequest* r) { r->set_timeout_ms(-1); }},
      {"timeout_ms = 600001", absl::StatusCode::kInvalidArgument,
       [](v1::ClientGroupTransferRequest* r) { r->set_timeout_ms(600001); }},
      {"sequence = -3", absl::StatusCode::kInvalidArgument,
       [](v1::ClientGroupTransferRequest* r) { r->set_sequence(-3); }},
  };
  for (const Case& c : cases) {
    v1::ClientGroupTransferRequest r = Request(v1::TENSOR_Q, true);
    c.mutate(&r);
    const absl::Status st = Transfer(r);
    EXPECT_EQ(st.code(), c.code) << c.field << ": " << st;
    EXPECT_NE(st.message().find(c.field), std::string::npos) << c.field << ": " << st;
  }
  // LSE travels as fp32 whatever the spec's dtype.
  v1::ClientGroupTransferRequest lse = Request(v1::TENSOR_LSE, false);
  lse.set_dtype(v1::DTYPE_BF16);
  const absl::Status st = Transfer(lse);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("(LSE is fp32)"), std::string::npos) << st;
}

TEST_F(ClientGroupTest, TransferNeedsTheSessionCapability) {
  auto stub = v1::Worker::NewStub(client::MakeChannel(session_->info().shards(0).address()));
  v1::ClientGroupTransferRequest r = Request(v1::TENSOR_Q, true);
  r.set_session_id(session_->id());
  r.set_client_id(client_->client_id());
  for (const std::string& cap : {std::string(), NewCapability()}) {
    grpc::ClientContext ctx;
    client::SetDeadline(&ctx, absl::Seconds(30));
    AttachCapability(&ctx, cap);
    v1::ClientGroupTransferResponse resp;
    const absl::Status st =
        client::FromGrpc(stub->ClientGroupTransfer(&ctx, r, &resp), "ClientGroupTransfer");
    EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  }
}

TEST_F(ClientGroupTest, PlanningChecksTheTensorAndTheGroup) {
  std::map<std::string, int64_t> seq;
  // Offsets and sizes: one piece per batch index (BSHD), per batch index and head (LSE).
  auto q = PlanClientGroupTransfers(spec_, session_->info(), Group(), v1::TENSOR_Q,
                                    Tensor(v1::TENSOR_Q), true, 0, &seq);
  ASSERT_TRUE(q.ok()) << q.status();
  const int64_t row = spec_.q_heads() * spec_.head_dim() * 2;
  int64_t total = 0;
  for (const PlannedClientTransfer& p : *q) {
    const v1::RowRange& r = p.request.rows();
    ASSERT_EQ(p.pieces.size(), static_cast<size_t>(spec_.batch()));
    for (int b = 0; b < spec_.batch(); ++b) {
      EXPECT_EQ(p.pieces[b].offset, (b * spec_.seq_len() + r.begin()) * row);
      EXPECT_EQ(p.pieces[b].bytes, (r.end() - r.begin()) * row);
    }
    EXPECT_EQ(p.request.byte_count(), spec_.batch() * (r.end() - r.begin()) * row);
    EXPECT_EQ(p.group_rank, p.shard);
    total += p.request.byte_count();
  }
  EXPECT_EQ(total, spec_.batch() * spec_.seq_len() * row);  // every row once
  // Sequence numbers continue per worker across calls.
  auto k = PlanClientGroupTransfers(spec_, session_->info(), Group(), v1::TENSOR_K,
                                    Tensor(v1::TENSOR_K), true, 0, &seq);
  ASSERT_TRUE(k.ok()) << k.status();
  std::map<int, int64_t> first_q, first_k;
  for (const PlannedClientTransfer& p : *q) first_q.emplace(p.shard, p.request.sequence());
  for (const PlannedClientTransfer& p : *k) first_k.emplace(p.shard, p.request.sequence());
  for (const auto& [shard, s] : first_q) {
    EXPECT_EQ(s, 0);
    int ranges = 0;
    for (const PlannedClientTransfer& p : *q) ranges += p.shard == shard ? 1 : 0;
    EXPECT_EQ(first_k[shard], ranges);
  }
  auto lse = PlanClientGroupTransfers(spec_, session_->info(), Group(), v1::TENSOR_LSE,
                                      Tensor(v1::TENSOR_LSE), false, 0, &seq);
  ASSERT_TRUE(lse.ok()) << lse.status();
  for (const PlannedClientTransfer& p : *lse) {
    const v1::RowRange& r = p.request.rows();
    ASSERT_EQ(p.pieces.size(), static_cast<size_t>(spec_.batch() * spec_.q_heads()));
    EXPECT_EQ(p.pieces[1].offset, (spec_.seq_len() + r.begin()) * 4);  // batch 0, head 1
    EXPECT_EQ(p.request.dtype(), v1::DTYPE_F32);
  }

  struct Case {
    const char* field;
    absl::StatusCode code;
    std::function<void(DeviceTensor*, v1::JoinClientGroupResponse*)> mutate;
  };
  const Case cases[] = {
      {"tensor.shape", absl::StatusCode::kInvalidArgument,
       [](DeviceTensor* t, v1::JoinClientGroupResponse*) { t->shape[1] = 100; }},
      {"tensor.dtype = f16", absl::StatusCode::kInvalidArgument,
       [](DeviceTensor* t, v1::JoinClientGroupResponse*) { t->dtype = DType::kF16; }},
      {"tensor.strides", absl::StatusCode::kInvalidArgument,
       [](DeviceTensor* t, v1::JoinClientGroupResponse*) {
         t->strides = {256 * 4 * 64, 4 * 64, 64, 1};  // rows strided: a slice
       }},
      {"tensor.data is null", absl::StatusCode::kInvalidArgument,
       [](DeviceTensor* t, v1::JoinClientGroupResponse*) { t->data = nullptr; }},
      {"is not in client group", absl::StatusCode::kFailedPrecondition,
       [](DeviceTensor*, v1::JoinClientGroupResponse* g) { g->mutable_workers()->RemoveLast(); }},
  };
  for (const Case& c : cases) {
    DeviceTensor t = Tensor(v1::TENSOR_Q);
    v1::JoinClientGroupResponse g = Group();
    c.mutate(&t, &g);
    std::map<std::string, int64_t> s;
    auto plan = PlanClientGroupTransfers(spec_, session_->info(), g, v1::TENSOR_Q, t, true, 0, &s);
    EXPECT_EQ(plan.status().code(), c.code) << c.field << ": " << plan.status();
    EXPECT_NE(plan.status().message().find(c.field), std::string::npos)
        << c.field << ": " << plan.status();
    EXPECT_TRUE(s.empty()) << c.field << ": a refused plan numbers nothing";
  }
  auto bad_kind = PlanClientGroupTransfers(spec_, session_->info(), Group(), v1::TENSOR_O,
                                           Tensor(v1::TENSOR_O), true, 0, &seq);
  EXPECT_EQ(bad_kind.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ClientGroupTest, DevicePathIsIpcOnlyWhenEveryWorkerIsOnThisHost) {
  v1::CreateSessionResponse info = session_->info();
  for (v1::ShardPlacement& s : *info.mutable_shards()) s.set_host("this-host");
  EXPECT_EQ(client::ChooseDevicePath(info, "this-host"), client::DevicePath::kCudaIpc);
  info.mutable_shards(1)->set_host("other-host");
  EXPECT_EQ(client::ChooseDevicePath(info, "this-host"), client::DevicePath::kNccl);
  info.mutable_shards(1)->clear_host();
  EXPECT_EQ(client::ChooseDevicePath(info, "this-host"), client::DevicePath::kNccl);
}

}  // namespace
}  // namespace dfa
