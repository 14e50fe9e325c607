// Outputs downloaded while their job runs (DownloadRequest.await_job_id, SubmitJobRequest.
// outputs_streaming; docs/worker.md "Streaming outputs"), on real daemons over loopback: a
// download sends each chunk once its rows are final, so a worker's rows come back while another
// worker still waits for its inputs; the results equal the reference over gRPC and shared
// memory; a download waiting on a job that is cancelled or fails ends promptly with the job's
// code naming the tensor and rows; a waiting download times out with DEADLINE_EXCEEDED naming
// them; and a waiting download whose client goes away leaves the worker serving.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/time/clock.h"
#include "core/planner/plan_proto.h"
#include "core/planner/worker_memory.h"
#include "core/session_capability.h"
#include "dfa/v1/worker.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "tests/integration/cluster_fixture.h"

namespace dfa::testing {
namespace {

// A job waiting for inputs that never come fails after this (dfa-worker --step_timeout_s).
constexpr int kStepTimeoutS = 4;

class StreamingOutputsTest : public TwoWorkerSuite<StreamingOutputsTest, kStepTimeoutS> {};

client::TransferOptions Awaiting(const std::string& job_id, client::TransferPath path,
                                 absl::Duration timeout = absl::Seconds(20)) {
  client::TransferOptions t;
  t.path = path;
  t.await.job_id = job_id;
  t.await.timeout = timeout;
  return t;
}

std::vector<v1::RowRange> Owned(const client::Session& s, int rank) {
  const auto& owned = s.info().shards(rank).owned();
  return {owned.begin(), owned.end()};
}

// The shard (index into the placement) that owns global row 0.
int FirstShard(const client::Session& s) {
  for (int r = 0; r < s.num_workers(); ++r) {
    if (s.info().shards(r).owned(0).begin() == 0) return r;
  }
  return 0;
}

// Forward and backward submitted before any input exists, their outputs' downloads started
// before the inputs are uploaded: every download waits on its job and the results equal the
// single-device reference.
void RunWithAwaitedOutputs(client::Session* s, const TrainingInputs& in, client::TransferPath path,
                           RunResult* r) {
  client::TransferOptions up;
  up.path = path;
  up.row_blocks = 4;
  auto fwd = s->Submit(v1::JOB_FORWARD, /*inputs_streaming=*/true, /*outputs_streaming=*/true);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  absl::Status o_st, lse_st;
  std::thread gather([&] {
    o_st = s->Download(v1::TENSOR_O, &r->fwd.o, Awaiting(fwd->job_id(), path)).status();
    if (o_st.ok()) {
      lse_st = s->Download(v1::TENSOR_LSE, &r->fwd.lse, Awaiting(fwd->job_id(), path)).status();
    }
  });
  absl::SleepFor(absl::Milliseconds(200));  // the downloads are waiting
  auto sent = s->Upload({{v1::TENSOR_K, &in.k}, {v1::TENSOR_V, &in.v}, {v1::TENSOR_Q, &in.q}}, up);
  gather.join();
  ASSERT_TRUE(sent.ok()) << sent.status();
  ASSERT_TRUE(o_st.ok()) << o_st;
  ASSERT_TRUE(lse_st.ok()) << lse_st;
  auto done = s->Watch(fwd->job_id(), nullptr);
  ASSERT_TRUE(done.ok()) << done.status();
  r->forward = *done;

  auto bwd = s->Submit(v1::JOB_BACKWARD, true, true);
  ASSERT_TRUE(bwd.ok()) << bwd.status();
  absl::Status g_st;
  std::thread grads([&] {
    g_st = s->Download(v1::TENSOR_DQ, &r->bwd.dq, Awaiting(bwd->job_id(), path)).status();
    if (g_st.ok()) {
      g_st = s->Download(v1::TENSOR_DK, &r->bwd.dk, Awaiting(bwd->job_id(), path)).status();
    }
    if (g_st.ok()) {
      g_st = s->Download(v1::TENSOR_DV, &r->bwd.dv, Awaiting(bwd->job_id(), path)).status();
    }
  });
  absl::SleepFor(absl::Milliseconds(200));
  sent = s->Upload(v1::TENSOR_DO, in.dout, up);
  grads.join();
  ASSERT_TRUE(sent.ok()) << sent.status();
  ASSERT_TRUE(g_st.ok()) << g_st;
  done = s->Watch(bwd->job_id(), nullptr);
  ASSERT_TRUE(done.ok()) << done.status();
  r->backward = *done;
}

TEST_F(StreamingOutputsTest, OutputsAwaitedWhileTheJobRunsMatchTheReference) {
  const auto spec = MakeSpec(2, 384, 4, 2, 16, /*causal=*/true);
  const TrainingInputs in = RandomInputs(spec, 31);
  for (client::TransferPath path :
       {client::TransferPath::kGrpc, client::TransferPath::kSharedMemory}) {
    for (const char* schedule : {"balanced", "distflash"}) {
      SCOPED_TRACE(absl::StrCat(path == client::TransferPath::kGrpc ? "grpc " : "shm ", schedule));
      auto s = NewSession(spec, schedule);
      ASSERT_NE(s, nullptr);
      RunResult r;
      RunWithAwaitedOutputs(s.get(), in, path, &r);
      ExpectMatchesReference(spec, in, r);
      EXPECT_TRUE(s->Release().ok());
    }
  }
}

// distflash on 2 workers: the first worker's queries see only its own keys, so its O rows are
// final after its first step. With the second worker's inputs held back, the job cannot end,
// yet the first worker's O comes back whole.
TEST_F(StreamingOutputsTest, AWorkersRowsComeBackWhileAnotherStillWaits) {
  const auto spec = MakeSpec(1, 512, 2, 1, 16, /*causal=*/true);
  const TrainingInputs in = RandomInputs(spec, 32);
  auto s = NewSession(spec, "distflash");
  ASSERT_NE(s, nullptr);
  const int first = FirstShard(*s);
  const int second = 1 - first;
  auto job = s->Submit(v1::JOB_FORWARD, true, true);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::vector<v1::RowRange> mine = Owned(*s, first);
  for (const auto& [kind, t] : std::vector<std::pair<v1::TensorKind, const client::HostTensor*>>{
           {v1::TENSOR_K, &in.k}, {v1::TENSOR_V, &in.v}, {v1::TENSOR_Q, &in.q}}) {
    auto up = s->DataClient(first).UploadGrpc(kind, *t, mine, client::kDefaultChunkBytes, nullptr);
    ASSERT_TRUE(up.ok()) << up.status();
  }
  auto early_o = client::MakeTensor(spec, v1::TENSOR_O);
  ASSERT_TRUE(early_o.ok());
  client::OutputAwait await{job->job_id(), absl::Seconds(kStepTimeoutS / 2)};
  auto got = s->DataClient(first).DownloadGrpc(v1::TENSOR_O, mine, client::kDefaultChunkBytes,
                                               &*early_o, nullptr, await);
  ASSERT_TRUE(got.ok()) << got.status();
  // The job is still running: the second worker has none of its inputs.
  auto state = client_->GetJob(job->job_id());
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->state(), v1::JOB_RUNNING) << state->DebugString();
  // The second worker's rows are not final: its download waits.
  auto late_o = client::MakeTensor(spec, v1::TENSOR_O);
  ASSERT_TRUE(late_o.ok());
  client::OutputAwait brief{job->job_id(), absl::Milliseconds(300)};
  auto waiting = s->DataClient(second).DownloadGrpc(
      v1::TENSOR_O, Owned(*s, second), client::kDefaultChunkBytes, &*late_o, nullptr, brief);
  EXPECT_EQ(waiting.status().code(), absl::StatusCode::kDeadlineExceeded) << waiting.status();
  EXPECT_NE(waiting.status().message().find("TENSOR_O rows ["), std::string::npos)
      << waiting.status();
  EXPECT_NE(waiting.status().message().find("are not final within 300ms"), std::string::npos)
      << waiting.status();

