// `dfa bench`: data-plane rates (gRPC stream and shared memory, beside this machine's memcpy
// rate) and attention throughput of the service on seeded synthetic resident inputs against the
// single-process CPU kernel on the same problem (the service's overhead).
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cli/commands.h"
#include "client/cli/job_flags.h"
#include "client/cli/training_run.h"
#include "client/local_cluster.h"
#include "kernels/attention_backend.h"

namespace dfa::cli {
namespace {

constexpr char kUsage[] =
    "usage: dfa bench [--coordinator HOST:PORT | --workers N --threads T --backend cpu]\n"
    "                 [--seq 16K] [--heads 8] [--kv-heads HK] [--head-dim 64] [--dtype bf16]\n"
    "                 [--causal|--full] [--schedule NAME] [--forward-only] [--repeat R]\n"
    "                 [--transfer-mib 64] [--skip-transfer] [--skip-attention] [--skip-single]\n"
    "                 [--single-threads T]\n"
    "Without --coordinator it starts a local cluster (N workers, T threads each; default 2 x 1).\n";

double GBps(int64_t bytes, double secs) { return secs > 0 ? bytes / secs / 1e9 : 0; }

// Best of a few copies of a `bytes` buffer (one direction: bytes read = bytes written).
double MemcpyRate(int64_t bytes) {
  std::vector<uint8_t> a(static_cast<size_t>(bytes), 1), b(static_cast<size_t>(bytes), 0);
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    const absl::Time t0 = absl::Now();
    std::memcpy(b.data(), a.data(), a.size());
    best = std::max(best, GBps(bytes, absl::ToDoubleSeconds(absl::Now() - t0)));
    a[static_cast<size_t>(i)] = b[static_cast<size_t>(i + 1)];  // keep the copies observable
  }
  return best;
}

absl::Status BenchTransfers(client::Client* c, int workers, int64_t mib) {
  std::printf("\n== client data plane (per-worker streams in parallel; %lld MiB per tensor) ==\n",
              static_cast<long long>(mib));
  const double memcpy_rate = MemcpyRate(mib << 20);
  std::printf("memcpy (this machine, 1 thread)      %6.2f GB/s\n", memcpy_rate);
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
  ASSIGN_OR_RETURN(auto session, c->CreateSession(so));
  ASSIGN_OR_RETURN(client::HostTensor q, client::MakeTensor(spec, v1::TENSOR_Q));
  client::FillRandom(11, &q);
  client::TransferOptions grpc_path, shm_path;
  grpc_path.path = client::TransferPath::kGrpc;
  shm_path.path = client::TransferPath::kSharedMemory;

  auto report = [&](const std::string& what, const client::TransferStats& s) {
    std::printf("%-36s %6.2f GB/s  (%.1f MiB in %.4f s, %lld pieces)\n", what.c_str(),
                GBps(s.bytes, s.seconds), s.bytes / 1048576.0, s.seconds,
                static_cast<long long>(s.chunks));
  };
  // Best of kTries: the first call also pays connection set-up and segment creation.
  constexpr int kTries = 3;
  auto best = [&](const std::function<absl::StatusOr<client::TransferStats>()>& fn)
      -> absl::StatusOr<client::TransferStats> {
    client::TransferStats b;
    for (int i = 0; i < kTries; ++i) {
      ASSIGN_OR_RETURN(client::TransferStats s, fn());
      if (i == 0 || s.seconds < b.seconds) b = s;
    }
    return b;
  };
  std::printf("(best of %d per line)\n", kTries);
  // One stream alone: rank 0's shard.
  {
    client::WorkerDataClient& data = session->DataClient(0);
    std::vector<v1::RowRange> owned(session->info().shards(0).owned().begin(),
                                    session->info().shards(0).owned().end());
    ASSIGN_OR_RETURN(auto s, best([&] {
      return data.UploadGrpc(v1::TENSOR_Q, q, owned, client::kDefaultChunkBytes, {});
    }));
    report("upload   gRPC, 1 stream", s);
    ASSIGN_OR_RETURN(s, best([&] {
      return data.UploadShm(v1::TENSOR_Q, q, owned, int64_t{64} << 20, {});
    }));
    report("upload   shared memory, 1 worker", s);
  }
  const std::string n = absl::StrCat(workers);
  ASSIGN_OR_RETURN(auto up, best([&] { return session->Upload(v1::TENSOR_Q, q, grpc_path); }));
  report("upload   gRPC, " + n + " streams", up);
  ASSIGN_OR_RETURN(up, best([&] { return session->Upload(v1::TENSOR_Q, q, shm_path); }));
  report("upload   shared memory, " + n + " workers", up);
  RETURN_IF_ERROR(session->Upload(v1::TENSOR_K, q, shm_path).status());
  RETURN_IF_ERROR(session->Upload(v1::TENSOR_V, q, shm_path).status());
  RETURN_IF_ERROR(session->Run(v1::JOB_FORWARD).status());
  client::HostTensor o1, o2;
  ASSIGN_OR_RETURN(auto down,
                   best([&] { return session->Download(v1::TENSOR_O, &o1, grpc_path); }));
  report("download gRPC, " + n + " streams", down);
  ASSIGN_OR_RETURN(down, best([&] { return session->Download(v1::TENSOR_O, &o2, shm_path); }));
  report("download shared memory, " + n + " workers", down);
  if (o1.bytes != o2.bytes) {
    return absl::DataLossError("bench: O downloaded through gRPC and shared memory differ");
  }
  return session->Release();
}

absl::Status BenchAttention(client::Client* c, const JobFlags& flags, bool backward, int repeat,
                            bool single, int single_threads) {
  const v1::AttentionSpec& spec = flags.session.spec;
  std::printf("\n== attention: %s, seeded synthetic inputs resident on the workers ==\n",
              DescribeSpec(spec).c_str());
  ASSIGN_OR_RETURN(auto session, c->CreateSession(flags.session));
  std::printf("session on %d workers, schedule %s\n", session->num_workers(),
              session->info().plan().schedule().c_str());
  RETURN_IF_ERROR(session->GenerateInputs(flags.seed, backward));
  double best_fwd = 0, best_bwd = 0;
  for (int r = 0; r < repeat; ++r) {
    ASSIGN_OR_RETURN(v1::Job f, session->Run(v1::JOB_FORWARD));
    PrintJobReport("forward", f);
    best_fwd = std::max(best_fwd, f.flops() / std::max(1e-9, f.wall_seconds()));
    if (backward) {
      ASSIGN_OR_RETURN(v1::Job b, session->Run(v1::JOB_BACKWARD));
      PrintJobReport("backward", b);
      best_bwd = std::max(best_bwd, b.flops() / std::max(1e-9, b.wall_seconds()));
    }
  }
  (void)session->Release();
  if (!single) return absl::OkStatus();

  std::printf("\n== single process, CPU kernel, %d threads, same problem ==\n", single_threads);
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
  const MaskKind mask = spec.causal() ? MaskKind::kCausal : MaskKind::kFull;
  ForwardArgs fa;
  fa.scale = client::EffectiveScale(spec);
  fa.mask = mask;
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
  std::printf("forward   %.3f s  %.2f GFLOP/s\n", fwd_s, single_fwd / 1e9);
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
    std::printf("backward  %.3f s  %.2f GFLOP/s\n", bwd_s, single_bwd / 1e9);
  }
  std::printf("\n== service vs single process (best of %d) ==\n", repeat);
  std::printf("forward   service %.2f GFLOP/s  single %.2f GFLOP/s  ratio %.1f%%\n", best_fwd / 1e9,
              single_fwd / 1e9, 100 * best_fwd / single_fwd);
  if (backward) {
    std::printf("backward  service %.2f GFLOP/s  single %.2f GFLOP/s  ratio %.1f%%\n",
                best_bwd / 1e9, single_bwd / 1e9, 100 * best_bwd / single_bwd);
  }
  return absl::OkStatus();
}

