// `dfa bench`: data-plane rates (gRPC stream and shared memory, beside this machine's memcpy
// rate) and attention throughput of the service on seeded synthetic resident inputs against the
// single-process CPU kernel on the same problem (the service's overhead). As text while it runs,
// or with --json as one JSON document at the end (bench_report.h).
#include <sys/resource.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cli/bench_report.h"
#include "client/cli/cluster_hold.h"
#include "client/cli/commands.h"
#include "client/cli/host_memory.h"
#include "client/cli/interrupt.h"
#include "client/cli/job_flags.h"
#include "client/cli/offload_bench.h"
#include "client/cli/training_run.h"
#include "client/local_cluster.h"
#include "client/verify.h"
#include "kernels/attention_backend.h"

namespace dfa::cli {
namespace {

double GBps(int64_t bytes, double secs) { return secs > 0 ? bytes / secs / 1e9 : 0; }

// CPU seconds (user + system) this process has used.
double SelfCpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// CPU seconds of processes `pids` (from /proc/<pid>/stat; 0 for any that cannot be read).
double ProcessCpuSeconds(const std::vector<pid_t>& pids) {
  static const double kTick = static_cast<double>(sysconf(_SC_CLK_TCK));
  double total = 0;
  for (pid_t pid : pids) {
    std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
    std::string line;
    if (!std::getline(f, line)) continue;
    // Fields after "(comm)": state is the 3rd field; utime and stime the 14th and 15th.
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    std::string field;
    double utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i == 14) utime = std::atof(field.c_str());
      if (i == 15) stime = std::atof(field.c_str());
    }
    total += (utime + stime) / kTick;
  }
  return total;
}

using Rate = BenchRate;

// The text output, silent under --json (stdout then carries the JSON document alone).
class TextOut {
 public:
  explicit TextOut(bool quiet) : quiet_(quiet) {}
  void operator()(const char* format, ...) const __attribute__((format(printf, 2, 3))) {
    if (quiet_) return;
    va_list args;
    va_start(args, format);
    std::vprintf(format, args);
    va_end(args);
  }
  bool quiet() const { return quiet_; }

 private:
  const bool quiet_;
};

// Best of `repeats` runs of fn, and the mean CPU seconds per GB of this process and `workers`.
absl::StatusOr<Rate> Measure(int repeats, const std::vector<pid_t>& workers,
                             const std::function<absl::StatusOr<client::TransferStats>()>& fn) {
  Rate r;
  double client_cpu = 0, worker_cpu = 0, gb = 0;
  for (int i = 0; i < repeats; ++i) {
    const double c0 = SelfCpuSeconds(), w0 = ProcessCpuSeconds(workers);
    ASSIGN_OR_RETURN(client::TransferStats s, fn());
    // s.seconds: the transfers themselves (Session::Download also allocates the tensor first).
    const double secs = s.seconds;
    client_cpu += SelfCpuSeconds() - c0;
    worker_cpu += ProcessCpuSeconds(workers) - w0;
    gb += s.bytes / 1e9;
    r.best_gbps = std::max(r.best_gbps, GBps(s.bytes, secs));
    r.bytes = s.bytes;
    r.pieces = s.chunks;
  }
  r.client_cpu_per_gb = gb > 0 ? client_cpu / gb : 0;
  r.worker_cpu_per_gb = gb > 0 ? worker_cpu / gb : 0;
  return r;
}

// Best of `repeats` single-threaded copies of a `bytes` buffer (bytes read = bytes written).
double MemcpyRate(int64_t bytes, int repeats) {
  std::vector<uint8_t> a(static_cast<size_t>(bytes), 1), b(static_cast<size_t>(bytes), 0);
  double best = 0;
  for (int i = 0; i < repeats; ++i) {
    const absl::Time t0 = absl::Now();
    std::memcpy(b.data(), a.data(), a.size());
    best = std::max(best, GBps(bytes, absl::ToDoubleSeconds(absl::Now() - t0)));
    a[static_cast<size_t>(i)] = b[static_cast<size_t>(i + 1)];  // keep the copies observable
  }
  return best;
}