  // The rest arrives; the job ends, and the early rows are the final ones.
  const std::vector<v1::RowRange> theirs = Owned(*s, second);
  for (const auto& [kind, t] : std::vector<std::pair<v1::TensorKind, const client::HostTensor*>>{
           {v1::TENSOR_K, &in.k}, {v1::TENSOR_V, &in.v}, {v1::TENSOR_Q, &in.q}}) {
    auto up =
        s->DataClient(second).UploadGrpc(kind, *t, theirs, client::kDefaultChunkBytes, nullptr);
    ASSERT_TRUE(up.ok()) << up.status();
  }
  auto done = s->Watch(job->job_id(), nullptr);
  ASSERT_TRUE(done.ok()) << done.status();
  RunResult r;
  r.forward = *done;
  ASSERT_TRUE(s->Download(v1::TENSOR_O, &r.fwd.o).ok());
  ASSERT_TRUE(s->Download(v1::TENSOR_LSE, &r.fwd.lse).ok());
  const int64_t row_bytes = r.fwd.o.size_bytes() / spec.seq_len();
  for (const v1::RowRange& range : mine) {
    const int64_t off = range.begin() * row_bytes, n = (range.end() - range.begin()) * row_bytes;
    EXPECT_EQ(0, std::memcmp(early_o->data() + off, r.fwd.o.data() + off, n));
  }
  ASSERT_TRUE(s->Upload(v1::TENSOR_DO, in.dout).ok());
  auto bwd = s->Run(v1::JOB_BACKWARD);
  ASSERT_TRUE(bwd.ok()) << bwd.status();
  r.backward = *bwd;
  ASSERT_TRUE(s->Download(v1::TENSOR_DQ, &r.bwd.dq).ok());
  ASSERT_TRUE(s->Download(v1::TENSOR_DK, &r.bwd.dk).ok());
  ASSERT_TRUE(s->Download(v1::TENSOR_DV, &r.bwd.dv).ok());
  ExpectMatchesReference(spec, in, r);
}

TEST_F(StreamingOutputsTest, ADownloadAwaitingACancelledJobEndsAtOnce) {
  const auto spec = MakeSpec(1, 128, 2, 2, 16, /*causal=*/true);
  auto s = NewSession(spec);
  ASSERT_NE(s, nullptr);
  auto job = s->Submit(v1::JOB_FORWARD, true, true);  // its inputs never come
  ASSERT_TRUE(job.ok()) << job.status();
  for (client::TransferPath path :
       {client::TransferPath::kGrpc, client::TransferPath::kSharedMemory}) {
    SCOPED_TRACE(path == client::TransferPath::kGrpc ? "grpc" : "shm");
    client::HostTensor o;
    absl::Status st;
    absl::Time ended;
    std::thread waiter([&] {
      st = s->Download(v1::TENSOR_O, &o, Awaiting(job->job_id(), path)).status();
      ended = absl::Now();
    });
    absl::SleepFor(absl::Milliseconds(300));
    const absl::Time cancelled = absl::Now();
    if (path == client::TransferPath::kGrpc) {
      ASSERT_TRUE(client_->CancelJob(job->job_id()).ok());
    }
    waiter.join();
    // Cancelled once; the second download finds the job's outcome at once.
    EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
    EXPECT_NE(st.message().find("ended CANCELLED before TENSOR_O rows ["), std::string::npos) << st;
    EXPECT_LT(absl::ToDoubleSeconds(ended - cancelled), 1.0);
  }
  // The session serves the next job.
  const TrainingInputs in = RandomInputs(spec, 33);
  ASSERT_TRUE(
      s->Upload({{v1::TENSOR_Q, &in.q}, {v1::TENSOR_K, &in.k}, {v1::TENSOR_V, &in.v}}).ok());
  auto next = s->Run(v1::JOB_FORWARD);
  EXPECT_TRUE(next.ok()) << next.status();
}

TEST_F(StreamingOutputsTest, ADownloadAwaitingAFailedJobEndsWithItsError) {
  const auto spec = MakeSpec(1, 128, 2, 2, 16, /*causal=*/true);
  const TrainingInputs in = RandomInputs(spec, 34);
  auto s = NewSession(spec);
  ASSERT_NE(s, nullptr);
  auto job = s->Submit(v1::JOB_FORWARD, true, true);
  ASSERT_TRUE(job.ok()) << job.status();
  // Q and K arrive, V never does: the job fails after the step timeout.
  ASSERT_TRUE(s->Upload({{v1::TENSOR_Q, &in.q}, {v1::TENSOR_K, &in.k}}).ok());
  client::HostTensor o;
  const absl::Time start = absl::Now();
  auto st =
      s->Download(v1::TENSOR_O, &o, Awaiting(job->job_id(), client::TransferPath::kGrpc)).status();
  const double took = absl::ToDoubleSeconds(absl::Now() - start);
  // Each worker's own outcome: the one whose wait ran out fails DEADLINE_EXCEEDED; the other is
  // cancelled by the coordinator then, while it waits for V too.
  EXPECT_TRUE(st.code() == absl::StatusCode::kDeadlineExceeded ||
              st.code() == absl::StatusCode::kCancelled)
      << st;
  EXPECT_NE(st.message().find(absl::StrCat("ended ", absl::StatusCodeToString(st.code()),
                                           " before TENSOR_O rows [")),
            std::string::npos)
      << st;
  EXPECT_NE(st.message().find("TENSOR_V rows"), std::string::npos) << st;
  EXPECT_LT(took, kStepTimeoutS + 3.0);
  auto done = s->Watch(job->job_id(), nullptr);
  EXPECT_EQ(done.status().code(), absl::StatusCode::kDeadlineExceeded) << done.status();
  // A kind the job does not make is refused at once, naming it.
  auto next = s->Submit(v1::JOB_FORWARD, true, true);
  ASSERT_TRUE(next.ok()) << next.status();
  client::HostTensor dq;
  auto wrong =
      s->Download(v1::TENSOR_DQ, &dq, Awaiting(next->job_id(), client::TransferPath::kGrpc));
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument) << wrong.status();
  EXPECT_NE(wrong.status().message().find("TENSOR_DQ is not an output of await_job_id"),
            std::string::npos)
      << wrong.status();
  ASSERT_TRUE(client_->CancelJob(next->job_id()).ok());
  (void)s->Watch(next->job_id(), nullptr);
}

