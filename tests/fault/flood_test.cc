// Stream floods on real daemons: thousands of WatchJob streams on the coordinator and abandoned
// Upload streams on a worker. A watch is a callback reactor (coordinator/job_watch.h): the
// coordinator's thread count stays flat and other clients' GetStatus stays fast; beyond the
// per-client and total caps a watch is RESOURCE_EXHAUSTED. A worker holds at most
// --max_data_streams Upload/Download streams (more: RESOURCE_EXHAUSTED) and cancels the ones
// idle for --stream_idle_timeout_s (worker/stream_limits.h), after which uploads work again.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "core/session_capability.h"
#include "fake_worker.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/create_channel.h"
#include "tests/fault/hostile_util.h"

namespace dfa::testing {
namespace {

std::vector<std::shared_ptr<grpc::Channel>> Channels(const std::string& address, int n) {
  std::vector<std::shared_ptr<grpc::Channel>> out;
  for (int i = 0; i < n; ++i) {
    grpc::ChannelArguments args;
    args.SetInt("dfa.test.connection", i);  // a connection of its own
    out.push_back(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  }
  return out;
}

// Many WatchJob streams on one completion queue: each reads its first message and then sits.
class WatchFlood {
 public:
  struct Watch {
    std::string job_id, client_id, capability;
  };

  // Starts one stream per entry of `watches`, spread over `channels`.
  void Start(const std::vector<Watch>& watches,
             const std::vector<std::shared_ptr<grpc::Channel>>& channels) {
    for (size_t i = 0; i < watches.size(); ++i) {
      auto s = std::make_unique<Stream>();
      s->stub = v1::Coordinator::NewStub(channels[i % channels.size()]);
      AttachCapability(&s->ctx, watches[i].capability);
      v1::GetJobRequest req;
      req.set_job_id(watches[i].job_id);
      req.set_client_id(watches[i].client_id);
      s->reader = s->stub->PrepareAsyncWatchJob(&s->ctx, req, &cq_);
      s->reader->StartCall(Tag(streams_.size(), kStarted));
      streams_.push_back(std::move(s));
    }
  }
  // Pumps the queue until every stream got its first message or ended (or `timeout`).
  void Settle(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (Pending() > 0) {
      void* tag = nullptr;
      bool ok = false;
      const auto r = cq_.AsyncNext(&tag, &ok, absl::ToChronoTime(deadline));
      if (r != grpc::CompletionQueue::GOT_EVENT) break;
      Handle(tag, ok);
    }
  }
  // Ends every stream (cancel, then collect the statuses).
  void CancelAll(absl::Duration timeout) {
    for (auto& s : streams_) {
      if (s->done) continue;
      s->ctx.TryCancel();
      if (s->first && !s->reading) {
        s->reading = true;
        s->reader->Read(&s->job, Tag(Index(s.get()), kRead));
      }
    }
    cancelling_ = true;
    Settle(timeout);
  }
  int accepted() const {
    return static_cast<int>(std::count_if(streams_.begin(), streams_.end(),
                                          [](const auto& s) { return s->first; }));
  }
  int finished_with(grpc::StatusCode code) const {
    return static_cast<int>(std::count_if(streams_.begin(), streams_.end(), [&](const auto& s) {
      return s->done && s->status.error_code() == code;
    }));
  }
  std::string some_message(grpc::StatusCode code) const {
    for (const auto& s : streams_) {
      if (s->done && s->status.error_code() == code) return s->status.error_message();
    }
    return "";
  }
  ~WatchFlood() {
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }

 private:
  enum Phase { kStarted = 0, kRead = 1, kFinished = 2 };
  struct Stream {
    std::unique_ptr<v1::Coordinator::Stub> stub;
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientAsyncReader<v1::Job>> reader;
    v1::Job job;
    grpc::Status status;
    bool first = false, done = false, reading = false, finishing = false;
  };
  static void* Tag(size_t i, Phase p) { return reinterpret_cast<void*>(i * 4 + p + 4); }
  size_t Index(const Stream* s) const {
    for (size_t i = 0; i < streams_.size(); ++i) {
      if (streams_[i].get() == s) return i;
    }
    return 0;
  }
  int Pending() const {
    int n = 0;
    for (const auto& s : streams_) n += !s->done && (cancelling_ || !s->first);
    return n;
  }
  void Handle(void* tag, bool ok) {
    const size_t v = reinterpret_cast<size_t>(tag) - 4;
    Stream& s = *streams_[v / 4];
    switch (static_cast<Phase>(v % 4)) {
      case kStarted:
      case kRead:
        s.reading = false;
        if (ok && (v % 4) == kRead) s.first = true;
        if (ok && ((v % 4) == kStarted || cancelling_)) {
          s.reading = true;
          s.reader->Read(&s.job, Tag(v / 4, kRead));
        } else if (!ok && !s.finishing) {
          s.finishing = true;
          s.reader->Finish(&s.status, Tag(v / 4, kFinished));
        }
        break;
      case kFinished:
        s.done = true;
        break;
    }
  }

  grpc::CompletionQueue cq_;
  std::vector<std::unique_ptr<Stream>> streams_;
  bool cancelling_ = false;
};

// A job that stays queued or running (on a fake worker that holds RunJob) per client.
struct HeldJobs {
  std::unique_ptr<FakeWorker> fake;
  std::vector<std::unique_ptr<client::Client>> clients;
  std::vector<std::unique_ptr<client::Session>> sessions;
  std::vector<v1::Job> jobs;
};

void HoldJobs(client::LocalCluster* cluster, int clients, HeldJobs* held) {
  FakeWorkerOptions fo;
  fo.id = "holding-worker";
  fo.memory_limit_bytes = int64_t{1} << 50;
  fo.block_runs = true;
  held->fake = std::make_unique<FakeWorker>(fo);
  held->fake->Start(cluster->coordinator_address());
  for (int i = 0; i < clients; ++i) {
    client::ClientOptions co = cluster->client_options();
    co.client_id = absl::StrCat("flood-client-", i);
    auto c = client::Client::Connect(co);
    ASSERT_TRUE(c.ok()) << c.status();
    client::SessionOptions so;
    so.spec = SmallSpec(64);
    so.num_workers = 1;
    absl::StatusOr<std::unique_ptr<client::Session>> s;
    for (int attempt = 0; attempt < 100; ++attempt) {  // until the fake is registered
      s = (*c)->CreateSession(so);
      if (s.ok() && (*s)->info().shards(0).worker_id() == fo.id) break;
      if (s.ok()) (void)(*s)->Release();
      absl::SleepFor(absl::Milliseconds(50));
    }
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_EQ((*s)->info().shards(0).worker_id(), fo.id);
    auto job = (*s)->Submit(v1::JOB_FORWARD);
    ASSERT_TRUE(job.ok()) << job.status();
    held->jobs.push_back(*job);
    held->sessions.push_back(std::move(*s));
    held->clients.push_back(std::move(*c));
  }
}

double MaxGetStatusMs(const std::string& coordinator, int calls) {
  double worst = 0;
  for (int i = 0; i < calls; ++i) worst = std::max(worst, GetStatusMs(coordinator));
  return worst;
}

TEST(FloodTest, ThousandsOfWatchJobStreamsCostNoThreadsAndGetStatusStaysFast) {
  auto cluster = StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  HeldJobs held;
  HoldJobs(cluster.get(), 12, &held);
  const pid_t pid = cluster->coordinator_process()->pid();
  const int threads_before = ProcThreads(pid);

  // 250 watches on each of 12 clients' jobs: 3000 streams, under every cap.
  std::vector<WatchFlood::Watch> watches;
  for (size_t c = 0; c < held.jobs.size(); ++c) {
    for (int i = 0; i < 250; ++i) {
      watches.push_back({held.jobs[c].job_id(), held.clients[c]->client_id(),
                         held.sessions[c]->capability()});
    }
  }
  WatchFlood flood;
  flood.Start(watches, Channels(cluster->coordinator_address(), 8));
  flood.Settle(absl::Seconds(60));
  EXPECT_EQ(flood.accepted(), 3000);
  const int threads_flooded = ProcThreads(pid);
  const double worst_ms = MaxGetStatusMs(cluster->coordinator_address(), 20);
  std::printf("coordinator threads: %d before, %d with %d WatchJob streams; GetStatus worst %.1f "
              "ms\n", threads_before, threads_flooded, flood.accepted(), worst_ms);
  EXPECT_LT(threads_flooded, threads_before + 64) << "WatchJob streams cost threads";
  EXPECT_LT(worst_ms, 500) << "GetStatus is slow under a WatchJob flood";

  // 100 more for one client: its cap (256) admits 6; the rest are RESOURCE_EXHAUSTED.
  std::vector<WatchFlood::Watch> more(100, watches.front());
  WatchFlood extra;
  extra.Start(more, Channels(cluster->coordinator_address(), 2));
  extra.Settle(absl::Seconds(30));
  EXPECT_EQ(extra.accepted(), 6);
  EXPECT_EQ(extra.finished_with(grpc::StatusCode::RESOURCE_EXHAUSTED), 94);
  EXPECT_TRUE(absl::StrContains(extra.some_message(grpc::StatusCode::RESOURCE_EXHAUSTED),
                                "--max_watch_streams_per_client"));
  extra.CancelAll(absl::Seconds(30));
  flood.CancelAll(absl::Seconds(30));
  EXPECT_EQ(flood.finished_with(grpc::StatusCode::CANCELLED), 3000);
  for (auto& s : held.sessions) (void)s->Release();
  held.fake.reset();
  EXPECT_TRUE(cluster->Stop().ok()) << "logs in " << cluster->log_dir();
}

TEST(FloodTest, WatchJobStreamsBeyondTheTotalCapAreRefused) {
  auto cluster = StartCluster(1, {"--max_watch_streams=50"});
  ASSERT_NE(cluster, nullptr);
  HeldJobs held;
  HoldJobs(cluster.get(), 1, &held);
  std::vector<WatchFlood::Watch> watches(
      80, {held.jobs[0].job_id(), held.clients[0]->client_id(), held.sessions[0]->capability()});
  WatchFlood flood;
  flood.Start(watches, Channels(cluster->coordinator_address(), 2));
  flood.Settle(absl::Seconds(30));
  EXPECT_EQ(flood.accepted(), 50);
  EXPECT_EQ(flood.finished_with(grpc::StatusCode::RESOURCE_EXHAUSTED), 30);
  EXPECT_TRUE(absl::StrContains(flood.some_message(grpc::StatusCode::RESOURCE_EXHAUSTED),
                                "--max_watch_streams = 50"));
  flood.CancelAll(absl::Seconds(30));
  // Freed slots are reused. The server frees a slot when its reactor is done, which can come
  // after the client has seen the cancellation: a refused stream is retried within a deadline.
  bool reused = false;
  const absl::Time reuse_deadline = absl::Now() + absl::Seconds(10);
  while (!reused && absl::Now() < reuse_deadline) {
    WatchFlood again;
    again.Start({watches.front()}, Channels(cluster->coordinator_address(), 1));
    again.Settle(absl::Seconds(10));
    reused = again.accepted() == 1;
    again.CancelAll(absl::Seconds(10));
    if (!reused) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(reused) << "a slot freed by cancelled streams was not reused within 10 s";
  for (auto& s : held.sessions) (void)s->Release();
  held.fake.reset();
  EXPECT_TRUE(cluster->Stop().ok()) << "logs in " << cluster->log_dir();
}

// Upload streams that never send a message, on one completion queue.
class UploadFlood {
 public:
  void Start(int n, const std::vector<std::shared_ptr<grpc::Channel>>& channels) {
    for (int i = 0; i < n; ++i) {
      auto s = std::make_unique<Stream>();
      s->stub = v1::Worker::NewStub(channels[i % channels.size()]);
      s->writer = s->stub->PrepareAsyncUpload(&s->ctx, &s->response, &cq_);
      s->writer->StartCall(reinterpret_cast<void*>(streams_.size() * 2 + 2));
      streams_.push_back(std::move(s));
    }
  }
  // Pumps until `done` streams finished or `timeout`.
  void PumpUntil(int done, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (finished() < done) {
      void* tag = nullptr;
      bool ok = false;
      if (cq_.AsyncNext(&tag, &ok, absl::ToChronoTime(deadline)) !=
          grpc::CompletionQueue::GOT_EVENT) {
        break;
      }
      const size_t v = reinterpret_cast<size_t>(tag) - 2;
      Stream& s = *streams_[v / 2];
      if (v % 2 == 0) {
        s.writer->Finish(&s.status, reinterpret_cast<void*>(v + 1 + 2));
      } else {
        s.done = true;
      }
    }
  }
  int finished() const {
    int n = 0;
    for (const auto& s : streams_) n += s->done;
    return n;
  }
  int finished_with(grpc::StatusCode code) const {
    int n = 0;
    for (const auto& s : streams_) n += s->done && s->status.error_code() == code;
    return n;
  }
  ~UploadFlood() {
    for (auto& s : streams_) s->ctx.TryCancel();
    PumpUntil(static_cast<int>(streams_.size()), absl::Seconds(10));
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }

 private:
  struct Stream {
    std::unique_ptr<v1::Worker::Stub> stub;
    grpc::ClientContext ctx;
    v1::UploadResponse response;
    std::unique_ptr<grpc::ClientAsyncWriter<v1::UploadRequest>> writer;
    grpc::Status status;
    bool done = false;
  };
  grpc::CompletionQueue cq_;
  std::vector<std::unique_ptr<Stream>> streams_;
};

TEST(FloodTest, AbandonedUploadStreamsAreCappedAndTimedOut) {
  auto cluster = StartCluster(1, {}, {"--max_data_streams=64", "--stream_idle_timeout_s=2"});
  ASSERT_NE(cluster, nullptr);
  const pid_t pid = cluster->worker_process(0)->pid();
  const int threads_before = ProcThreads(pid);
  const std::string worker = cluster->workers()[0].address;
  UploadFlood flood;
  flood.Start(2000, Channels(worker, 8));
  // The refused ones finish at once; the admitted 64 sit until their idle timeout.
  flood.PumpUntil(2000 - 64, absl::Seconds(30));
  const int threads_flooded = ProcThreads(pid);
  // Another client's call is answered promptly meanwhile.
  v1::GenerateInputsRequest gen;
  gen.set_session_id("no-such-session");
  v1::GenerateInputsResponse resp;
  const absl::Time t0 = absl::Now();
  const grpc::Status other = WorkerStub(worker)->GenerateInputs(Ctx().get(), gen, &resp);
  const double other_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
  std::printf("worker threads: %d before, %d with 2000 Upload streams opened (%d refused); "
              "another call %.1f ms\n",
              threads_before, threads_flooded,
              flood.finished_with(grpc::StatusCode::RESOURCE_EXHAUSTED), other_ms);
  EXPECT_EQ(other.error_code(), grpc::StatusCode::NOT_FOUND) << other.error_message();
  EXPECT_LT(other_ms, 500);
  EXPECT_EQ(flood.finished_with(grpc::StatusCode::RESOURCE_EXHAUSTED), 2000 - 64);
  EXPECT_LT(threads_flooded, threads_before + 64) << "Upload streams cost threads";
  // The 64 idle ones are cancelled after ~2 s, and uploads work again.
  flood.PumpUntil(2000, absl::Seconds(15));
  EXPECT_EQ(flood.finished(), 2000);
  EXPECT_EQ(flood.finished_with(grpc::StatusCode::CANCELLED), 64);
  auto c = client::Client::Connect(cluster->client_options());
  ASSERT_TRUE(c.ok());
  client::SessionOptions so;
  so.spec = SmallSpec(64);
  so.num_workers = 1;
  auto session = (*c)->CreateSession(so);
  ASSERT_TRUE(session.ok()) << session.status();
  auto q = client::MakeTensor(so.spec, v1::TENSOR_Q);
  ASSERT_TRUE(q.ok());
  client::TransferOptions to;
  to.path = client::TransferPath::kGrpc;
  auto up = (*session)->Upload(v1::TENSOR_Q, *q, to);
  EXPECT_TRUE(up.ok()) << up.status();
  EXPECT_TRUE(cluster->worker_process(0)->Running());
  EXPECT_TRUE(cluster->Stop().ok()) << "logs in " << cluster->log_dir();
}

// Unary calls take a thread each while they run; beyond --max_rpc_threads the worker answers
// RESOURCE_EXHAUSTED instead of starting more (here 60 concurrent GenerateInputs on one session,
// which serialize on it).
TEST(FloodTest, ConcurrentUnaryCallsBeyondTheThreadCapAreRefused) {
  auto cluster = StartCluster(1, {}, {"--max_rpc_threads=8"});
  ASSERT_NE(cluster, nullptr);
  auto c = client::Client::Connect(cluster->client_options());
  ASSERT_TRUE(c.ok());
  client::SessionOptions so;
  so.spec = SmallSpec(16384);
  so.spec.set_q_heads(4);
  so.spec.set_kv_heads(4);
  so.spec.set_head_dim(64);
  so.num_workers = 1;
  auto session = (*c)->CreateSession(so);
  ASSERT_TRUE(session.ok()) << session.status();
  const pid_t pid = cluster->worker_process(0)->pid();
  const int threads_before = ProcThreads(pid);
  auto stub = WorkerStub((*session)->info().shards(0).address());
  grpc::CompletionQueue cq;
  struct Call {
    grpc::ClientContext ctx;
    v1::GenerateInputsResponse resp;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::GenerateInputsResponse>> reader;
  };
  std::vector<std::unique_ptr<Call>> calls;
  v1::GenerateInputsRequest gen;
  gen.set_session_id((*session)->id());
  gen.set_client_id((*c)->client_id());
  gen.set_with_grad_output(true);
  for (int i = 0; i < 60; ++i) {
    auto call = std::make_unique<Call>();
    call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
    AttachCapability(&call->ctx, (*session)->capability());
    call->reader = stub->AsyncGenerateInputs(&call->ctx, gen, &cq);
    call->reader->Finish(&call->resp, &call->status, call.get());
    calls.push_back(std::move(call));
  }
  int peak = 0, ok = 0, refused = 0;
  for (size_t done = 0; done < calls.size(); ++done) {
    void* tag;
    bool got;
    ASSERT_TRUE(cq.Next(&tag, &got));
    peak = std::max(peak, ProcThreads(pid));
    const grpc::Status& s = static_cast<Call*>(tag)->status;
    ok += s.ok();
    refused += s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
  }
  std::printf("worker threads: %d before, at most %d during 60 concurrent calls (%d served, %d "
              "refused)\n", threads_before, peak, ok, refused);
  EXPECT_GT(refused, 0);
  EXPECT_GT(ok, 0);
  EXPECT_EQ(ok + refused, 60);
  EXPECT_LT(peak, threads_before + 16);
  EXPECT_TRUE(cluster->worker_process(0)->Running());
  EXPECT_TRUE(cluster->Stop().ok()) << "logs in " << cluster->log_dir();
}

}  // namespace
}  // namespace dfa::testing