// Data-plane rates: upload and download through gRPC and shared memory, one worker's shard and
// all workers in parallel, each line best of `repeats`, beside memcpy measured in this run.
// CPU s/GB counts this process (client) and, when their pids are known, the workers.
absl::Status RunTransfers(client::Client* c, int workers, const std::string& schedule,
                          int64_t mib, int repeats, const std::vector<pid_t>& worker_pids,
                          const TextOut& text, BenchTransfers* out) {
  text("\n== client data plane (%lld MiB per tensor; streams to workers in parallel) ==\n",
       static_cast<long long>(mib));
  out->tensor_mib = mib;
  out->repeats = repeats;
  out->workers_measured = !worker_pids.empty();
  // Rows of 8 KiB (32 heads x 128 x bf16) and 512-token ranges per worker and batch index, so
  // gRPC chunks are full-size (4 MiB); S small enough that the forward (needed before O can be
  // downloaded) stays cheap.
  client::SessionOptions so;
  v1::AttentionSpec& spec = so.spec;
  spec.set_batch(static_cast<int32_t>(std::max<int64_t>(1, mib / 16)));
  spec.set_seq_len(2048);
  spec.set_q_heads(32);
  spec.set_kv_heads(32);
  spec.set_head_dim(128);
  spec.set_dtype(v1::DTYPE_BF16);
  spec.set_causal(true);
  so.num_workers = workers;
  so.schedule = schedule;  // "heads": each worker's shard is a head slice of every row
  // Q, its two downloaded copies and the memcpy buffers: five tensors of `mib` MiB.
  RETURN_IF_ERROR(CheckHostMemory(absl::StrCat("--transfer-mib ", mib), 5.0 * mib * 1048576.0,
                                  "Q, two downloaded copies and two memcpy buffers",
                                  "use a smaller --transfer-mib or --skip-transfer"));
  ClusterHold hold(c);
  ASSIGN_OR_RETURN(auto session, c->CreateSession(so));
  hold.SetSession(session.get());
  out->schedule = session->info().plan().schedule();
  text("session schedule %s\n", out->schedule.c_str());
  ASSIGN_OR_RETURN(client::HostTensor q, client::MakeTensor(spec, v1::TENSOR_Q));
  client::FillRandom(11, &q);
  out->tensor_bytes = static_cast<int64_t>(q.bytes.size());
  // memcpy is measured before and after the transfers and the better figure kept: on a shared
  // machine it swings as much as the transfers do, and the higher one is the stricter yardstick.
  double memcpy_rate = MemcpyRate(static_cast<int64_t>(q.bytes.size()), repeats);
  const std::string n = absl::StrCat(workers);
  // direction "upload"/"download", path "grpc"/"shm", all: every worker (else rank 0 alone).
  auto report = [&](const char* direction, const char* path, bool all, const Rate& r) {
    BenchTransferLine line;
    line.direction = direction;
    line.path = path;
    line.all_workers = all;
    line.label = absl::StrCat(line.direction == "upload" ? "upload   " : "download ",
                              line.path == "grpc" ? "gRPC, " : "shared memory, ",
                              all ? n : std::string("1"), " ",
                              line.path == "grpc" ? (all ? "streams" : "stream")
                                                  : (all ? "workers" : "worker"));
    line.rate = r;
    out->lines.push_back(std::move(line));
  };
  client::TransferOptions grpc_path, shm_path;
  grpc_path.path = client::TransferPath::kGrpc;
  shm_path.path = client::TransferPath::kSharedMemory;
  // Rank 0's shard alone: one stream / one worker.
  client::WorkerDataClient& data = session->DataClient(0);
  const std::vector<v1::RowRange> owned(session->info().shards(0).owned().begin(),
                                        session->info().shards(0).owned().end());
  const int64_t shm_bytes = grpc_path.segment_bytes;
  ASSIGN_OR_RETURN(Rate r, Measure(repeats, worker_pids, [&] {
                     return data.UploadGrpc(v1::TENSOR_Q, q, owned, client::kDefaultChunkBytes, {});
                   }));
  report("upload", "grpc", false, r);
  ASSIGN_OR_RETURN(r, Measure(repeats, worker_pids,
                              [&] { return session->Upload(v1::TENSOR_Q, q, grpc_path); }));
  report("upload", "grpc", true, r);
  ASSIGN_OR_RETURN(r, Measure(repeats, worker_pids, [&] {
                     return data.UploadShm(v1::TENSOR_Q, q, owned, shm_bytes, {});
                   }));
  report("upload", "shm", false, r);
  ASSIGN_OR_RETURN(
      r, Measure(repeats, worker_pids, [&] { return session->Upload(v1::TENSOR_Q, q, shm_path); }));
  report("upload", "shm", true, r);
  // Downloads of Q (what was uploaded: the round trip must be exact) through both paths.
  ASSIGN_OR_RETURN(client::HostTensor q1, client::MakeTensor(spec, v1::TENSOR_Q));
  client::HostTensor q2 = q1;
  ASSIGN_OR_RETURN(r, Measure(repeats, worker_pids, [&] {
                     return data.DownloadGrpc(v1::TENSOR_Q, owned, client::kDefaultChunkBytes, &q1,
                                              {});
                   }));
  report("download", "grpc", false, r);
  ASSIGN_OR_RETURN(r, Measure(repeats, worker_pids,
                              [&] { return session->Download(v1::TENSOR_Q, &q1, grpc_path); }));
  report("download", "grpc", true, r);
  ASSIGN_OR_RETURN(r, Measure(repeats, worker_pids, [&] {
                     return data.DownloadShm(v1::TENSOR_Q, owned, shm_bytes, &q2, {});
                   }));
  report("download", "shm", false, r);
  ASSIGN_OR_RETURN(r, Measure(repeats, worker_pids,
                              [&] { return session->Download(v1::TENSOR_Q, &q2, shm_path); }));
  report("download", "shm", true, r);
  memcpy_rate = std::max(memcpy_rate, MemcpyRate(static_cast<int64_t>(q.bytes.size()), repeats));
  out->memcpy_gbps = memcpy_rate;
  text("best of %d per line; CPU s/GB: mean over the runs, this process (client) + %s\n",
       repeats, worker_pids.empty() ? "(workers not measured)" : "the worker processes");
  text("%-34s %6.2f GB/s  (best before and after the transfers)\n",
       "memcpy, 1 thread (this machine)", memcpy_rate);
  for (const BenchTransferLine& line : out->lines) {
    const Rate& r = line.rate;
    text("%-34s %6.2f GB/s  (%3.0f%% of memcpy)  CPU s/GB client %.2f + workers %.2f"
         "  (%.1f MiB, %lld pieces)\n",
         line.label.c_str(), r.best_gbps, 100 * r.best_gbps / memcpy_rate, r.client_cpu_per_gb,
         r.worker_cpu_per_gb, r.bytes / 1048576.0, static_cast<long long>(r.pieces));
  }
  if (q1.bytes != q.bytes || q2.bytes != q.bytes) {
    return absl::DataLossError(absl::StrCat("bench: Q downloaded through ",
                                            q1.bytes != q.bytes ? "gRPC" : "shared memory",
                                            " differs from the Q uploaded"));
  }
  out->round_trip_exact = true;
  text("round trip (upload, download) exact on both paths\n");
  hold.SetSession(nullptr);
  return session->Release();
}