absl::Status Bench(Args& args) {
  ASSIGN_OR_RETURN(std::string coordinator, args.GetString("coordinator", ""));
  ASSIGN_OR_RETURN(JobFlags flags, ParseJobFlags(args, 16384, 2));
  ASSIGN_OR_RETURN(int64_t threads, args.GetInt("threads", 1, 0, 1024));
  ASSIGN_OR_RETURN(std::string backend, args.GetString("backend", "cpu"));
  ASSIGN_OR_RETURN(std::string bin_dir, args.GetString("bin-dir", ""));
  ASSIGN_OR_RETURN(bool forward_only, args.GetBool("forward-only", false));
  ASSIGN_OR_RETURN(int64_t repeat, args.GetInt("repeat", 1, 1, 100));
  ASSIGN_OR_RETURN(int64_t mib, args.GetInt("transfer-mib", 64, 1, 4096));
  ASSIGN_OR_RETURN(bool skip_transfer, args.GetBool("skip-transfer", false));
  ASSIGN_OR_RETURN(bool skip_attention, args.GetBool("skip-attention", false));
  ASSIGN_OR_RETURN(bool skip_single, args.GetBool("skip-single", false));
  const int workers = flags.session.num_workers > 0 ? flags.session.num_workers : 2;
  ASSIGN_OR_RETURN(int64_t single_threads,
                   args.GetInt("single-threads", workers * std::max<int64_t>(1, threads), 1, 1024));
  RETURN_IF_ERROR(args.CheckNoUnknown());

  std::unique_ptr<client::LocalCluster> local;
  if (coordinator.empty()) {
    client::LocalClusterOptions lo;
    lo.workers = workers;
    lo.threads_per_worker = static_cast<int>(threads);
    lo.backend = backend;
    lo.bin_dir = bin_dir;
    ASSIGN_OR_RETURN(local, client::LocalCluster::Start(lo));
    coordinator = local->coordinator_address();
    std::printf("local cluster: %d %s workers x %lld thread(s), coordinator %s\n", workers,
                backend.c_str(), static_cast<long long>(threads), coordinator.c_str());
  }
  flags.session.num_workers = workers;
  ASSIGN_OR_RETURN(auto c, client::Client::Connect(coordinator));
  absl::Status s;
  if (!skip_transfer) s = BenchTransfers(c.get(), workers, mib);
  if (s.ok() && !skip_attention) {
    s = BenchAttention(c.get(), flags, !forward_only, static_cast<int>(repeat), !skip_single,
                       static_cast<int>(single_threads));
  }
  if (local) {
    absl::Status stop = local->Stop();
    if (s.ok()) s = stop;
  }
  return s;
}

}  // namespace

int RunBenchCommand(int argc, char** argv) {
  auto args = Args::Parse(argc, argv, 0);
  if (!args.ok()) {
    std::fprintf(stderr, "dfa bench: %s\n%s", std::string(args.status().message()).c_str(), kUsage);
    return 2;
  }
  if (args->Has("help")) {
    std::printf("%s", kUsage);
    return 0;
  }
  absl::Status s = Bench(*args);
  if (!s.ok()) {
    std::fflush(stdout);
    std::fprintf(stderr, "dfa bench: %s\n", s.ToString().c_str());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}

}  // namespace dfa::cli