// A download waiting on a job whose client goes away: the worker ends it and keeps serving
// (the job, that session and others).
TEST_F(StreamingOutputsTest, AWaitingDownloadWhoseClientGoesAwayLeavesTheWorkerServing) {
  const auto spec = MakeSpec(1, 128, 2, 2, 16, /*causal=*/true);
  const TrainingInputs in = RandomInputs(spec, 35);
  auto s = NewSession(spec);
  ASSERT_NE(s, nullptr);
  auto job = s->Submit(v1::JOB_FORWARD, true, true);
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::ShardPlacement& shard = s->info().shards(0);
  auto channel = grpc::CreateChannel(shard.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Worker::NewStub(channel);
  constexpr int kGone = 4;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::thread> readers;
  std::atomic<int> ended{0};
  for (int i = 0; i < kGone; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    grpc::ClientContext* ctx = contexts.back().get();
    ctx->AddMetadata(kSessionCapabilityMetadata, s->capability());
    readers.emplace_back([&, ctx] {
      v1::DownloadRequest req;
      req.set_session_id(s->id());
      req.set_client_id(client_->client_id());
      req.set_kind(v1::TENSOR_O);
      req.set_await_job_id(job->job_id());
      req.set_await_timeout_ms(60'000);
      auto reader = stub->Download(ctx, req);
      v1::TensorChunk chunk;
      while (reader->Read(&chunk)) {
      }
      (void)reader->Finish();
      ++ended;
    });
  }
  absl::SleepFor(absl::Milliseconds(300));
  for (auto& ctx : contexts) ctx->TryCancel();  // the client goes away
  for (auto& t : readers) t.join();
  EXPECT_EQ(ended.load(), kGone);
  // The job completes once its inputs come, its outputs downloadable as usual, and another
  // session runs on the same workers.
  ASSERT_TRUE(
      s->Upload({{v1::TENSOR_Q, &in.q}, {v1::TENSOR_K, &in.k}, {v1::TENSOR_V, &in.v}}).ok());
  auto done = s->Watch(job->job_id(), nullptr);
  ASSERT_TRUE(done.ok()) << done.status();
  client::HostTensor o;
  EXPECT_TRUE(s->Download(v1::TENSOR_O, &o).ok());
  const RunResult other = RunTraining(client_.get(), spec, 2, "", in);
  ExpectMatchesReference(spec, in, other);
}

// A forward on complete inputs, then a backward submitted before its dO, which comes in 4 row
// blocks 200 ms later while a download of dQ awaits the job; dK and dV downloaded under the job
// after. Fills `r` (the jobs and outputs); a fatal failure on any error.
void RunBackwardOnStreamedDo(client::Session* s, const TrainingInputs& in, RunResult* r) {
  ASSERT_TRUE(
      s->Upload({{v1::TENSOR_Q, &in.q}, {v1::TENSOR_K, &in.k}, {v1::TENSOR_V, &in.v}}).ok());
  auto fwd = s->Run(v1::JOB_FORWARD);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  r->forward = *fwd;
  ASSERT_TRUE(s->Download(v1::TENSOR_O, &r->fwd.o).ok());
  ASSERT_TRUE(s->Download(v1::TENSOR_LSE, &r->fwd.lse).ok());
  auto bwd = s->Submit(v1::JOB_BACKWARD, true, true);
  ASSERT_TRUE(bwd.ok()) << bwd.status();
  const client::TransferOptions await = Awaiting(bwd->job_id(), client::TransferPath::kAuto);
  absl::Status dq_st;
  std::thread early([&] { dq_st = s->Download(v1::TENSOR_DQ, &r->bwd.dq, await).status(); });
  absl::SleepFor(absl::Milliseconds(200));  // the backward and the download wait for dO
  client::TransferOptions blocks;
  blocks.row_blocks = 4;
  const absl::Status sent = s->Upload({{v1::TENSOR_DO, &in.dout}}, blocks).status();
  early.join();
  ASSERT_TRUE(sent.ok()) << sent;
  ASSERT_TRUE(dq_st.ok()) << dq_st;
  ASSERT_TRUE(s->Download(v1::TENSOR_DK, &r->bwd.dk, await).ok());
  ASSERT_TRUE(s->Download(v1::TENSOR_DV, &r->bwd.dv, await).ok());
  auto streamed = s->Watch(bwd->job_id(), nullptr);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  r->backward = *streamed;
}

// The same forward and backward on complete inputs; `grads` gets dQ, dK, dV.
void RunBackwardOnCompleteDo(client::Session* s, const TrainingInputs& in, v1::Job* job,
                             client::BackwardOutputs* grads) {
  ASSERT_TRUE(
      s->Upload({{v1::TENSOR_Q, &in.q}, {v1::TENSOR_K, &in.k}, {v1::TENSOR_V, &in.v}}).ok());
  ASSERT_TRUE(s->Run(v1::JOB_FORWARD).ok());
  ASSERT_TRUE(s->Upload(v1::TENSOR_DO, in.dout).ok());
  auto whole = s->Run(v1::JOB_BACKWARD);
  ASSERT_TRUE(whole.ok()) << whole.status();
  *job = *whole;
  ASSERT_TRUE(s->Download(v1::TENSOR_DQ, &grads->dq).ok());
  ASSERT_TRUE(s->Download(v1::TENSOR_DK, &grads->dk).ok());
  ASSERT_TRUE(s->Download(v1::TENSOR_DV, &grads->dv).ok());
}

bool BitwiseEqual(const client::HostTensor& a, const client::HostTensor& b) {
  return a.size_bytes() == b.size_bytes() &&
         std::memcmp(a.data(), b.data(), static_cast<size_t>(a.size_bytes())) == 0;
}

// A streamed backward forms D = rowsum(dO * O) range by range as dO arrives (before each unit,
// dQ partial and grad_in send on owned rows; docs/worker.md "Streaming inputs"): dO sent in 4
// row blocks 200 ms after the job started, batch 2, bf16 (dQ's fp32 rows overlay two O rows)
// and fp32, contiguous and zigzag shards. Equal to the reference, with more kernel launches
// than the same backward on a complete dO (D in pieces, not one call).
TEST_F(StreamingOutputsTest, ABackwardOnStreamedDoFormsDInPiecesAndMatchesTheReference) {
  auto launches = [](const v1::Job& j) {
    int64_t n = 0;
    for (const auto& w : j.workers()) n += w.kernel_launches();
    return n;
  };
  for (v1::DType dtype : {v1::DTYPE_BF16, v1::DTYPE_F32}) {
    for (const char* schedule : {"zigzag", "balanced", "distflash"}) {
      SCOPED_TRACE(absl::StrCat(v1::DType_Name(dtype), " ", schedule));
      const auto spec = MakeSpec(2, 512, 4, 2, 16, /*causal=*/true, dtype);
      const TrainingInputs in = RandomInputs(spec, 37);
      auto s = NewSession(spec, schedule);
      ASSERT_NE(s, nullptr);
      RunResult r;
      ASSERT_NO_FATAL_FAILURE(RunBackwardOnStreamedDo(s.get(), in, &r));
      ExpectMatchesReference(spec, in, r);
      v1::Job whole;
      client::BackwardOutputs grads;
      ASSERT_NO_FATAL_FAILURE(RunBackwardOnCompleteDo(s.get(), in, &whole, &grads));
      EXPECT_GT(launches(r.backward), launches(whole)) << r.backward.DebugString()
                                                       << whole.DebugString();
      EXPECT_TRUE(BitwiseEqual(grads.dq, r.bwd.dq));
      EXPECT_TRUE(s->Release().ok());
    }
  }
}

TEST_F(StreamingOutputsTest, BadAwaitTimeoutsAreRefusedNamingTheField) {
  const auto spec = MakeSpec(1, 128, 2, 2, 16, /*causal=*/true);
  auto s = NewSession(spec);
  ASSERT_NE(s, nullptr);
  const v1::ShardPlacement& shard = s->info().shards(0);
  auto stub =
      v1::Worker::NewStub(grpc::CreateChannel(shard.address(), grpc::InsecureChannelCredentials()));
  for (int64_t ms : {int64_t{-1}, int64_t{86'400'001}}) {
    SCOPED_TRACE(ms);
    grpc::ClientContext ctx;
    ctx.AddMetadata(kSessionCapabilityMetadata, s->capability());
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::DownloadRequest req;
    req.set_session_id(s->id());
    req.set_client_id(client_->client_id());
    req.set_kind(v1::TENSOR_O);
    req.set_await_job_id("j-none");
    req.set_await_timeout_ms(ms);
    auto reader = stub->Download(&ctx, req);
    v1::TensorChunk chunk;
    EXPECT_FALSE(reader->Read(&chunk));
    const grpc::Status st = reader->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_NE(st.error_message().find("await_timeout_ms = "), std::string::npos)
        << st.error_message();

    grpc::ClientContext shm_ctx;
    shm_ctx.AddMetadata(kSessionCapabilityMetadata, s->capability());
    shm_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::SharedMemoryTransferRequest shm;
    shm.set_session_id(s->id());
    shm.set_client_id(client_->client_id());
    shm.set_kind(v1::TENSOR_O);
    shm.set_shm_name("no-such-segment");
    *shm.mutable_rows() = shard.owned(0);
    shm.set_await_job_id("j-none");
    shm.set_await_timeout_ms(ms);
    v1::SharedMemoryTransferResponse resp;
    const grpc::Status shm_st = stub->SharedMemoryTransfer(&shm_ctx, shm, &resp);
    EXPECT_EQ(shm_st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << shm_st.error_message();
    EXPECT_NE(shm_st.error_message().find("await_timeout_ms = "), std::string::npos)
        << shm_st.error_message();
  }
}

// AttentionJob (the default stream_inputs and stream_outputs): forward and backward through
// awaited downloads, over both paths, equal the reference.
TEST_F(StreamingOutputsTest, AttentionJobStreamsItsOutputsAndMatchesTheReference) {
  const auto spec = MakeSpec(1, 1024, 4, 1, 16, /*causal=*/true);
  const TrainingInputs in = RandomInputs(spec, 36);
  for (client::TransferPath path :
       {client::TransferPath::kGrpc, client::TransferPath::kSharedMemory}) {
    SCOPED_TRACE(path == client::TransferPath::kGrpc ? "grpc" : "shm");
    client::AttentionJobOptions o;
    o.session.spec = spec;
    o.session.num_workers = 2;
    o.transfer.path = path;
    o.max_retries = 0;
    ASSERT_TRUE(o.stream_outputs);  // the default
    int states = 0;
    o.observer = [&](const v1::Job&) { ++states; };
    client::AttentionJob job(client_.get(), o);
    RunResult r;
    auto fwd = job.Forward(in.q, in.k, in.v, &r.forward);
    ASSERT_TRUE(fwd.ok()) << fwd.status();
    r.fwd = std::move(*fwd);
    auto bwd = job.Backward(in.dout, &r.backward);
    ASSERT_TRUE(bwd.ok()) << bwd.status();
    r.bwd = std::move(*bwd);
    ExpectMatchesReference(spec, in, r);
    EXPECT_GE(states, 2);  // the watch reports more than the final state
  }
}

// Workers that run a backward whose keys they own alone in chunks of 128 rows (--step_tokens).
class ChunkedStreamingOutputsTest
    : public TwoWorkerSuite<ChunkedStreamingOutputsTest, kStepTimeoutS, /*kStepTokens=*/128> {};

// A chunked backward (each worker owns all rows of its head group: dK, dV one 128-row key chunk
// at a time) on a dO that arrives in 4 row blocks while it runs, its dQ, dK, dV awaited: equal
// to the reference, and bitwise to the same backward on a complete dO.
TEST_F(ChunkedStreamingOutputsTest, AChunkedBackwardOnStreamedDoMatchesTheReference) {
  for (v1::DType dtype : {v1::DTYPE_BF16, v1::DTYPE_F32}) {
    SCOPED_TRACE(v1::DType_Name(dtype));
    const auto spec = MakeSpec(2, 512, 4, 2, 16, /*causal=*/true, dtype);
    const TrainingInputs in = RandomInputs(spec, 38);
    auto s = NewSession(spec, "heads");
    ASSERT_NE(s, nullptr);
    auto plan = PlanFromProto(s->info().plan());
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (int r = 0; r < plan->num_workers(); ++r) {
      ASSERT_TRUE(ChunkedBackward(*plan, r)) << "rank " << r;
      ASSERT_GT(plan->workers[static_cast<size_t>(r)].owned[0].size(), 128);
    }
    RunResult r;
    ASSERT_NO_FATAL_FAILURE(RunBackwardOnStreamedDo(s.get(), in, &r));
    ExpectMatchesReference(spec, in, r);
    v1::Job whole;
    client::BackwardOutputs grads;
    ASSERT_NO_FATAL_FAILURE(RunBackwardOnCompleteDo(s.get(), in, &whole, &grads));
    EXPECT_TRUE(BitwiseEqual(grads.dq, r.bwd.dq));
    EXPECT_TRUE(BitwiseEqual(grads.dk, r.bwd.dk));
    EXPECT_TRUE(BitwiseEqual(grads.dv, r.bwd.dv));
    EXPECT_TRUE(s->Release().ok());
  }
}

}  // namespace
}  // namespace dfa::testing