absl::Status RunAttention(client::Client* c, const JobFlags& flags, bool backward, int repeat,
                          bool single, int single_threads, const TextOut& text,
                          BenchAttention* out) {
  const v1::AttentionSpec& spec = flags.session.spec;
  out->spec = spec;
  out->description = DescribeSpec(spec);
  out->repeat = repeat;
  out->backward = backward;
  text("\n== attention: %s, seeded synthetic inputs resident on the workers ==\n",
       DescribeSpec(spec).c_str());
  if (single) {
    // The single-process run: Q, K, V, dO in the spec's dtype, O, dQ, dK, dV and LSE, D in fp32.
    RETURN_IF_ERROR(CheckHostMemory(
        absl::StrCat("the single-process run of ", DescribeSpec(spec)),
        TrainingRunBytes(spec, backward, true), "inputs, fp32 outputs and gradients",
        "use a smaller --seq, --batch, --heads or --head-dim, or --skip-single"));
  }
  ClusterHold hold(c);
  ASSIGN_OR_RETURN(auto session, c->CreateSession(flags.session));
  hold.SetSession(session.get());
  out->workers = session->num_workers();
  out->schedule = session->info().plan().schedule();
  text("session on %d workers, schedule %s\n", out->workers, out->schedule.c_str());
  RETURN_IF_ERROR(session->GenerateInputs(flags.seed, backward));
  double best_fwd = 0, best_bwd = 0;
  const client::JobObserver track = [&hold](const v1::Job& j) {
    hold.SetJob(j.state() == v1::JOB_QUEUED || j.state() == v1::JOB_RUNNING ? j.job_id() : "");
  };
  for (int r = 0; r < repeat; ++r) {
    // A backward leaves dQ, dK, dV where Q, K, V were (worker memory): inputs again first.
    if (r > 0 && backward) RETURN_IF_ERROR(session->GenerateInputs(flags.seed, backward));
    ASSIGN_OR_RETURN(v1::Job f, session->Run(v1::JOB_FORWARD, track));
    if (!text.quiet()) PrintJobReport("forward", f);
    best_fwd = std::max(best_fwd, f.flops() / std::max(1e-9, f.wall_seconds()));
    out->jobs.push_back(std::move(f));
    if (backward) {
      ASSIGN_OR_RETURN(v1::Job b, session->Run(v1::JOB_BACKWARD, track));
      if (!text.quiet()) PrintJobReport("backward", b);
      best_bwd = std::max(best_bwd, b.flops() / std::max(1e-9, b.wall_seconds()));
      out->jobs.push_back(std::move(b));
    }
  }
  out->best_forward_flops_per_second = best_fwd;
  out->best_backward_flops_per_second = backward ? best_bwd : 0;
  hold.SetSession(nullptr);
  (void)session->Release();
  if (!single) return absl::OkStatus();

  text("\n== single process, CPU kernel, %d threads, same problem ==\n", single_threads);
  BenchSingle& one = out->single.emplace();
  one.threads = single_threads;
  ASSIGN_OR_RETURN(client::HostTensor q, client::MakeTensor(spec, v1::TENSOR_Q));
  ASSIGN_OR_RETURN(client::HostTensor k, client::MakeTensor(spec, v1::TENSOR_K));
  ASSIGN_OR_RETURN(client::HostTensor v, client::MakeTensor(spec, v1::TENSOR_V));
  ASSIGN_OR_RETURN(client::HostTensor dout, client::MakeTensor(spec, v1::TENSOR_DO));
  client::FillRandom(1, &q);
  client::FillRandom(2, &k);
  client::FillRandom(3, &v);
  client::FillRandom(4, &dout);
  BackendOptions bo;
  bo.num_threads = single_threads;
  ASSIGN_OR_RETURN(auto backend, CreateBackend("cpu", bo));
  ASSIGN_OR_RETURN(client::HostTensor lse, client::MakeTensor(spec, v1::TENSOR_LSE));
  client::HostTensor o = q;
  o.dtype = DType::kF32;
  o.bytes.assign(static_cast<size_t>(o.size_bytes()), 0);
  const client::HostMask host_mask(spec);  // documents and window: interval arrays
  const MaskKind mask = host_mask.kind;
  ForwardArgs fa;
  fa.scale = client::EffectiveScale(spec);
  fa.mask = mask;
  fa.intervals = host_mask.intervals();
  fa.q = q.View();
  fa.k = k.View();
  fa.v = v.View();
  fa.out = o.View();
  fa.lse = lse.StatView();
  const double fwd_flops = client::ForwardFlops(spec);
  absl::Time t0 = absl::Now();
  RETURN_IF_ERROR(backend->Forward(fa));
  const double fwd_s = absl::ToDoubleSeconds(absl::Now() - t0);
  const double single_fwd = fwd_flops / fwd_s;
  one.forward_seconds = fwd_s;
  one.forward_flops_per_second = single_fwd;
  text("forward   %.3f s  %.2f GFLOP/s\n", fwd_s, single_fwd / 1e9);
  double single_bwd = 0;
  if (backward) {
    client::HostTensor delta = lse, dq = o, dk = k, dv = v;
    dk.dtype = dv.dtype = DType::kF32;
    dq.bytes.assign(dq.bytes.size(), 0);
    dk.bytes.assign(static_cast<size_t>(dk.size_bytes()), 0);
    dv.bytes.assign(static_cast<size_t>(dv.size_bytes()), 0);
    BackwardArgs ba;
    ba.scale = fa.scale;
    ba.mask = mask;
    ba.intervals = fa.intervals;
    ba.q = q.View();
    ba.k = k.View();
    ba.v = v.View();
    ba.dout = dout.View();
    ba.lse = lse.StatView();
    ba.delta = delta.StatView();
    ba.dq = dq.View();
    ba.dk = dk.View();
    ba.dv = dv.View();
    t0 = absl::Now();
    RETURN_IF_ERROR(backend->ComputeDelta(dout.View(), o.View(), delta.StatView(), nullptr));
    RETURN_IF_ERROR(backend->Backward(ba));
    const double bwd_s = absl::ToDoubleSeconds(absl::Now() - t0);
    single_bwd = 2.5 * fwd_flops / bwd_s;
    one.backward_seconds = bwd_s;
    one.backward_flops_per_second = single_bwd;
    text("backward  %.3f s  %.2f GFLOP/s\n", bwd_s, single_bwd / 1e9);
  }
  text("\n== service vs single process (best of %d) ==\n", repeat);
  text("forward   service %.2f GFLOP/s  single %.2f GFLOP/s  ratio %.1f%%\n", best_fwd / 1e9,
       single_fwd / 1e9, 100 * best_fwd / single_fwd);
  if (backward) {
    text("backward  service %.2f GFLOP/s  single %.2f GFLOP/s  ratio %.1f%%\n", best_bwd / 1e9,
         single_bwd / 1e9, 100 * best_bwd / single_bwd);
  }
  return absl::OkStatus();
}

