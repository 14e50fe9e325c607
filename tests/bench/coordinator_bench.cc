// dfa-coordinator-bench: the control plane's own cost, without tensors. A CoordinatorServer on
// loopback and P fake workers (RunJob returns at once) measure, over many repetitions:
//   CreateSession + ReleaseSession round trip (validation, plan + CheckPlan, OpenSession on P
//   workers, CloseSession), and SubmitJob -> final state through WatchJob (queue, P concurrent
//   RunJob calls, completion). Prints medians and 90th percentiles in milliseconds.
// Usage: dfa-coordinator-bench [reps=200] [seq_len=16384]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "coordinator/coordinator_server.h"
#include "core/session_capability.h"
#include "tests/coordinator/service/fake_worker.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace {

using dfa::v1::Coordinator;

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}

// `capability`: the session's, for calls about it.
std::unique_ptr<grpc::ClientContext> Ctx(const std::string& capability = "") {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  dfa::AttachCapability(ctx.get(), capability);
  return ctx;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 200;
  const int64_t seq_len = argc > 2 ? std::atoll(argv[2]) : 16384;
  dfa::CoordinatorOptions options;
  options.listen = "127.0.0.1:0";
  dfa::CoordinatorServer server(options);
  if (!server.Start().ok()) return 1;
  auto stub = Coordinator::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  std::vector<std::unique_ptr<dfa::testing::FakeWorker>> workers;
  std::printf("dfa-coordinator-bench: %d reps, seq_len %lld, fake workers (no tensors)\n", reps,
              static_cast<long long>(seq_len));
  std::printf("%4s %-10s %14s %14s %14s %14s\n", "P", "schedule", "session p50", "session p90",
              "job p50", "job p90");
  for (int p : {1, 2, 4, 8, 16}) {
    while (static_cast<int>(workers.size()) < p) {
      dfa::testing::FakeWorkerOptions o;
      o.id = "bench" + std::to_string(workers.size());
      o.run_time = absl::ZeroDuration();
      workers.push_back(std::make_unique<dfa::testing::FakeWorker>(o));
      workers.back()->Start(server.address());
    }
    std::vector<double> session_ms, job_ms;
    for (int i = 0; i < reps; ++i) {
      dfa::v1::CreateSessionRequest req;
      auto* spec = req.mutable_spec();
      spec->set_batch(1);
      spec->set_q_heads(8);
      spec->set_kv_heads(8);
      spec->set_head_dim(64);
      spec->set_seq_len(seq_len);
      spec->set_causal(true);
      spec->set_dtype(dfa::v1::DTYPE_BF16);
      req.set_num_workers(p);
      req.set_client_id("bench");
      dfa::v1::CreateSessionResponse session;
      absl::Time t0 = absl::Now();
      if (!stub->CreateSession(Ctx().get(), req, &session).ok()) return 1;
      const absl::Time t1 = absl::Now();

      dfa::v1::SubmitJobRequest submit;
      submit.set_session_id(session.session_id());
      submit.set_client_id("bench");
      submit.set_kind(dfa::v1::JOB_FORWARD);
      dfa::v1::Job job;
      const std::string& capability = session.session_capability();
      if (!stub->SubmitJob(Ctx(capability).get(), submit, &job).ok()) return 1;
      dfa::v1::GetJobRequest watch;
      watch.set_job_id(job.job_id());
      watch.set_client_id("bench");
      auto ctx = Ctx(capability);
      auto reader = stub->WatchJob(ctx.get(), watch);
      while (reader->Read(&job)) {
      }
      if (!reader->Finish().ok() || job.state() != dfa::v1::JOB_SUCCEEDED) return 1;
      const absl::Time t2 = absl::Now();

      dfa::v1::ReleaseSessionRequest release;
      release.set_session_id(session.session_id());
      release.set_client_id("bench");
      dfa::v1::ReleaseSessionResponse released;
      if (!stub->ReleaseSession(Ctx(capability).get(), release, &released).ok()) return 1;
      const absl::Time t3 = absl::Now();
      session_ms.push_back(absl::ToDoubleMilliseconds((t1 - t0) + (t3 - t2)));
      job_ms.push_back(absl::ToDoubleMilliseconds(t2 - t1));
    }
    std::printf("%4d %-10s %14.3f %14.3f %14.3f %14.3f\n", p, "balanced",
                Percentile(session_ms, 0.5), Percentile(session_ms, 0.9), Percentile(job_ms, 0.5),
                Percentile(job_ms, 0.9));
  }
  workers.clear();
  server.Shutdown();
  return 0;
}
