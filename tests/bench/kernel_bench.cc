// dfa-kernel-bench: GFLOP/s of the CPU attention backend's forward and backward units, next to
// this machine's fp32 sgemm rate through OpenBLAS on the same number of threads.
// FLOPs as ../shared/ANCHORS.md counts them: forward 4·B·H·S²·D (halved for causal), backward
// 2.5 × forward. Each figure is the best of --reps timed runs after one warm-up run.
//
//   dfa-kernel-bench [--threads=0] [--seq=4096] [--heads=8] [--reps=2] [--dims=64,128]
//                    [--dtypes=bf16,f32] [--masks=causal,full] [--backward=true]
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "kernels/attention_backend.h"

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

template <typename F>
double BestSeconds(int reps, F&& f) {
  f();  // warm-up
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

double SgemmGflops(int threads, int reps) {
  openblas_set_num_threads(threads);
  const int n = 2048;
  std::vector<float> a(size_t{n} * n), b(size_t{n} * n), c(size_t{n} * n);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto* v : {&a, &b}) std::generate(v->begin(), v->end(), [&] { return u(rng); });
  const double s = BestSeconds(reps + 1, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data(), n, b.data(), n,
                0.f, c.data(), n);
  });
  return 2.0 * n * n * n / s / 1e9;
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
    for (int64_t i = 0; i < int64_t{b} * rows * h * d; ++i) dfa::StoreFromFloat(bytes.data(), t, i, u(rng));
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

  const double sgemm = SgemmGflops(threads, reps);
  std::printf("machine: %u hardware threads; using %d threads\n",
              std::thread::hardware_concurrency(), threads);
  std::printf("OpenBLAS sgemm 2048^3 fp32: %.1f GFLOP/s (%s)\n", sgemm, openblas_get_config());
  std::printf("%-5s %4s %-6s %6s %3s %3s | %10s %7s | %10s %7s\n", "dtype", "D", "mask", "S", "H",
              "Hkv", "fwd GF/s", "%sgemm", "bwd GF/s", "%sgemm");

  std::mt19937 rng(42);
  for (const std::string& dts : std::vector<std::string>(absl::StrSplit(absl::GetFlag(FLAGS_dtypes), ','))) {
    for (const std::string& ds : std::vector<std::string>(absl::StrSplit(absl::GetFlag(FLAGS_dims), ','))) {
      for (const std::string& ms : std::vector<std::string>(absl::StrSplit(absl::GetFlag(FLAGS_masks), ','))) {
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
        const double tf = BestSeconds(reps, [&] { st.Update(backend->Forward(fa)); });
        double gb = 0.0;
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
          const double tb = BestSeconds(reps, [&] { st.Update(backend->Backward(ba)); });
          gb = 2.5 * flops / tb / 1e9;
        }
        if (!st.ok()) {
          std::fprintf(stderr, "kernel failed: %s\n", st.ToString().c_str());
          return 1;
        }
        const double gf = flops / tf / 1e9;
        std::printf("%-5s %4d %-6s %6lld %3d %3d | %10.1f %6.1f%% | %10.1f %6.1f%%\n", dts.c_str(), D,
                    ms.c_str(), static_cast<long long>(S), H, Hkv, gf, 100.0 * gf / sgemm, gb,
                    100.0 * gb / sgemm);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
