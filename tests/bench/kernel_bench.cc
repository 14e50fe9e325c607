// dfa-cpu-kernel-bench: GFLOP/s of the CPU attention backend's forward and backward units, next
// to this machine's fp32 sgemm rate through OpenBLAS on the same number of threads.
// FLOPs: forward 4·B·H·S²·D (halved for causal; core/mask.h ForwardFlops), backward 2.5 ×
// forward. Each figure is the best of --reps timed runs after one warm-up run.
// Two rates per figure: by wall-clock time, and by process CPU time divided by the thread
// count ("cpu"), which stays meaningful on a machine shared with other work (time the process
// was not scheduled does not count). OpenBLAS threads spin while waiting, so its cpu figure is
// a lower bound when threads > 1.
//
//   dfa-cpu-kernel-bench [--threads=0] [--seq=4096] [--heads=8] [--reps=2] [--dims=64,128]
//                        [--dtypes=bf16,f32] [--masks=causal,full] [--backward=true]
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "kernels/attention_backend.h"
#include "kernels/cpu/kernel_params.h"

ABSL_FLAG(int, threads, 0, "worker threads for the backend and for sgemm (0: all cores)");
ABSL_FLAG(int64_t, seq, 4096, "sequence length S (one unit: S queries x S keys)");
ABSL_FLAG(int, heads, 8, "query heads (= key/value heads unless --kv_heads)");
ABSL_FLAG(int, kv_heads, 0, "key/value heads (0: same as --heads)");
ABSL_FLAG(int, batch, 1, "batch");
ABSL_FLAG(int, reps, 2, "timed repetitions per figure (best is reported)");
ABSL_FLAG(std::string, dims, "64,128", "head dims");
ABSL_FLAG(std::string, dtypes, "bf16,f32", "input dtypes: f32, bf16, f16");
ABSL_FLAG(std::string, masks, "causal,full", "masks: causal, full");
ABSL_FLAG(bool, backward, true, "also time the backward unit");

namespace {

using Clock = std::chrono::steady_clock;

double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

struct Timing {
  double wall = 1e30;  // best wall-clock seconds
  double cpu = 1e30;   // best process CPU seconds
};

template <typename F>
Timing Best(int reps, F&& f) {
  f();  // warm-up
  Timing best;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    const double c0 = CpuSeconds();
    f();
    best.cpu = std::min(best.cpu, CpuSeconds() - c0);
    best.wall = std::min(best.wall, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

// GFLOP/s by wall clock and by CPU time per thread.
struct Rate {
  double wall, cpu;
};
Rate ToRate(double flops, const Timing& t, int threads) {
  return {flops / t.wall / 1e9, flops / (t.cpu / threads) / 1e9};
}

Rate SgemmRate(int threads, int reps) {
  openblas_set_num_threads(threads);
  const int n = 2048;
  std::vector<float> a(size_t{n} * n), b(size_t{n} * n), c(size_t{n} * n);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto* v : {&a, &b}) std::generate(v->begin(), v->end(), [&] { return u(rng); });
  const Timing t = Best(reps + 1, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data(), n, b.data(), n,
                0.f, c.data(), n);
  });
  return ToRate(2.0 * n * n * n, t, threads);
}

dfa::DType ParseDType(const std::string& s) {
  if (s == "f32") return dfa::DType::kF32;
  if (s == "f16") return dfa::DType::kF16;
  return dfa::DType::kBF16;
}

struct Buffer {
  std::vector<uint8_t> bytes;
  dfa::TensorView view;
  Buffer(dfa::DType t, int b, int64_t rows, int h, int d, std::mt19937& rng) {
    bytes.resize(size_t{static_cast<size_t>(b)} * rows * h * d * dfa::DTypeSize(t));
    view.data = bytes.data();
    view.dtype = t;
    view.batch = b;
    view.rows = rows;
    view.heads = h;
    view.head_dim = d;
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (int64_t i = 0; i < int64_t{b} * rows * h * d; ++i)
      dfa::StoreFromFloat(bytes.data(), t, i, u(rng));
  }
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  int threads = absl::GetFlag(FLAGS_threads);
  if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  const int64_t S = absl::GetFlag(FLAGS_seq);
  const int B = absl::GetFlag(FLAGS_batch), H = absl::GetFlag(FLAGS_heads);
  const int Hkv = absl::GetFlag(FLAGS_kv_heads) > 0 ? absl::GetFlag(FLAGS_kv_heads) : H;
  const int reps = absl::GetFlag(FLAGS_reps);

  auto backend_or = dfa::CreateBackend("cpu", dfa::BackendOptions{threads, 0});
  if (!backend_or.ok()) {
    std::fprintf(stderr, "%s\n", backend_or.status().ToString().c_str());
    return 1;
  }
  auto backend = std::move(backend_or).value();

