#include "client/cli/training_run.h"

#include <algorithm>
#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/attention_job.h"
#include "client/cli/cluster_hold.h"
#include "client/cli/host_memory.h"
#include "client/cli/progress.h"
#include "client/verify.h"

namespace dfa::cli {

void PrintJobReport(const char* label, const v1::Job& job) {
  const double secs = job.wall_seconds();
  // Outside the workers: the job's wall time (coordinator) less the longest worker's own time
  // (busy + idle): RunJob fan-out, replies, scheduling. What dominates very short jobs.
  double longest = 0;
  for (const auto& w : job.workers()) longest = std::max(longest, w.busy_seconds() + w.idle_seconds());
  std::printf("%-9s %.4f s  %.2f GFLOP  %.2f GFLOP/s  (%d steps, %.2f ms outside the workers)\n",
              label, secs, job.flops() / 1e9, secs > 0 ? job.flops() / secs / 1e9 : 0.0,
              job.steps_total(), job.workers_size() > 0 ? std::max(0.0, secs - longest) * 1e3 : 0.0);
  for (const auto& w : job.workers()) {
    const double total = w.busy_seconds() + w.idle_seconds();
    std::printf("          worker %d: busy %.4f s  idle %.4f s  idle %.1f%%  sent %.1f MiB  "
                "received %.1f MiB  kernels %lld\n",
                w.rank(), w.busy_seconds(), w.idle_seconds(),
                total > 0 ? 100.0 * w.idle_seconds() / total : 0.0, w.bytes_sent() / 1048576.0,
                w.bytes_received() / 1048576.0, static_cast<long long>(w.kernel_launches()));
  }
}

absl::Status RunTrainingJob(client::Client* client, const TrainingRunOptions& options) {
  const v1::AttentionSpec& spec = options.job.session.spec;
  RETURN_IF_ERROR(client::ValidateSpec(spec));
  // Sizes this host cannot hold are refused here, naming the flags, before any allocation.
  RETURN_IF_ERROR(CheckTrainingRunMemory(spec, options.backward, options.verify));
  ASSIGN_OR_RETURN(client::HostTensor q, client::MakeTensor(spec, v1::TENSOR_Q));
  ASSIGN_OR_RETURN(client::HostTensor k, client::MakeTensor(spec, v1::TENSOR_K));
  ASSIGN_OR_RETURN(client::HostTensor v, client::MakeTensor(spec, v1::TENSOR_V));
  client::HostTensor dout;
  if (options.backward) {
    ASSIGN_OR_RETURN(dout, client::MakeTensor(spec, v1::TENSOR_DO));
  }
  const uint64_t seed = options.job.seed;
  client::FillRandom(seed * 4 + 0, &q);
  client::FillRandom(seed * 4 + 1, &k);
  client::FillRandom(seed * 4 + 2, &v);
  if (options.backward) client::FillRandom(seed * 4 + 3, &dout);

  // On Ctrl-C: the job running is cancelled and the session released (Interrupts).
  ClusterHold hold(client);
  client::AttentionJobOptions jo;
  jo.session = options.job.session;
  jo.transfer.path = options.path;
  jo.max_retries = options.max_retries;
  // One progress bar at a time on this thread (each transfer, then the job's steps, which a
  // streaming job would not report): the inputs go up before the job.
  jo.stream_inputs = false;
  std::unique_ptr<Progress> steps;
  std::unique_ptr<Progress> bytes;  // the transfer in flight (they run one tensor at a time)
  // Set below, once the job exists; the callbacks run on this thread while it does.
  client::AttentionJob* attention = nullptr;
  jo.on_transfer = [&](v1::TensorKind kind, int64_t total, bool upload) {
    if (attention != nullptr) hold.SetSession(attention->session());
    bytes.reset();  // finishes the previous bar
    steps.reset();
    bytes = std::make_unique<Progress>(
        (upload ? "upload " : "download ") + client::TensorKindName(kind), total, "B");
  };
  jo.transfer.progress = [&bytes](int64_t n) {
    if (bytes) bytes->Add(n);
  };
  // One bar at a time, in the order things happen: each transfer, then the job's steps.
  jo.observer = [&steps, &bytes, &hold](const v1::Job& j) {
    hold.SetJob(j.state() == v1::JOB_QUEUED || j.state() == v1::JOB_RUNNING ? j.job_id() : "");
    bytes.reset();
    if (!steps) {
      steps = std::make_unique<Progress>(
          j.kind() == v1::JOB_BACKWARD ? "backward job" : "forward job", j.steps_total(), "steps");
    }
    steps->SetTotal(j.steps_total());
    steps->Set(j.steps_done());
  };
  jo.on_retry = [](const absl::Status& s) {
    std::printf("retrying on the remaining workers after: %s\n", std::string(s.message()).c_str());
  };
  client::AttentionJob job(client, jo);
  attention = &job;

  std::printf("job: %s, schedule %s\n", DescribeSpec(spec).c_str(),
              options.job.session.schedule.c_str());
  // Forward: a progress line over the whole upload+compute+download.
  v1::Job fwd_job;
  auto fwd = job.Forward(q, k, v, &fwd_job);
  bytes.reset();
  steps.reset();
  RETURN_IF_ERROR(fwd.status());
  std::printf("session %s on %d workers\n", job.session()->id().c_str(),
              job.session()->num_workers());
  PrintJobReport("forward", fwd_job);

  client::BackwardOutputs grads;
  v1::Job bwd_job;
  if (options.backward) {
    auto bwd = job.Backward(dout, &bwd_job);
    bytes.reset();
    steps.reset();
    RETURN_IF_ERROR(bwd.status());
    grads = std::move(*bwd);
    PrintJobReport("backward", bwd_job);
    const double secs = fwd_job.wall_seconds() + bwd_job.wall_seconds();
    std::printf("fwd+bwd   %.3f s  %.2f GFLOP/s\n", secs,
                secs > 0 ? (fwd_job.flops() + bwd_job.flops()) / secs / 1e9 : 0.0);
  }
  hold.SetSession(nullptr);
  (void)job.Release();
  if (!options.verify) return absl::OkStatus();

  std::printf("verify against single-device attention (CPU backend, fp32):\n");
  const absl::Time t0 = absl::Now();
  ASSIGN_OR_RETURN(client::ReferenceResult ref,
                   client::ComputeReference(spec, q, k, v, options.backward ? &dout : nullptr,
                                            options.reference_threads));
  std::vector<client::Comparison> checks;
  checks.push_back(client::Compare("O", fwd->o, ref.o));
  checks.push_back(client::Compare("LSE", fwd->lse, ref.lse));
  if (options.backward) {
    checks.push_back(client::Compare("dQ", grads.dq, ref.dq));
    checks.push_back(client::Compare("dK", grads.dk, ref.dk));
    checks.push_back(client::Compare("dV", grads.dv, ref.dv));
  }
  bool ok = true;
  for (const auto& c : checks) {
    std::printf("  %s\n", c.ToString().c_str());
    ok = ok && c.ok;
  }
  std::printf("  (reference took %.2f s)\n", absl::ToDoubleSeconds(absl::Now() - t0));
  if (!ok) return absl::DataLossError("results disagree with the single-device reference");
  return absl::OkStatus();
}

}  // namespace dfa::cli
