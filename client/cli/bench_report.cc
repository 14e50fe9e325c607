#include "client/cli/bench_report.h"

#include <algorithm>
#include <limits>

#include "client/cli/json_writer.h"

namespace dfa::cli {
namespace {

std::string RateJson(const BenchTransferLine& l, double memcpy_gbps) {
  return JsonObject()
      .Str("label", l.label)
      .Str("direction", l.direction)
      .Str("path", l.path)
      .Bool("all_workers", l.all_workers)
      .Num("best_gbps", l.rate.best_gbps)
      .Num("percent_of_memcpy", memcpy_gbps > 0 ? 100 * l.rate.best_gbps / memcpy_gbps : 0)
      .Num("client_cpu_seconds_per_gb", l.rate.client_cpu_per_gb)
      .Num("worker_cpu_seconds_per_gb", l.rate.worker_cpu_per_gb)
      .Int("bytes", l.rate.bytes)
      .Int("pieces", l.rate.pieces)
      .str();
}

std::string TransfersJson(const BenchTransfers& t) {
  std::vector<std::string> lines;
  for (const BenchTransferLine& l : t.lines) lines.push_back(RateJson(l, t.memcpy_gbps));
  return JsonObject()
      .Int("tensor_mib", t.tensor_mib)
      .Int("tensor_bytes", t.tensor_bytes)
      .Int("repeats", t.repeats)
      .Str("schedule", t.schedule)
      .Bool("workers_measured", t.workers_measured)
      .Num("memcpy_gbps", t.memcpy_gbps)
      .Raw("lines", JsonArray(lines))
      .Bool("round_trip_exact", t.round_trip_exact)
      .str();
}

// The keys of `dfa status --job ID --json`, and the text report's derived figures.
std::string JobJson(const v1::Job& job) {
  std::vector<std::string> workers;
  for (const auto& w : job.workers()) {
    const double total = w.busy_seconds() + w.idle_seconds();
    workers.push_back(JsonObject()
                          .Int("rank", w.rank())
                          .Num("busy_seconds", w.busy_seconds())
                          .Num("idle_seconds", w.idle_seconds())
                          .Num("idle_fraction", total > 0 ? w.idle_seconds() / total : 0)
                          .Int("bytes_sent", w.bytes_sent())
                          .Int("bytes_received", w.bytes_received())
                          .Int("kernel_launches", w.kernel_launches())
                          .str());
  }
  const double secs = job.wall_seconds();
  return JsonObject()
      .Str("job_id", job.job_id())
      .Str("session_id", job.session_id())
      .Str("kind", v1::JobKind_Name(job.kind()))
      .Str("state", v1::JobState_Name(job.state()))
      .Int("steps_done", job.steps_done())
      .Int("steps_total", job.steps_total())
      .Num("wall_seconds", secs)
      .Num("flops", job.flops())
      .Num("flops_per_second", secs > 0 ? job.flops() / secs : 0)
      .Num("seconds_outside_workers", SecondsOutsideWorkers(job))
      .Raw("workers", JsonArray(workers))
      .str();
}

std::string SpecJson(const v1::AttentionSpec& s) {
  return JsonObject()
      .Int("batch", s.batch())
      .Int("seq_len", s.seq_len())
      .Int("q_heads", s.q_heads())
      .Int("kv_heads", s.kv_heads())
      .Int("head_dim", s.head_dim())
      .Str("dtype", v1::DType_Name(s.dtype()))
      .Bool("causal", s.causal())
      .str();
}

std::string SingleJson(const BenchSingle& s) {
  return JsonObject()
      .Int("threads", s.threads)
      .Num("forward_seconds", s.forward_seconds)
      .Num("forward_flops_per_second", s.forward_flops_per_second)
      .Num("backward_seconds", s.backward_seconds)
      .Num("backward_flops_per_second", s.backward_flops_per_second)
      .str();
}

std::string AttentionJson(const BenchAttention& a) {
  std::vector<std::string> jobs;
  for (const v1::Job& j : a.jobs) jobs.push_back(JobJson(j));
  JsonObject o;
  o.Raw("spec", SpecJson(a.spec))
      .Str("description", a.description)
      .Int("workers", a.workers)
      .Str("schedule", a.schedule)
      .Int("repeat", a.repeat)
      .Bool("backward", a.backward)
      .Raw("jobs", JsonArray(jobs))
      .Num("best_forward_flops_per_second", a.best_forward_flops_per_second)
      .Num("best_backward_flops_per_second", a.best_backward_flops_per_second);
  if (a.single) {
    const BenchSingle& s = *a.single;
    o.Raw("single_process", SingleJson(s))
        .Num("forward_ratio", s.forward_flops_per_second > 0
                                  ? a.best_forward_flops_per_second / s.forward_flops_per_second
                                  : 0)
        .Num("backward_ratio", a.backward && s.backward_flops_per_second > 0
                                   ? a.best_backward_flops_per_second / s.backward_flops_per_second
                                   : std::numeric_limits<double>::quiet_NaN());  // null
  } else {
    o.Raw("single_process", "null").Raw("forward_ratio", "null").Raw("backward_ratio", "null");
  }
  return o.str();
}

}  // namespace

double SecondsOutsideWorkers(const v1::Job& job) {
  if (job.workers_size() == 0) return 0;
  double longest = 0;
  for (const auto& w : job.workers()) {
    longest = std::max(longest, w.busy_seconds() + w.idle_seconds());
  }
  return std::max(0.0, job.wall_seconds() - longest);
}

std::string BenchReportJson(const BenchReport& r) {
  JsonObject o;
  o.Str("coordinator", r.coordinator);
  if (r.local_cluster) {
    o.Raw("local_cluster", JsonObject()
                               .Int("workers", r.local_workers)
                               .Str("backend", r.local_backend)
                               .Int("threads_per_worker", r.local_threads)
                               .str());
  } else {
    o.Raw("local_cluster", "null");
  }
  o.Raw("transfers", r.transfers ? TransfersJson(*r.transfers) : std::string("null"));
  o.Raw("attention", r.attention ? AttentionJson(*r.attention) : std::string("null"));
  return o.str();
}

}  // namespace dfa::cli