  // sgemm is timed before and after the attention runs; the better figure is the yardstick
  // (the conservative choice on a machine whose load changes during the run).
  Rate sgemm = SgemmRate(threads, reps);
  std::printf("machine: %u hardware threads; using %d threads; cpu kernels: %s\n",
              std::thread::hardware_concurrency(), threads, dfa::cpu::SelectKernels().isa);
  std::printf("OpenBLAS sgemm 2048^3 fp32 (before): %.1f GFLOP/s wall, %.1f cpu (%s)\n", sgemm.wall,
              sgemm.cpu, openblas_get_config());
  struct Result {
    std::string dtype;
    int dim;
    std::string mask;
    Rate fwd, bwd;
  };
  std::vector<Result> results;

  std::mt19937 rng(42);
  for (const std::string& dts :
       std::vector<std::string>(absl::StrSplit(absl::GetFlag(FLAGS_dtypes), ','))) {
    for (const std::string& ds :
         std::vector<std::string>(absl::StrSplit(absl::GetFlag(FLAGS_dims), ','))) {
      for (const std::string& ms :
           std::vector<std::string>(absl::StrSplit(absl::GetFlag(FLAGS_masks), ','))) {
        const dfa::DType t = ParseDType(dts);
        const int D = std::stoi(ds);
        const bool causal = ms == "causal";
        Buffer q(t, B, S, H, D, rng), k(t, B, S, Hkv, D, rng), v(t, B, S, Hkv, D, rng),
            dout(t, B, S, H, D, rng);
        Buffer out(dfa::DType::kF32, B, S, H, D, rng), dq(dfa::DType::kF32, B, S, H, D, rng),
            dk(dfa::DType::kF32, B, S, Hkv, D, rng), dv(dfa::DType::kF32, B, S, Hkv, D, rng);
        std::vector<float> lse(size_t{static_cast<size_t>(B)} * H * S), delta(lse.size());
        dfa::RowStatView lse_v{lse.data(), B, H, S}, delta_v{delta.data(), B, H, S};

        dfa::ForwardArgs fa;
        fa.scale = 1.f / std::sqrt(static_cast<float>(D));
        fa.mask = causal ? dfa::MaskKind::kCausal : dfa::MaskKind::kFull;
        fa.q = q.view;
        fa.k = k.view;
        fa.v = v.view;
        fa.out = out.view;
        fa.lse = lse_v;
        const double flops = 4.0 * B * H * static_cast<double>(S) * S * D / (causal ? 2 : 1);
        absl::Status st;
        const Rate fwd =
            ToRate(flops, Best(reps, [&] { st.Update(backend->Forward(fa)); }), threads);
        Rate bwd{0.0, 0.0};
        if (absl::GetFlag(FLAGS_backward)) {
          st.Update(backend->ComputeDelta(dout.view, out.view, delta_v, nullptr));
          dfa::BackwardArgs ba;
          ba.scale = fa.scale;
          ba.mask = fa.mask;
          ba.q = q.view;
          ba.k = k.view;
          ba.v = v.view;
          ba.dout = dout.view;
          ba.lse = lse_v;
          ba.delta = delta_v;
          ba.dq = dq.view;
          ba.dk = dk.view;
          ba.dv = dv.view;
          bwd = ToRate(2.5 * flops, Best(reps, [&] { st.Update(backend->Backward(ba)); }), threads);
        }
        if (!st.ok()) {
          std::fprintf(stderr, "kernel failed: %s\n", st.ToString().c_str());
          return 1;
        }
        results.push_back({dts, D, ms, fwd, bwd});
        std::fprintf(stderr, "%s D=%d %s: forward %.1f GFLOP/s, backward %.1f\n", dts.c_str(), D,
                     ms.c_str(), fwd.wall, bwd.wall);
      }
    }
  }
  const Rate after = SgemmRate(threads, reps);
  std::printf("OpenBLAS sgemm 2048^3 fp32 (after):  %.1f GFLOP/s wall, %.1f cpu\n", after.wall,
              after.cpu);
  sgemm.wall = std::max(sgemm.wall, after.wall);
  sgemm.cpu = std::max(sgemm.cpu, after.cpu);
  std::printf(
      "GFLOP/s by wall clock [by cpu time]; %% of the better sgemm figure of the same kind\n");
  std::printf("%-5s %4s %-6s %6s %3s %3s | %-27s | %-27s\n", "dtype", "D", "mask", "S", "H", "Hkv",
              "forward GF/s, % of sgemm", "backward GF/s, % of sgemm");
  for (const Result& r : results) {
    std::printf(
        "%-5s %4d %-6s %6lld %3d %3d | %5.1f [%5.1f] %3.0f%% [%3.0f%%] | %5.1f [%5.1f] %3.0f%% "
        "[%3.0f%%]\n",
        r.dtype.c_str(), r.dim, r.mask.c_str(), static_cast<long long>(S), H, Hkv, r.fwd.wall,
        r.fwd.cpu, 100.0 * r.fwd.wall / sgemm.wall, 100.0 * r.fwd.cpu / sgemm.cpu, r.bwd.wall,
        r.bwd.cpu, 100.0 * r.bwd.wall / sgemm.wall, 100.0 * r.bwd.cpu / sgemm.cpu);
  }
  return 0;
}
