// Jobs that start before their inputs have arrived (SubmitJobRequest.inputs_streaming,
// docs/worker.md "Streaming inputs"), on real daemons over loopback: the workers' units wait for
// the rows they read, uploads are accepted while the job runs, a wait is bounded by the worker's
// step timeout (DEADLINE_EXCEEDED naming the tensor and the rows) and ends at once on cancel,
// and the worker keeps serving afterwards.
#include <gtest/gtest.h>

#include <thread>

#include "absl/time/clock.h"
#include "tests/integration/cluster_fixture.h"

namespace dfa::testing {
namespace {

// Each streamed wait gives up after this (dfa-worker --step_timeout_s).
constexpr int kStepTimeoutS = 4;

// One waiting SubmitJob with inputs_streaming.
client::RunOptions Streaming(client::RunCancel* cancel = nullptr) {
  client::RunOptions r;
  r.wait = true;
  r.cancel = cancel;
  r.inputs_streaming = true;
  return r;
}

class StreamingInputsTest : public TwoWorkerSuite<StreamingInputsTest, kStepTimeoutS> {};

// The job is submitted, and runs, before a single input row exists on the workers; the inputs
// come 300 ms later. Forward and backward equal the single-device reference.
void RunStreamedLate(client::Session* s, const TrainingInputs& in, client::TransferPath path,
                     RunResult* r, int row_blocks = 1) {
  client::TransferOptions t;
  t.path = path;
  t.row_blocks = row_blocks;
  constexpr absl::Duration kLate = absl::Milliseconds(300);
  absl::StatusOr<v1::Job> job = absl::UnknownError("not run");
  std::thread fwd([&] {
    job = s->Run(v1::JOB_FORWARD, nullptr, Streaming());
  });
  absl::SleepFor(kLate);
  auto up = s->Upload({{v1::TENSOR_Q, &in.q}, {v1::TENSOR_K, &in.k}, {v1::TENSOR_V, &in.v}}, t);
  fwd.join();
  ASSERT_TRUE(up.ok()) << up.status();
  ASSERT_TRUE(job.ok()) << job.status();
  // The job was running while its inputs were absent: its wall time holds the wait.
  EXPECT_GE(job->wall_seconds(), 0.8 * absl::ToDoubleSeconds(kLate)) << job->DebugString();
  r->forward = *job;
  ASSERT_TRUE(s->Download(v1::TENSOR_O, &r->fwd.o, t).ok());
  ASSERT_TRUE(s->Download(v1::TENSOR_LSE, &r->fwd.lse, t).ok());

  std::thread bwd([&] {
    job = s->Run(v1::JOB_BACKWARD, nullptr, Streaming());
  });
  absl::SleepFor(kLate);
  up = s->Upload(v1::TENSOR_DO, in.dout, t);
  bwd.join();
  ASSERT_TRUE(up.ok()) << up.status();
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_GE(job->wall_seconds(), 0.8 * absl::ToDoubleSeconds(kLate)) << job->DebugString();
  r->backward = *job;
  ASSERT_TRUE(s->Download(v1::TENSOR_DQ, &r->bwd.dq, t).ok());
  ASSERT_TRUE(s->Download(v1::TENSOR_DK, &r->bwd.dk, t).ok());
  ASSERT_TRUE(s->Download(v1::TENSOR_DV, &r->bwd.dv, t).ok());
}

TEST_F(StreamingInputsTest, JobStartedBeforeItsInputsMatchesTheReference) {
  const auto spec = MakeSpec(2, 192, 4, 2, 16, /*causal=*/true);
  const TrainingInputs in = RandomInputs(spec, 21);
  for (client::TransferPath path : {client::TransferPath::kGrpc,
                                    client::TransferPath::kSharedMemory}) {
    SCOPED_TRACE(path == client::TransferPath::kGrpc ? "grpc" : "shm");
    auto s = NewSession(spec);
    ASSERT_NE(s, nullptr);
    RunResult r;
    RunStreamedLate(s.get(), in, path, &r);
    ExpectMatchesReference(spec, in, r);
    // A second streamed step on the same session waits for the new inputs again (not the
    // previous step's rows) and still matches.
    RunResult again;
    RunStreamedLate(s.get(), in, path, &again);
    ExpectMatchesReference(spec, in, again);
    EXPECT_TRUE(s->Release().ok());
  }
}

// Shards long enough for the forward's query blocks (causal calls of >= 256 rows run in blocks
// of >= 128, each once its rows are there), the rows sent in 4 blocks of K, V, Q.
TEST_F(StreamingInputsTest, QueryBlocksOfALongShardMatchTheReference) {
  const auto spec = MakeSpec(1, 1024, 2, 1, 16, /*causal=*/true);
  const TrainingInputs in = RandomInputs(spec, 25);
  auto s = NewSession(spec);
  ASSERT_NE(s, nullptr);
  RunResult r;
  RunStreamedLate(s.get(), in, client::TransferPath::kGrpc, &r, /*row_blocks=*/4);
  ExpectMatchesReference(spec, in, r);
  // The same forward with its inputs all there before it runs its calls whole: fewer launches.
  ASSERT_TRUE(s->Upload({{v1::TENSOR_Q, &in.q}, {v1::TENSOR_K, &in.k}, {v1::TENSOR_V, &in.v}})
                  .ok());
  auto whole = s->Run(v1::JOB_FORWARD);
  ASSERT_TRUE(whole.ok()) << whole.status();
  auto launches = [](const v1::Job& j) {
    int64_t n = 0;
    for (const auto& w : j.workers()) n += w.kernel_launches();
    return n;
  };
  EXPECT_GT(launches(r.forward), launches(*whole))
      << r.forward.DebugString() << whole->DebugString();
  EXPECT_TRUE(s->Release().ok());
}

TEST_F(StreamingInputsTest, AttentionJobStreamsItsUploadsAndMatchesTheReference) {
  const auto spec = MakeSpec(1, 1024, 4, 1, 16, /*causal=*/true);
  const TrainingInputs in = RandomInputs(spec, 22);
  client::AttentionJobOptions o;
  o.session.spec = spec;
  o.session.num_workers = 2;
  o.max_retries = 0;
  ASSERT_TRUE(o.stream_inputs);  // the default
  client::AttentionJob job(client_.get(), o);
  RunResult r;
  auto fwd = job.Forward(in.q, in.k, in.v, &r.forward);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  r.fwd = std::move(*fwd);
  auto bwd = job.Backward(in.dout, &r.backward);
  ASSERT_TRUE(bwd.ok()) << bwd.status();
  r.bwd = std::move(*bwd);
  ExpectMatchesReference(spec, in, r);
}

TEST_F(StreamingInputsTest, InputsThatNeverArriveEndInDeadlineExceededNamingThem) {
  const auto spec = MakeSpec(1, 128, 2, 2, 16, /*causal=*/true);
  const TrainingInputs in = RandomInputs(spec, 23);
  auto s = NewSession(spec);
  ASSERT_NE(s, nullptr);
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::Job> job = absl::UnknownError("not run");
  std::thread fwd([&] { job = s->Run(v1::JOB_FORWARD, nullptr, Streaming()); });
  // Q and K arrive; V never does.
  auto up = s->Upload({{v1::TENSOR_Q, &in.q}, {v1::TENSOR_K, &in.k}});
  // While the job waits, only its own inputs go in, and nothing comes out.
  auto wrong = s->Upload(v1::TENSOR_DO, in.dout);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition) << wrong.status();
  EXPECT_NE(wrong.status().message().find("streams other inputs than TENSOR_DO"),
            std::string::npos)
      << wrong.status();
  client::HostTensor o;
  auto early = s->Download(v1::TENSOR_O, &o);
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition) << early.status();
  EXPECT_NE(early.status().message().find("is running job"), std::string::npos)
      << early.status();
  fwd.join();
  const double took = absl::ToDoubleSeconds(absl::Now() - start);
  ASSERT_TRUE(up.ok()) << up.status();
  ASSERT_EQ(job.status().code(), absl::StatusCode::kDeadlineExceeded) << job.status();
  EXPECT_NE(job.status().message().find("TENSOR_V"), std::string::npos) << job.status();
  EXPECT_NE(job.status().message().find("batch 0 rows ["), std::string::npos) << job.status();
  EXPECT_GE(took, kStepTimeoutS * 0.9);
  EXPECT_LT(took, kStepTimeoutS + 6.0);

