// The Worker service over real loopback gRPC: in-process WorkerDaemons on port 0, UCX between
// them. Every bad input answers with the right code and a message naming the field; a 2-worker
// forward + backward (backward with only dO) equals the fp64 reference.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
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

using grpc::StatusCode;

v1::AttentionSpec Spec(int64_t seq_len, bool causal = true) {
  v1::AttentionSpec s;
  s.set_batch(2);
  s.set_q_heads(4);
  s.set_kv_heads(2);
  s.set_head_dim(16);
  s.set_seq_len(seq_len);
  s.set_causal(causal);
  s.set_dtype(v1::DTYPE_F32);
  return s;
}

v1::Plan ProtoPlan(int workers, int64_t seq_len, bool causal, const std::string& schedule) {
  PlanRequest r;
  r.schedule = schedule;
  r.workers = workers;
  r.seq_len = seq_len;
  r.causal = causal;
  auto plan = MakePlan(r);
  EXPECT_TRUE(plan.ok()) << plan.status();
  v1::Plan p;
  PlanToProto(*plan, &p);
  return p;
}

class WorkerServiceTest : public ::testing::Test {
 protected:
  void Start(int n, int64_t limit = 64 << 20) {
    testing::StartTestWorkers(n, limit, &daemons_, &stubs_);
  }
  v1::OpenSessionRequest OpenReq(const std::string& id, const v1::AttentionSpec& spec,
                                 const v1::Plan& plan, int rank) {
    v1::OpenSessionRequest r;
    r.set_session_id(id);
    *r.mutable_spec() = spec;
    r.set_rank(rank);
    *r.mutable_plan() = plan;
    r.set_transport("ucx");
    r.set_client_id("client-a");
    return r;
  }
  grpc::Status Open(int w, const v1::OpenSessionRequest& r, v1::OpenSessionResponse* resp) {
    grpc::ClientContext ctx;
    return stubs_[w]->OpenSession(&ctx, r, resp);
  }
  // Opens `id` on workers 0..P-1 (rank = index); returns the transport addresses.
  std::vector<std::string> OpenAll(const std::string& id, const v1::AttentionSpec& spec,
                                   const v1::Plan& plan) {
    std::vector<std::string> addrs;
    for (int w = 0; w < plan.workers_size(); ++w) {
      v1::OpenSessionResponse resp;
      grpc::Status s = Open(w, OpenReq(id, spec, plan, w), &resp);
      EXPECT_TRUE(s.ok()) << s.error_message();
      addrs.push_back(resp.transport_address());
    }
    return addrs;
  }
  grpc::Status Upload(int w, const std::string& id, const std::string& client,
                      const std::vector<v1::TensorChunk>& chunks) {
    grpc::ClientContext ctx;
    v1::UploadResponse resp;
    auto writer = stubs_[w]->Upload(&ctx, &resp);
    for (size_t i = 0; i < chunks.size(); ++i) {
      v1::UploadRequest m;
      if (i == 0) {
        m.set_session_id(id);
        m.set_client_id(client);
      }
      *m.mutable_chunk() = chunks[i];
      if (!writer->Write(m)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }
  // Runs `kind` on workers 0..P-1 concurrently.
  std::vector<grpc::Status> RunAll(const std::string& id, const std::string& job,
                                   v1::JobKind kind, const std::vector<std::string>& addrs,
                                   std::vector<v1::WorkerJobStats>* stats) {
    const int n = static_cast<int>(addrs.size());
    std::vector<grpc::Status> st(n);
    stats->assign(n, {});
    std::vector<std::thread> ts;
    for (int w = 0; w < n; ++w) {
      ts.emplace_back([&, w] {
        v1::RunJobRequest r;
        r.set_session_id(id);
        r.set_job_id(job);
        r.set_kind(kind);
        for (const auto& a : addrs) r.add_peer_transport_addresses(a);
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
        st[w] = stubs_[w]->RunJob(&ctx, r, &(*stats)[w]);
      });
    }
    for (auto& t : ts) t.join();
    return st;
  }
  // Downloads all rows of `kind` that worker w owns in `owned` into the dense global tensor.
  void DownloadInto(int w, const std::string& id, v1::TensorKind kind, int heads, int64_t seq_len,
                    int batch, std::vector<float>* global, bool row_stats) {
    v1::DownloadRequest r;
    r.set_session_id(id);
    r.set_client_id("client-a");
    r.set_kind(kind);
    r.set_chunk_bytes(1000);  // several chunks per range
    grpc::ClientContext ctx;
    auto reader = stubs_[w]->Download(&ctx, r);
    v1::TensorChunk c;
    const int d = row_stats ? 1 : 16;
    while (reader->Read(&c)) {
      ASSERT_EQ(Crc32c(c.data().data(), c.data().size()), c.crc32c());
      const float* p = reinterpret_cast<const float*>(c.data().data());
      const int64_t n = c.rows().end() - c.rows().begin();
      for (int64_t i = 0; i < n; ++i) {
        for (int h = 0; h < heads; ++h) {
          for (int k = 0; k < d; ++k) {
            const int64_t row = c.rows().begin() + i;
            const int64_t dst = row_stats ? (int64_t{c.batch_index()} * heads + h) * seq_len + row
                                          : ((int64_t{c.batch_index()} * seq_len + row) * heads + h) * d + k;
            (*global)[dst] = row_stats ? p[h * n + i] : p[(i * heads + h) * d + k];
          }
        }
      }
    }
    grpc::Status s = reader->Finish();
    ASSERT_TRUE(s.ok()) << s.error_message();
    (void)batch;
  }

  std::vector<std::unique_ptr<WorkerDaemon>> daemons_;
  std::vector<std::unique_ptr<v1::Worker::Stub>> stubs_;
};

v1::TensorChunk Chunk(v1::TensorKind kind, int64_t r0, int64_t r1, int batch, int heads) {
  v1::TensorChunk c;
  c.set_kind(kind);
  c.mutable_rows()->set_begin(r0);
  c.mutable_rows()->set_end(r1);
  c.set_batch_index(batch);
  std::string data(static_cast<size_t>(std::max<int64_t>(0, r1 - r0) * heads * 16 * 4), '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  c.set_crc32c(Crc32c(data.data(), data.size()));
  c.set_data(std::move(data));
  return c;
}

TEST_F(WorkerServiceTest, OpenSessionRejectsBadSpecsNamingTheField) {
  Start(1);
  const v1::Plan plan = ProtoPlan(1, 64, true, "ring");
  v1::OpenSessionResponse resp;
  auto req = OpenReq("s", Spec(64), plan, 0);
  req.mutable_spec()->set_batch(0);
  EXPECT_RPC_ERROR(Open(0, req, &resp), StatusCode::INVALID_ARGUMENT, "spec.batch");
  req = OpenReq("s", Spec(64), plan, 0);
  req.mutable_spec()->set_head_dim(-3);
  EXPECT_RPC_ERROR(Open(0, req, &resp), StatusCode::INVALID_ARGUMENT, "spec.head_dim");
  req = OpenReq("s", Spec(64), plan, 0);
  req.mutable_spec()->set_kv_heads(3);
  EXPECT_RPC_ERROR(Open(0, req, &resp), StatusCode::INVALID_ARGUMENT, "spec.q_heads");
  req = OpenReq("s", Spec(64), plan, 0);
  req.mutable_spec()->set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_RPC_ERROR(Open(0, req, &resp), StatusCode::INVALID_ARGUMENT, "spec.dtype");
  req = OpenReq("s", Spec(64), plan, 0);
  req.mutable_spec()->set_seq_len(-64);
  EXPECT_RPC_ERROR(Open(0, req, &resp), StatusCode::INVALID_ARGUMENT, "spec.seq_len");
  req = OpenReq("s", Spec(64), plan, 3);
  EXPECT_RPC_ERROR(Open(0, req, &resp), StatusCode::INVALID_ARGUMENT, "rank");
  req = OpenReq("", Spec(64), plan, 0);
  EXPECT_RPC_ERROR(Open(0, req, &resp), StatusCode::INVALID_ARGUMENT, "session_id");
  req = OpenReq("s", Spec(128), plan, 0);
  EXPECT_RPC_ERROR(Open(0, req, &resp), StatusCode::INVALID_ARGUMENT, "plan.seq_len");
  req = OpenReq("s", Spec(64), plan, 0);
  req.set_transport("carrier-pigeon");
  EXPECT_RPC_ERROR(Open(0, req, &resp), StatusCode::INVALID_ARGUMENT, "transport");
  // A valid one opens once.
  ASSERT_TRUE(Open(0, OpenReq("s", Spec(64), plan, 0), &resp).ok());
  EXPECT_GT(resp.bytes_reserved(), 0);
  EXPECT_FALSE(resp.transport_address().empty());
  EXPECT_RPC_ERROR(Open(0, OpenReq("s", Spec(64), plan, 0), &resp), StatusCode::ALREADY_EXISTS,
                   "session_id");
}

TEST_F(WorkerServiceTest, MemoryLimitIsEnforcedAndClosingFreesIt) {
  Start(1, /*limit=*/5 << 20);  // one session of S=1024 (~3.2 MB) fits, two do not
  const int64_t s = 4096;  // ~13 MB
  const v1::Plan plan = ProtoPlan(1, s, true, "ring");
  v1::OpenSessionResponse resp;
  EXPECT_RPC_ERROR(Open(0, OpenReq("big", Spec(s), plan, 0), &resp),
                   StatusCode::RESOURCE_EXHAUSTED, "bytes");
  // Two small sessions fit one at a time only when the first is closed.
  const v1::Plan small = ProtoPlan(1, 1024, true, "ring");
  ASSERT_TRUE(Open(0, OpenReq("a", Spec(1024), small, 0), &resp).ok());
  const int64_t one = resp.bytes_reserved();
  ASSERT_GT(one * 2, 5 << 20) << "test needs sessions over half the limit";
  EXPECT_RPC_ERROR(Open(0, OpenReq("b", Spec(1024), small, 0), &resp),
                   StatusCode::RESOURCE_EXHAUSTED, "memory_limit_bytes");
  grpc::ClientContext ctx;
  v1::CloseSessionRequest close;
  close.set_session_id("a");
  v1::CloseSessionResponse cr;
  ASSERT_TRUE(stubs_[0]->CloseSession(&ctx, close, &cr).ok());
  EXPECT_TRUE(Open(0, OpenReq("b", Spec(1024), small, 0), &resp).ok());
}

TEST_F(WorkerServiceTest, UploadRejectsBadChunksNamingTheField) {
  Start(2);
  const v1::Plan plan = ProtoPlan(2, 64, true, "ring");  // worker 0 owns [0, 32)
  OpenAll("s", Spec(64), plan);
  EXPECT_TRUE(Upload(0, "s", "client-a", {Chunk(v1::TENSOR_Q, 0, 8, 0, 4)}).ok());
  auto bad_crc = Chunk(v1::TENSOR_Q, 0, 8, 0, 4);
  bad_crc.set_crc32c(bad_crc.crc32c() ^ 1);
  EXPECT_RPC_ERROR(Upload(0, "s", "client-a", {bad_crc}), StatusCode::DATA_LOSS, "chunk.crc32c");
  EXPECT_RPC_ERROR(Upload(0, "s", "client-a", {Chunk(v1::TENSOR_Q, 30, 40, 0, 4)}),
                   StatusCode::OUT_OF_RANGE, "chunk.rows");
  EXPECT_RPC_ERROR(Upload(0, "s", "client-a", {Chunk(v1::TENSOR_Q, 8, 4, 0, 4)}),
                   StatusCode::INVALID_ARGUMENT, "chunk.rows");
  EXPECT_RPC_ERROR(Upload(0, "s", "client-a", {Chunk(v1::TENSOR_Q, 0, 8, 2, 4)}),
                   StatusCode::OUT_OF_RANGE, "chunk.batch_index");
  EXPECT_RPC_ERROR(Upload(0, "s", "client-a", {Chunk(v1::TENSOR_K, 0, 8, 0, 4)}),
                   StatusCode::INVALID_ARGUMENT, "chunk.data");  // K has 2 heads, not 4
  EXPECT_RPC_ERROR(Upload(0, "s", "client-a", {Chunk(v1::TENSOR_O, 0, 8, 0, 4)}),
                   StatusCode::INVALID_ARGUMENT, "chunk.kind");
  EXPECT_RPC_ERROR(Upload(0, "nope", "client-a", {Chunk(v1::TENSOR_Q, 0, 8, 0, 4)}),
                   StatusCode::NOT_FOUND, "session_id");
  EXPECT_RPC_ERROR(Upload(0, "s", "client-b", {Chunk(v1::TENSOR_Q, 0, 8, 0, 4)}),
                   StatusCode::PERMISSION_DENIED, "session_id");
  EXPECT_RPC_ERROR(Upload(1, "s", "client-a", {Chunk(v1::TENSOR_Q, 0, 8, 0, 4)}),
                   StatusCode::OUT_OF_RANGE, "chunk.rows");  // worker 1 owns [32, 64)
}

TEST_F(WorkerServiceTest, JobsAndDownloadsCheckTheirPreconditions) {
  Start(1);
  const v1::Plan plan = ProtoPlan(1, 64, true, "ring");
  const auto addrs = OpenAll("s", Spec(64), plan);
  std::vector<v1::WorkerJobStats> stats;
  EXPECT_RPC_ERROR(RunAll("s", "j0", v1::JOB_BACKWARD, addrs, &stats)[0],
                   StatusCode::FAILED_PRECONDITION, "before a forward");
  EXPECT_RPC_ERROR(RunAll("s", "j1", v1::JOB_FORWARD, addrs, &stats)[0],
                   StatusCode::FAILED_PRECONDITION, "TENSOR_Q");
  EXPECT_RPC_ERROR(RunAll("nope", "j2", v1::JOB_FORWARD, addrs, &stats)[0], StatusCode::NOT_FOUND,
                   "session_id");
  v1::DownloadRequest d;
  d.set_session_id("s");
  d.set_client_id("client-a");
  d.set_kind(v1::TENSOR_O);
  grpc::ClientContext ctx;
  auto reader = stubs_[0]->Download(&ctx, d);
  v1::TensorChunk c;
  while (reader->Read(&c)) {
  }
  EXPECT_RPC_ERROR(reader->Finish(), StatusCode::FAILED_PRECONDITION, "TENSOR_O");
  // Cancelling before the job arrives makes it end CANCELLED at once.
  grpc::ClientContext cctx;
  v1::CancelWorkerJobRequest cancel;
  cancel.set_job_id("j3");
  v1::CancelWorkerJobResponse cresp;
  ASSERT_TRUE(stubs_[0]->CancelJob(&cctx, cancel, &cresp).ok());
  EXPECT_EQ(RunAll("s", "j3", v1::JOB_FORWARD, addrs, &stats)[0].error_code(),
            StatusCode::CANCELLED);
}

// Two workers, UCX between them: forward, then backward after uploading only dO, against the
// fp64 reference on the same global tensors.
TEST_F(WorkerServiceTest, TwoWorkerForwardAndBackwardMatchReference) {
  Start(2);
  const int64_t S = 96;
  const v1::AttentionSpec spec = Spec(S);
  const v1::Plan plan = ProtoPlan(2, S, true, "balanced");
  const auto addrs = OpenAll("s", spec, plan);
  const uint64_t seed = 42;
  for (int w = 0; w < 2; ++w) {
    grpc::ClientContext ctx;
    v1::GenerateInputsRequest g;
    g.set_session_id("s");
    g.set_client_id("client-a");
    g.set_seed(seed);
    v1::GenerateInputsResponse gr;
    ASSERT_TRUE(stubs_[w]->GenerateInputs(&ctx, g, &gr).ok());
  }
  std::vector<v1::WorkerJobStats> stats;
  for (const auto& s : RunAll("s", "fwd", v1::JOB_FORWARD, addrs, &stats)) {
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_GT(stats[0].kernel_launches() + stats[1].kernel_launches(), 0);
  EXPECT_GT(stats[0].bytes_sent() + stats[1].bytes_sent(), 0);

  // Global inputs, regenerated here from the same counter-based function.
  const int B = 2, Hq = 4, Hkv = 2, D = 16;
  auto global = [&](int kind, int heads) {
    std::vector<float> t(static_cast<size_t>(B * S * heads * D));
    FillSynthetic(seed, kind, B, 0, S, heads, D, DType::kF32, t.data());
    return t;
  };
  std::vector<float> q = global(v1::TENSOR_Q, Hq), k = global(v1::TENSOR_K, Hkv),
                     v = global(v1::TENSOR_V, Hkv), dout = global(v1::TENSOR_DO, Hq);
  reference::Problem p;
  p.q = {q.data(), DType::kF32, B, S, Hq, D};
  p.k = {k.data(), DType::kF32, B, S, Hkv, D};
  p.v = {v.data(), DType::kF32, B, S, Hkv, D};
  p.scale = 1.0 / std::sqrt(16.0);
  auto ref = reference::Forward(p);
  ASSERT_TRUE(ref.ok());
  std::vector<float> o(q.size(), NAN), lse(static_cast<size_t>(B * Hq * S), NAN);
  for (int w = 0; w < 2; ++w) {
    DownloadInto(w, "s", v1::TENSOR_O, Hq, S, B, &o, false);
    DownloadInto(w, "s", v1::TENSOR_LSE, Hq, S, B, &lse, true);
  }
  for (size_t i = 0; i < o.size(); ++i) ASSERT_NEAR(o[i], ref->out[i], 2e-5) << i;
  for (size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lse[i], ref->lse[i], 2e-5) << i;

  // Backward: only dO goes up (chunks of 8 rows), nothing else is re-sent.
  for (int w = 0; w < 2; ++w) {
    std::vector<v1::TensorChunk> chunks;
    for (const auto& r : plan.workers(w).owned()) {
      for (int b = 0; b < B; ++b) {
        for (int64_t r0 = r.begin(); r0 < r.end(); r0 += 8) {
          const int64_t r1 = std::min(r.end(), r0 + 8);
          v1::TensorChunk c;
          c.set_kind(v1::TENSOR_DO);
          c.mutable_rows()->set_begin(r0);
          c.mutable_rows()->set_end(r1);
          c.set_batch_index(b);
          const float* src = dout.data() + (int64_t{b} * S + r0) * Hq * D;
          c.set_data(std::string(reinterpret_cast<const char*>(src), (r1 - r0) * Hq * D * 4));
          c.set_crc32c(Crc32c(c.data().data(), c.data().size()));
          chunks.push_back(c);
        }
      }
    }
    ASSERT_TRUE(Upload(w, "s", "client-a", chunks).ok());
  }
  for (const auto& s : RunAll("s", "bwd", v1::JOB_BACKWARD, addrs, &stats)) {
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  auto grads = reference::Backward(p, {dout.data(), DType::kF32, B, S, Hq, D});
  ASSERT_TRUE(grads.ok());
  std::vector<float> dq(q.size(), NAN), dk(k.size(), NAN), dv(v.size(), NAN);
  for (int w = 0; w < 2; ++w) {
    DownloadInto(w, "s", v1::TENSOR_DQ, Hq, S, B, &dq, false);
    DownloadInto(w, "s", v1::TENSOR_DK, Hkv, S, B, &dk, false);
    DownloadInto(w, "s", v1::TENSOR_DV, Hkv, S, B, &dv, false);
  }
  for (size_t i = 0; i < dq.size(); ++i) ASSERT_NEAR(dq[i], grads->dq[i], 1e-4) << i;
  for (size_t i = 0; i < dk.size(); ++i) ASSERT_NEAR(dk[i], grads->dk[i], 1e-4) << i;
  for (size_t i = 0; i < dv.size(); ++i) ASSERT_NEAR(dv[i], grads->dv[i], 1e-4) << i;

  // The gradients took the memory of Q, K, V and O (docs/memory.md): O, Q and a forward are
  // refused until Q, K, V are there again; then the next step runs as the first did.
  for (v1::TensorKind kind : {v1::TENSOR_O, v1::TENSOR_Q}) {
    v1::DownloadRequest d;
    d.set_session_id("s");
    d.set_client_id("client-a");
    d.set_kind(kind);
    grpc::ClientContext ctx;
    auto reader = stubs_[0]->Download(&ctx, d);
    v1::TensorChunk c;
    while (reader->Read(&c)) {
    }
    EXPECT_RPC_ERROR(reader->Finish(), StatusCode::FAILED_PRECONDITION, "consumed by the backward");
  }
  EXPECT_RPC_ERROR(RunAll("s", "bwd2", v1::JOB_BACKWARD, addrs, &stats)[0],
                   StatusCode::FAILED_PRECONDITION, "consumed the forward's state");
  EXPECT_RPC_ERROR(RunAll("s", "fwd2", v1::JOB_FORWARD, addrs, &stats)[0],
                   StatusCode::FAILED_PRECONDITION, "inputs were overwritten by gradients; upload q/k/v again");
  for (int w = 0; w < 2; ++w) {
    grpc::ClientContext ctx;
    v1::GenerateInputsRequest g;
    g.set_session_id("s");
    g.set_client_id("client-a");
    g.set_seed(seed);
    v1::GenerateInputsResponse gr;
    ASSERT_TRUE(stubs_[w]->GenerateInputs(&ctx, g, &gr).ok());
  }
  for (const auto& s : RunAll("s", "fwd3", v1::JOB_FORWARD, addrs, &stats)) {
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  std::vector<float> o2(q.size(), NAN);
  for (int w = 0; w < 2; ++w) DownloadInto(w, "s", v1::TENSOR_O, Hq, S, B, &o2, false);
  EXPECT_EQ(o2, o);
}

// Two sessions (two clients) on the same two workers run their jobs at the same time: each has
// its own backend and UCX transport, and both results are right.
TEST_F(WorkerServiceTest, TwoSessionsRunConcurrentlyOnTheSameWorkers) {
  Start(2);
  const int64_t S = 64;
  const v1::Plan plan = ProtoPlan(2, S, false, "ring");
  const v1::AttentionSpec spec = Spec(S, /*causal=*/false);
  std::vector<std::string> addrs[2] = {OpenAll("x", spec, plan), OpenAll("y", spec, plan)};
  for (const char* id : {"x", "y"}) {
    for (int w = 0; w < 2; ++w) {
      grpc::ClientContext ctx;
      v1::GenerateInputsRequest g;
      g.set_session_id(id);
      g.set_client_id("client-a");
      g.set_seed(id[0]);
      v1::GenerateInputsResponse gr;
      ASSERT_TRUE(stubs_[w]->GenerateInputs(&ctx, g, &gr).ok());
    }
  }
  std::vector<grpc::Status> st[2];
  std::vector<v1::WorkerJobStats> stats[2];
  std::thread tx([&] { st[0] = RunAll("x", "jx", v1::JOB_FORWARD, addrs[0], &stats[0]); });
  std::thread ty([&] { st[1] = RunAll("y", "jy", v1::JOB_FORWARD, addrs[1], &stats[1]); });
  tx.join();
  ty.join();
  for (int k = 0; k < 2; ++k) {
    for (const auto& s : st[k]) ASSERT_TRUE(s.ok()) << s.error_message();
    const uint64_t seed = k == 0 ? 'x' : 'y';
    std::vector<float> q(2 * S * 4 * 16), kk(2 * S * 2 * 16), v(kk.size());
    FillSynthetic(seed, v1::TENSOR_Q, 2, 0, S, 4, 16, DType::kF32, q.data());
    FillSynthetic(seed, v1::TENSOR_K, 2, 0, S, 2, 16, DType::kF32, kk.data());
    FillSynthetic(seed, v1::TENSOR_V, 2, 0, S, 2, 16, DType::kF32, v.data());
    reference::Problem p;
    p.q = {q.data(), DType::kF32, 2, S, 4, 16};
    p.k = {kk.data(), DType::kF32, 2, S, 2, 16};
    p.v = {v.data(), DType::kF32, 2, S, 2, 16};
    p.mask = MaskKind::kFull;
    p.scale = 0.25;
    auto ref = reference::Forward(p);
    ASSERT_TRUE(ref.ok());
    std::vector<float> o(q.size(), NAN);
    for (int w = 0; w < 2; ++w) DownloadInto(w, k == 0 ? "x" : "y", v1::TENSOR_O, 4, S, 2, &o, false);
    for (size_t i = 0; i < o.size(); ++i) ASSERT_NEAR(o[i], ref->out[i], 2e-5) << i;
  }
}

TEST_F(WorkerServiceTest, SharedMemoryRoundTripAndBadNames) {
  Start(1);
  const v1::Plan plan = ProtoPlan(1, 64, true, "ring");
  OpenAll("s", Spec(64), plan);
  const size_t bytes = 2 * 10 * 4 * 16 * 4;  // batch 2, rows [5, 15), 4 heads, D 16, f32
  // The worker makes the segment; the client maps it through the path it is given.
  v1::CreateSharedMemoryRequest create;
  create.set_session_id("s");
  create.set_client_id("client-a");
  create.set_bytes(bytes);
  v1::CreateSharedMemoryResponse segment;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stubs_[0]->CreateSharedMemory(&ctx, create, &segment).ok());
  }
  const std::string name = segment.shm_name();
  int fd = open(segment.path().c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << segment.path();
  auto* p = static_cast<float*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  for (size_t i = 0; i < bytes / 4; ++i) p[i] = static_cast<float>(i) * 0.5f;
  auto transfer = [&](bool upload, const std::string& shm, int64_t r0, int64_t r1) {
    v1::SharedMemoryTransferRequest r;
    r.set_session_id("s");
    r.set_client_id("client-a");
    r.set_kind(v1::TENSOR_Q);
    r.set_shm_name(shm);
    r.mutable_rows()->set_begin(r0);
    r.mutable_rows()->set_end(r1);
    r.set_upload(upload);
    grpc::ClientContext ctx;
    v1::SharedMemoryTransferResponse resp;
    return stubs_[0]->SharedMemoryTransfer(&ctx, r, &resp);
  };
  ASSERT_TRUE(transfer(true, name, 5, 15).ok());
  std::vector<float> sent(p, p + bytes / 4);
  std::memset(p, 0, bytes);
  ASSERT_TRUE(transfer(false, name, 5, 15).ok());
  EXPECT_EQ(std::vector<float>(p, p + bytes / 4), sent);
  EXPECT_RPC_ERROR(transfer(true, name, 50, 70), StatusCode::OUT_OF_RANGE, "rows");
  EXPECT_RPC_ERROR(transfer(true, name, 0, 30), StatusCode::OUT_OF_RANGE, "shm_name");
  // Names the worker did not make are never opened, whatever they name.
  EXPECT_RPC_ERROR(transfer(true, "/no-such-segment-dfa", 5, 15), StatusCode::NOT_FOUND,
                   "shm_name");
  EXPECT_RPC_ERROR(transfer(true, "../etc/passwd", 5, 15), StatusCode::NOT_FOUND, "shm_name");
  EXPECT_RPC_ERROR(transfer(true, "", 5, 15), StatusCode::INVALID_ARGUMENT, "shm_name");
  // Another client's segment requests are refused like its other calls.
  create.set_client_id("client-b");
  {
    grpc::ClientContext ctx;
    EXPECT_EQ(stubs_[0]->CreateSharedMemory(&ctx, create, &segment).error_code(),
              StatusCode::PERMISSION_DENIED);
  }
  munmap(p, bytes);
  close(fd);
}

TEST(SyntheticInputsTest, SameSeedSameGlobalTensorsWhateverTheSharding) {
  std::vector<float> whole(2 * 10 * 3 * 4), a(2 * 4 * 3 * 4), b(2 * 6 * 3 * 4);
  FillSynthetic(7, 1, 2, 0, 10, 3, 4, DType::kF32, whole.data());
  FillSynthetic(7, 1, 2, 0, 4, 3, 4, DType::kF32, a.data());
  FillSynthetic(7, 1, 2, 4, 6, 3, 4, DType::kF32, b.data());
  for (int bb = 0; bb < 2; ++bb) {
    for (int r = 0; r < 10; ++r) {
      for (int i = 0; i < 12; ++i) {
        const float got = r < 4 ? a[(bb * 4 + r) * 12 + i] : b[(bb * 6 + r - 4) * 12 + i];
        ASSERT_EQ(got, whole[(bb * 10 + r) * 12 + i]);
        ASSERT_EQ(got, SyntheticValue(7, 1, bb, r, i / 4, i % 4));
        ASSERT_GE(got, -1.f);
        ASSERT_LT(got, 1.f);
      }
    }
  }
  std::vector<float> other(whole.size());
  FillSynthetic(8, 1, 2, 0, 10, 3, 4, DType::kF32, other.data());
  EXPECT_NE(other, whole);
}

TEST(ParseBytesTest, UnitsAndErrors) {
  EXPECT_EQ(*ParseBytes("123"), 123);
  EXPECT_EQ(*ParseBytes("64K"), 64 << 10);
  EXPECT_EQ(*ParseBytes("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(*ParseBytes("8G"), int64_t{8} << 30);
  EXPECT_FALSE(ParseBytes("").ok());
  EXPECT_FALSE(ParseBytes("-5G").ok());
  EXPECT_FALSE(ParseBytes("5X").ok());
}

TEST(ParseDeviceMemoryLimitTest, SizesFractionsAndErrors) {
  int64_t bytes = 0;
  double fraction = 0;
  ASSERT_TRUE(ParseDeviceMemoryLimit("40G", &bytes, &fraction).ok());
  EXPECT_EQ(bytes, int64_t{40} << 30);
  EXPECT_EQ(fraction, 0);
  ASSERT_TRUE(ParseDeviceMemoryLimit("0.5", &bytes, &fraction).ok());
  EXPECT_EQ(bytes, 0);
  EXPECT_EQ(fraction, 0.5);
  ASSERT_TRUE(ParseDeviceMemoryLimit("1", &bytes, &fraction).ok());  // the whole device
  EXPECT_EQ(fraction, 1.0);
  for (const char* bad : {"1.5", "0.0", "-0.2", "0", "", "40X", "half"}) {
    absl::Status st = ParseDeviceMemoryLimit(bad, &bytes, &fraction);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("device_memory_limit"), std::string::npos) << st;
  }
}

}  // namespace
}  // namespace dfa
