// A head-split session (schedule "heads") on real Worker services over loopback gRPC: each rank
// holds all rows of its kv head range, so its chunks carry only those heads (an all-heads chunk
// is refused naming chunk.data), its seeded synthetic inputs are the global tensors' values at
// its GLOBAL heads (the same as a sequence-split session's), and its forward equals the fp64
// reference on the heads it holds.
#include <cmath>
#include <thread>

#include "core/planner/plan_proto.h"
#include "core/planner/planner.h"
#include "dfa/v1/worker.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "kernels/reference/reference_attention.h"
#include "core/wire/crc32c.h"
#include "worker/synthetic_inputs.h"
#include "tests/worker/worker_test_util.h"
#include "worker/worker_daemon.h"

namespace dfa {
namespace {

constexpr int kB = 2, kHq = 4, kHkv = 2, kD = 16;
constexpr int64_t kS = 48;
constexpr uint64_t kSeed = 5;

v1::AttentionSpec Spec() {
  v1::AttentionSpec s;
  s.set_batch(kB);
  s.set_q_heads(kHq);
  s.set_kv_heads(kHkv);
  s.set_head_dim(kD);
  s.set_seq_len(kS);
  s.set_causal(true);
  s.set_dtype(v1::DTYPE_F32);
  return s;
}

v1::Plan ProtoPlan(const std::string& schedule) {
  PlanRequest r;
  r.schedule = schedule;
  r.workers = 2;
  r.seq_len = kS;
  r.causal = true;
  r.shape = AttentionShape{kB, kHq, kHkv, kD, DType::kF32};
  auto plan = MakePlan(r);
  EXPECT_TRUE(plan.ok()) << plan.status();
  v1::Plan p;
  if (plan.ok()) PlanToProto(*plan, &p);
  return p;
}

class HeadSplitSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::StartTestWorkers(2, 64 << 20, &daemons_, &stubs_);
  }
  // Opens `id` with `plan` on both workers and fills its inputs from kSeed; transport addresses.
  std::vector<std::string> OpenAndGenerate(const std::string& id, const v1::Plan& plan) {
    std::vector<std::string> addrs;
    for (int w = 0; w < 2; ++w) {
      v1::OpenSessionRequest r;
      r.set_session_id(id);
      *r.mutable_spec() = Spec();
      r.set_rank(w);
      *r.mutable_plan() = plan;
      r.set_transport("ucx");
      r.set_client_id("c");
      v1::OpenSessionResponse resp;
      grpc::ClientContext ctx;
      const grpc::Status s = stubs_[w]->OpenSession(&ctx, r, &resp);
      EXPECT_TRUE(s.ok()) << s.error_message();
      addrs.push_back(resp.transport_address());
      v1::GenerateInputsRequest g;
      g.set_session_id(id);
      g.set_client_id("c");
      g.set_seed(kSeed);
      v1::GenerateInputsResponse gr;
      grpc::ClientContext gctx;
      EXPECT_TRUE(stubs_[w]->GenerateInputs(&gctx, g, &gr).ok());
    }
    return addrs;
  }
  // Gathers `kind` of both workers into a global BSHD tensor (all heads), each worker's chunks
  // at the global heads [head0, head0 + heads) its plan gives it.
  std::vector<float> Gather(const std::string& id, const v1::Plan& plan, v1::TensorKind kind,
                            int heads_total, bool kv) {
    std::vector<float> global(static_cast<size_t>(kB * kS * heads_total * kD), NAN);
    for (int w = 0; w < 2; ++w) {
      const v1::HeadRange& hr = plan.workers(w).kv_heads();
      const int group = kv ? 1 : kHq / kHkv;
      const int h0 = hr.end() > 0 ? hr.begin() * group : 0;
      const int nh = hr.end() > 0 ? (hr.end() - hr.begin()) * group : heads_total;
      v1::DownloadRequest r;
      r.set_session_id(id);
      r.set_client_id("c");
      r.set_kind(kind);
      r.set_chunk_bytes(700);
      grpc::ClientContext ctx;
      auto reader = stubs_[w]->Download(&ctx, r);
      v1::TensorChunk c;
      while (reader->Read(&c)) {
        const int64_t n = c.rows().end() - c.rows().begin();
        EXPECT_EQ(static_cast<int64_t>(c.data().size()), n * nh * kD * 4);
        const float* p = reinterpret_cast<const float*>(c.data().data());
        for (int64_t i = 0; i < n; ++i) {
          for (int h = 0; h < nh; ++h) {
            for (int d = 0; d < kD; ++d) {
              const int64_t row = c.rows().begin() + i;
              global[static_cast<size_t>(
                  ((c.batch_index() * kS + row) * heads_total + h0 + h) * kD + d)] =
                  p[(i * nh + h) * kD + d];
            }
          }
        }
      }
      const grpc::Status s = reader->Finish();
      EXPECT_TRUE(s.ok()) << s.error_message();
    }
    return global;
  }

  std::vector<std::unique_ptr<WorkerDaemon>> daemons_;
  std::vector<std::unique_ptr<v1::Worker::Stub>> stubs_;
};