  // The workers keep serving: the same session once V is there, and another session.
  ASSERT_TRUE(s->Upload(v1::TENSOR_V, in.v).ok());
  auto again = s->Run(v1::JOB_FORWARD);
  EXPECT_TRUE(again.ok()) << again.status();
  const RunResult other = RunTraining(client_.get(), spec, 2, "", in);
  ExpectMatchesReference(spec, in, other);
}

TEST_F(StreamingInputsTest, CancelEndsTheWaitAtOnce) {
  const auto spec = MakeSpec(1, 128, 2, 2, 16, /*causal=*/true);
  const TrainingInputs in = RandomInputs(spec, 24);
  auto s = NewSession(spec);
  ASSERT_NE(s, nullptr);
  client::RunCancel cancel;
  absl::StatusOr<v1::Job> job = absl::UnknownError("not run");
  std::thread fwd([&] { job = s->Run(v1::JOB_FORWARD, nullptr, Streaming(&cancel)); });
  absl::SleepFor(absl::Milliseconds(400));  // the workers are waiting for Q, K, V
  const absl::Time cancelled = absl::Now();
  cancel.Cancel();
  fwd.join();
  EXPECT_EQ(job.status().code(), absl::StatusCode::kCancelled) << job.status();

  // The workers gave the job up at once, not at their step timeout: the coordinator refuses a
  // new job on the session until every worker has answered the old one, so a plain forward
  // (no inputs yet) is told "has not finished yet" until then and the workers' own refusal
  // after.
  absl::StatusOr<v1::Job> next = absl::UnknownError("not run");
  while (absl::Now() - cancelled < absl::Seconds(2 * kStepTimeoutS)) {
    next = s->Run(v1::JOB_FORWARD);
    if (next.status().message().find("has not finished yet") == std::string::npos) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  const double ended = absl::ToDoubleSeconds(absl::Now() - cancelled);
  EXPECT_EQ(next.status().code(), absl::StatusCode::kFailedPrecondition) << next.status();
  EXPECT_NE(next.status().message().find("TENSOR_Q"), std::string::npos) << next.status();
  EXPECT_LT(ended, kStepTimeoutS * 0.5);
  // And they serve the session as before.
  ASSERT_TRUE(s->Upload({{v1::TENSOR_Q, &in.q}, {v1::TENSOR_K, &in.k}, {v1::TENSOR_V, &in.v}})
                  .ok());
  auto ok = s->Run(v1::JOB_FORWARD);
  EXPECT_TRUE(ok.ok()) << ok.status();
}

}  // namespace
}  // namespace dfa::testing