absl::Status Bench(Args& args) {
  if (args.Has("offload")) return RunOffloadBench(args);  // its own flags: cli/offload_bench.h
  ASSIGN_OR_RETURN(std::string coordinator, args.GetString("coordinator", ""));
  ASSIGN_OR_RETURN(JobFlags flags, ParseJobFlags(args, 16384, 2));
  ASSIGN_OR_RETURN(int64_t threads, args.GetInt("threads", 1, 0, 1024));
  ASSIGN_OR_RETURN(std::string backend, args.GetString("backend", "cpu"));
  ASSIGN_OR_RETURN(std::string bin_dir, args.GetString("bin-dir", ""));
  ASSIGN_OR_RETURN(bool forward_only, args.GetBool("forward-only", false));
  ASSIGN_OR_RETURN(int64_t repeat, args.GetInt("repeat", 1, 1, 100));
  ASSIGN_OR_RETURN(int64_t mib, args.GetInt("transfer-mib", 64, 1, 4096));
  ASSIGN_OR_RETURN(int64_t transfer_repeat, args.GetInt("transfer-repeat", 5, 1, 100));
  ASSIGN_OR_RETURN(bool skip_transfer, args.GetBool("skip-transfer", false));
  ASSIGN_OR_RETURN(bool skip_attention, args.GetBool("skip-attention", false));
  ASSIGN_OR_RETURN(bool skip_single, args.GetBool("skip-single", false));
  ASSIGN_OR_RETURN(bool json, args.GetBool("json", false));
  const int workers = flags.session.num_workers > 0 ? flags.session.num_workers : 2;
  ASSIGN_OR_RETURN(int64_t single_threads,
                   args.GetInt("single-threads", workers * std::max<int64_t>(1, threads), 1, 1024));
  ASSIGN_OR_RETURN(RpcSecurityOptions security, ParseSecurityFlags(args));
  RETURN_IF_ERROR(args.CheckNoUnknown());

  const TextOut text(json);
  BenchReport report;
  Interrupts::Install("dfa bench", Interrupts::Mode::kCleanUpAndExit);
  std::unique_ptr<client::LocalCluster> local;
  int stop_on_interrupt = 0;
  if (coordinator.empty()) {
    client::LocalClusterOptions lo;
    lo.workers = workers;
    lo.threads_per_worker = static_cast<int>(threads);
    lo.backend = backend;
    lo.bin_dir = bin_dir;
    lo.security = security;
    // A Ctrl-C while the cluster starts is acted on once it has.
    Interrupts::Install("dfa bench", Interrupts::Mode::kFlagOnly);
    ASSIGN_OR_RETURN(local, client::LocalCluster::Start(lo));
    stop_on_interrupt =
        Interrupts::AddCleanup("stopping the local cluster", [&local] { (void)local->Stop(); });
    Interrupts::Install("dfa bench", Interrupts::Mode::kCleanUpAndExit);
    Interrupts::CleanUpAndExitIfRequested();
    coordinator = local->coordinator_address();
    report.local_cluster = true;
    report.local_workers = workers;
    report.local_backend = backend;
    report.local_threads = static_cast<int>(threads);
    text("local cluster: %d %s workers x %lld thread(s), coordinator %s\n", workers,
         backend.c_str(), static_cast<long long>(threads), coordinator.c_str());
  }
  report.coordinator = coordinator;
  flags.session.num_workers = workers;
  client::ClientOptions co;
  co.coordinator = coordinator;
  co.security = security;
  ASSIGN_OR_RETURN(auto c, client::Client::Connect(co));
  absl::Status s;
  std::vector<pid_t> worker_pids;
  if (local) {
    for (int i = 0; i < workers; ++i) worker_pids.push_back(local->worker_process(i)->pid());
  }
  if (!skip_transfer) {
    s = RunTransfers(c.get(), workers, flags.session.schedule, mib,
                     static_cast<int>(transfer_repeat), worker_pids, text,
                     &report.transfers.emplace());
  }
  if (s.ok() && !skip_attention) {
    s = RunAttention(c.get(), flags, !forward_only, static_cast<int>(repeat), !skip_single,
                     static_cast<int>(single_threads), text, &report.attention.emplace());
  }
  Interrupts::BlockIfExiting();
  if (local) {
    Interrupts::RemoveCleanup(stop_on_interrupt);
    absl::Status stop = local->Stop();
    if (s.ok()) s = stop;
  }
  if (s.ok() && json) std::printf("%s\n", BenchReportJson(report).c_str());
  return s;
}

}  // namespace