TEST_F(HeadSplitSessionTest, ChunksCarryTheRanksHeadsOnly) {
  const v1::Plan plan = ProtoPlan("heads");
  ASSERT_EQ(plan.workers_size(), 2);
  ASSERT_EQ(plan.workers(1).kv_heads().begin(), 1);
  ASSERT_EQ(plan.workers(1).kv_heads().end(), 2);
  OpenAndGenerate("s", plan);
  auto upload = [&](int heads) {
    v1::UploadRequest m;
    m.set_session_id("s");
    m.set_client_id("c");
    v1::TensorChunk* c = m.mutable_chunk();
    c->set_kind(v1::TENSOR_Q);
    c->mutable_rows()->set_begin(40);  // a head-split rank holds every row
    c->mutable_rows()->set_end(42);
    c->set_data(std::string(static_cast<size_t>(2 * heads * kD * 4), '\x01'));
    c->set_crc32c(Crc32c(c->data().data(), c->data().size()));
    grpc::ClientContext ctx;
    v1::UploadResponse resp;
    auto writer = stubs_[1]->Upload(&ctx, &resp);
    writer->Write(m);
    writer->WritesDone();
    return writer->Finish();
  };
  const grpc::Status all_heads = upload(kHq);
  EXPECT_EQ(all_heads.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(all_heads.error_message().find("chunk.data"), std::string::npos)
      << all_heads.error_message();
  EXPECT_TRUE(upload(kHq / kHkv).ok());  // rank 1 holds q heads [2, 4)
}

TEST_F(HeadSplitSessionTest, PlanHeadsOutsideTheSpecAreRefusedNamingKvHeads) {
  v1::Plan plan = ProtoPlan("heads");
  plan.mutable_workers(1)->mutable_kv_heads()->set_end(kHkv + 1);  // [1, 3) of 2 kv heads
  v1::OpenSessionRequest r;
  r.set_session_id("bad");
  *r.mutable_spec() = Spec();
  r.set_rank(1);
  *r.mutable_plan() = plan;
  r.set_transport("ucx");
  r.set_client_id("c");
  v1::OpenSessionResponse resp;
  grpc::ClientContext ctx;
  const grpc::Status s = stubs_[1]->OpenSession(&ctx, r, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("kv_heads"), std::string::npos) << s.error_message();
}

TEST_F(HeadSplitSessionTest, SyntheticInputsAreTheGlobalTensorsAndForwardIsAttention) {
  const v1::Plan heads = ProtoPlan("heads"), rows = ProtoPlan("ring");
  const auto addrs = OpenAndGenerate("h", heads);
  OpenAndGenerate("r", rows);
  std::vector<float> want_q(static_cast<size_t>(kB * kS * kHq * kD)),
      want_k(static_cast<size_t>(kB * kS * kHkv * kD)), want_v(want_k.size());
  FillSynthetic(kSeed, v1::TENSOR_Q, kB, 0, kS, kHq, kD, DType::kF32, want_q.data());
  FillSynthetic(kSeed, v1::TENSOR_K, kB, 0, kS, kHkv, kD, DType::kF32, want_k.data());
  FillSynthetic(kSeed, v1::TENSOR_V, kB, 0, kS, kHkv, kD, DType::kF32, want_v.data());
  EXPECT_EQ(Gather("h", heads, v1::TENSOR_Q, kHq, false), want_q);
  EXPECT_EQ(Gather("h", heads, v1::TENSOR_K, kHkv, true), want_k);
  EXPECT_EQ(Gather("h", heads, v1::TENSOR_V, kHkv, true),
            Gather("r", rows, v1::TENSOR_V, kHkv, true));
  EXPECT_EQ(Gather("h", heads, v1::TENSOR_Q, kHq, false),
            Gather("r", rows, v1::TENSOR_Q, kHq, false));
  // FillSynthetic with a head offset = the global tensor's slice.
  std::vector<float> slice(static_cast<size_t>(kB * kS * 1 * kD));
  FillSynthetic(kSeed, v1::TENSOR_K, kB, 0, kS, /*head0=*/1, /*heads=*/1, kD, DType::kF32,
                slice.data());
  for (int64_t i = 0; i < kB * kS; ++i) {
    for (int d = 0; d < kD; ++d) {
      ASSERT_EQ(slice[static_cast<size_t>(i * kD + d)],
                want_k[static_cast<size_t>((i * 2 + 1) * kD + d)]);
    }
  }

  std::vector<grpc::Status> st(2);
  std::vector<std::thread> ts;
  for (int w = 0; w < 2; ++w) {
    ts.emplace_back([&, w] {
      v1::RunJobRequest r;
      r.set_session_id("h");
      r.set_job_id("f");
      r.set_kind(v1::JOB_FORWARD);
      for (const auto& a : addrs) r.add_peer_transport_addresses(a);
      grpc::ClientContext ctx;
      v1::WorkerJobStats stats;
      st[w] = stubs_[w]->RunJob(&ctx, r, &stats);
    });
  }
  for (auto& t : ts) t.join();
  for (const auto& s : st) ASSERT_TRUE(s.ok()) << s.error_message();
  reference::Problem p;
  p.q = {want_q.data(), DType::kF32, kB, kS, kHq, kD};
  p.k = {want_k.data(), DType::kF32, kB, kS, kHkv, kD};
  p.v = {want_v.data(), DType::kF32, kB, kS, kHkv, kD};
  p.scale = 1.0 / std::sqrt(static_cast<double>(kD));
  auto ref = reference::Forward(p);
  ASSERT_TRUE(ref.ok());
  const std::vector<float> o = Gather("h", heads, v1::TENSOR_O, kHq, false);
  for (size_t i = 0; i < o.size(); ++i) ASSERT_NEAR(o[i], ref->out[i], 2e-5) << i;
}

}  // namespace
}  // namespace dfa