CommandInfo BenchCommandInfo() {
  return {
      "dfa",
      "dfa bench",
      "[--coordinator HOST:PORT | --workers N --threads T] [flags]",
      "Data-plane rates (gRPC, 1 stream and N in parallel; shared memory) beside this host's\n"
      "memcpy, and attention throughput of the service on seeded synthetic inputs resident on\n"
      "the workers against the single-process CPU kernel on the same problem. Without\n"
      "--coordinator it starts a local cluster (N workers, T threads each; default 2 x 1).\n"
      "--offload: one layer from this process's CUDA memory through the service (CUDA IPC,\n"
      "shared memory, gRPC) against the same layer computed here, split into transfer,\n"
      "compute and control plane (a local cudnn worker with --worker-memory of the GPU).",
      {{"Cluster",
        {CoordinatorFlag("bench this running cluster instead of starting one"),
         {"threads", "T", "threads per local worker (default 1; 0: the worker's default)"},
         {"backend", "cpu|cuda|cudnn|auto", "local workers' backend (default cpu)"},
         {"bin-dir", "DIR", "where dfa-coordinator and dfa-worker are (default: next to dfa)"}}},
       {"Bench",
        {{"forward-only", "", "no backward jobs"},
         {"repeat", "R", "attention jobs per kind; the best is reported (default 1)"},
         {"transfer-mib", "MIB", "MiB per tensor of the data-plane runs (default 64)"},
         {"transfer-repeat", "R", "runs per data-plane line; the best is reported (default 5)"},
         {"skip-transfer", "", "no data-plane runs"},
         {"skip-attention", "", "no attention jobs"},
         {"skip-single", "", "no single-process comparison"},
         {"single-threads", "T", "threads of the single-process run (default N x T)"},
         {"json", "", "the same figures as one JSON document on stdout (keys: docs/client.md)"}}},
       JobFlagGroup(16384, "workers (default 2)"),
       OffloadFlagGroup(),
       SecurityFlagGroup()},
      ""};
}

int RunBenchCommand(int argc, char** argv) {
  return RunCommand(BenchCommandInfo(), argc, argv, 0, Bench);
}

}  // namespace dfa::cli
