// dfa-cuda-kernel-bench: TFLOP/s of the CUDA backend's forward and backward units, one GPU.
//   dfa-cuda-kernel-bench [--quick (S = 4K, 16K only)] [--dtype bf16|f16] [--hdim 64|128 (one only)]
//                         [--reps N (timed launches per config; default 20 / 5 / 3 at 4K / 16K / 64K)]
//                         [--masks (the masked table below instead)] [--rounds N] [--docs-out DIR]
//                         [--fwd-kernel ...] [--bwd-kernel ...] [--bwd-tile-chunk N]
// The last three override the kernel table (tests/gpu/kernel_flags.h; default: the table, as the
// services run it); rows then carry a tag such as "-fwd=cpasync".
// Configs: S = 4K, 16K, 64K; D = 64, 128; causal and full; 32 query heads (= kv heads), batch 1.
// FLOPs: forward 4·B·H·S²·D, halved for causal (core/mask.h ForwardFlops); backward 2.5×.
// --masks: the kIntervals mask (documents, windows) next to dense causal, in one run, at S = 64K
// and 256K (--quick: 64K only), 32 heads, D = 128 (or --hdim): dense causal; dense causal as one
// document through the interval path (the control row: that path's own cost); varlen causal
// (document lengths from a Pareto distribution, alpha 1.2, x_min 256 tokens, capped at 64K,
// seed 20; tests/gpu/mask_intervals_host.h); causal windows of 4K and 32K. FLOPs count the
// visible pairs only (4·H·pairs·D); "x dense" is the row's TFLOP/s over dense causal's at that S.
// The rows run in --rounds N rounds (default 3), round r starting at row r, and each time is the
// median of its rounds: the card's clock follows its recent load, so whichever row runs first
// after idle would otherwise look faster.
// --docs-out DIR writes each S's document offsets to DIR/docs_<S>.txt (one per line) for
// tests/gpu/bench_flex.py, which runs PyTorch flex attention on the same documents.
// Timing: CUDA events around `reps` launches after one warm-up. The backward time includes
// the D = rowsum(dO·O) pre-pass and zeroing dQ (as FlashAttention-2's own backward does).
// Prints a markdown table; exits non-zero with a message when no GPU is usable or a flag is bad.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/gpu/kernel_flags.h"
#include "tests/gpu/mask_intervals_host.h"

namespace dfa {
namespace {

#define BENCH_CHECK(expr)                                                   \
  do {                                                                      \
    auto st_ = (expr);                                                      \
    if (!st_.ok()) {                                                        \
      std::fprintf(stderr, "%s failed: %s\n", #expr, st_.ToString().c_str()); \
      return 1;                                                             \
    }                                                                       \
  } while (0)

// Fills `bytes` of device memory with a repeated block of random 2-byte values in [-1, 1).
absl::Status FillRandom(AttentionBackend& be, void* dst, size_t bytes, DType t, uint64_t seed) {
  const size_t kBlock = size_t{1} << 22;  // elements
  std::vector<uint16_t> h(kBlock);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (auto& x : h) x = t == DType::kBF16 ? FloatToBF16(dist(rng)) : FloatToHalf(dist(rng));
  for (size_t off = 0; off < bytes; off += kBlock * 2) {
    const size_t n = std::min(kBlock * 2, bytes - off);
    RETURN_IF_ERROR(be.Copy(static_cast<char*>(dst) + off, h.data(), n,
                            AttentionBackend::CopyKind::kHostToDevice, nullptr));
  }
  return be.Synchronize(nullptr);
}

int Main(int argc, char** argv) {
  bool quick = false;
  bool masks = false;
  std::string docs_out;
  DType dtype = DType::kBF16;
  int only_hdim = 0;  // 0: both head dims
  int forced_reps = 0;  // 0: per length
  int mask_rounds = 3;  // --masks: rounds over the rows
  cuda::KernelChoice choice;
  for (int i = 1; i < argc; ++i) {
    std::string error;
    if (testing::ParseKernelFlag(argc, argv, &i, &choice, &error)) {
      if (!error.empty()) {
        std::fprintf(stderr, "%s\n", error.c_str());
        return 2;
      }
      continue;
    }
    if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--masks")) {
      masks = true;
    } else if (!std::strcmp(argv[i], "--docs-out") && i + 1 < argc) {
      docs_out = argv[++i];
    } else if (!std::strcmp(argv[i], "--hdim") && i + 1 < argc) {
      only_hdim = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      forced_reps = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) {
      mask_rounds = std::atoi(argv[++i]);
      if (mask_rounds < 1 || mask_rounds > 99) {
        std::fprintf(stderr, "--rounds must be 1 .. 99, got %s\n", argv[i]);
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--dtype") && i + 1 < argc) {
      dtype = std::strcmp(argv[++i], "f16") ? DType::kBF16 : DType::kF16;
    } else {
      std::fprintf(stderr, "unknown flag %s (see the comment at the top of kernel_bench.cc)\n",
                   argv[i]);
      return 2;
    }
  }
  auto be_or = CreateCudaBackend({}, choice);
  if (!be_or.ok()) {
    std::fprintf(stderr, "cuda backend: %s\n", be_or.status().ToString().c_str());
    return 2;
  }
  AttentionBackend& be = **be_or;
  const std::string tag = testing::KernelTag(choice);
  const char* kernel_tag = tag.c_str();
  const int kHeads = 32;
  std::vector<int64_t> lengths = quick ? std::vector<int64_t>{4096, 16384} : std::vector<int64_t>{4096, 16384, 65536};
  if (masks) lengths = quick ? std::vector<int64_t>{65536} : std::vector<int64_t>{65536, 262144};
  const int64_t max_s = lengths.back();
  const size_t max_elems = size_t(max_s) * kHeads * 128;
  void *q, *k, *v, *dout, *out;
  float *lse, *delta, *dq, *dk, *dv;
  auto alloc = [&](size_t bytes) -> void* {
    auto p = be.Alloc(bytes);
    if (!p.ok()) {
      std::fprintf(stderr, "alloc: %s\n", p.status().ToString().c_str());
      return nullptr;
    }
    return *p;
  };
  q = alloc(max_elems * 2), k = alloc(max_elems * 2), v = alloc(max_elems * 2);
  dout = alloc(max_elems * 2), out = alloc(max_elems * 2);
  lse = static_cast<float*>(alloc(size_t(max_s) * kHeads * 4));
  delta = static_cast<float*>(alloc(size_t(max_s) * kHeads * 4));
  dq = static_cast<float*>(alloc(max_elems * 4));
  dk = static_cast<float*>(alloc(max_elems * 4));
  dv = static_cast<float*>(alloc(max_elems * 4));
  if (!q || !k || !v || !dout || !out || !lse || !delta || !dq || !dk || !dv) return 1;
  BENCH_CHECK(FillRandom(be, q, max_elems * 2, dtype, 1));
  BENCH_CHECK(FillRandom(be, k, max_elems * 2, dtype, 2));
  BENCH_CHECK(FillRandom(be, v, max_elems * 2, dtype, 3));
  BENCH_CHECK(FillRandom(be, dout, max_elems * 2, dtype, 4));

  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  // Times `reps` forward and backward launches of one unit (after one warm-up each).
  auto time_unit = [&](MaskKind mask, const MaskIntervals& iv, int64_t s, int d, int reps,
                       float* fwd_ms, float* bwd_ms) -> absl::Status {
    TensorView tq;
    tq.dtype = dtype, tq.rows = s, tq.heads = kHeads, tq.head_dim = d;
    RowStatView st;
    st.heads = kHeads, st.rows = s;
    ForwardArgs f;
    f.scale = 1.f / std::sqrt(float(d));
    f.mask = mask;
    f.intervals = iv;
    f.q = tq, f.q.data = q;
    f.k = tq, f.k.data = k;
    f.v = tq, f.v.data = v;
    f.out = tq, f.out.data = out;
    f.lse = st, f.lse.data = lse;
    BackwardArgs b;
    b.scale = f.scale, b.mask = mask, b.intervals = iv, b.q = f.q, b.k = f.k, b.v = f.v;
    b.dout = tq, b.dout.data = dout;
    b.lse = f.lse;
    b.delta = st, b.delta.data = delta;
    TensorView g = tq;
    g.dtype = DType::kF32;
    b.dq = g, b.dq.data = dq;
    b.dk = g, b.dk.data = dk;
    b.dv = g, b.dv.data = dv;
    const size_t grad_bytes = size_t(s) * kHeads * d * 4;

    RETURN_IF_ERROR(be.Forward(f));  // warm-up
    cudaEventRecord(e0);
    for (int r = 0; r < reps; ++r) RETURN_IF_ERROR(be.Forward(f));
    cudaEventRecord(e1);
    RETURN_IF_ERROR(be.Synchronize(nullptr));
    cudaEventElapsedTime(fwd_ms, e0, e1);
    *fwd_ms /= reps;

    RETURN_IF_ERROR(be.Memset(dk, 0, grad_bytes, nullptr));
    RETURN_IF_ERROR(be.Memset(dv, 0, grad_bytes, nullptr));
    auto backward = [&]() -> absl::Status {
      RETURN_IF_ERROR(be.Memset(dq, 0, grad_bytes, nullptr));
      RETURN_IF_ERROR(be.ComputeDelta(b.dout, f.out, b.delta, nullptr));
      return be.Backward(b);
    };
    RETURN_IF_ERROR(backward());  // warm-up
    cudaEventRecord(e0);
    for (int r = 0; r < reps; ++r) RETURN_IF_ERROR(backward());
    cudaEventRecord(e1);
    RETURN_IF_ERROR(be.Synchronize(nullptr));
    cudaEventElapsedTime(bwd_ms, e0, e1);
    *bwd_ms /= reps;
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return absl::InternalError(cudaGetErrorString(err));
    return absl::OkStatus();
  };

  if (masks) {
    const int d = only_hdim != 0 ? only_hdim : 128;
    std::printf("| kernel | D | S | mask | visible pairs | fwd ms | fwd TFLOP/s | x dense | bwd ms | "
                "bwd TFLOP/s | x dense |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    int32_t* iv_dev[4];
    for (auto& p : iv_dev) {
      p = static_cast<int32_t*>(alloc(size_t(max_s) * 4));
      if (!p) return 1;
    }
    for (int64_t s : lengths) {
      struct MaskRow {
        std::string name;
        bool dense;
        testing::HostMask mask;
      };
      std::vector<MaskRow> rows;
      rows.push_back({"dense causal", true, {}});
      // Control: dense causal through the interval path (one document), so the rows below
      // separate that path's own cost from their masks' short tiles.
      testing::HostMask one_doc;
      one_doc.causal = true;
      one_doc.docs = {{0, s}};
      rows.push_back({"causal as 1 document", false, one_doc});
      testing::HostMask varlen;
      varlen.causal = true;
      varlen.docs = {testing::ParetoDocOffsets(s, 1.2, 256, 65536, 20)};
      rows.push_back({"varlen causal (" + std::to_string(varlen.docs[0].size() - 1) + " docs)", false,
                      varlen});
      if (!docs_out.empty()) {
        const std::string path = docs_out + "/docs_" + std::to_string(s) + ".txt";
        FILE* fp = std::fopen(path.c_str(), "w");
        if (fp == nullptr) {
          std::fprintf(stderr, "--docs-out: cannot write %s\n", path.c_str());
          return 2;
        }
        for (int64_t o : varlen.docs[0]) std::fprintf(fp, "%lld\n", static_cast<long long>(o));
        std::fclose(fp);
      }
      for (int64_t w : {4096, 32768}) {
        testing::HostMask win;
        win.causal = true;
        win.left = w;
        win.docs = {{0, s}};
        rows.push_back({"causal window " + std::to_string(w / 1024) + "K", false, win});
      }
      const int reps = forced_reps > 0 ? forced_reps : (s >= 262144 ? 2 : 3);
      // Rounds: every row once per round, round r starting at row r (the card's clock follows
      // its recent load, so the row after idle would run faster than the rest); medians.
      const size_t n_rows = rows.size();
      std::vector<testing::HostIntervals> host(n_rows);
      std::vector<double> pairs(n_rows, double(s) * double(s + 1) / 2);
      for (size_t i = 0; i < n_rows; ++i) {
        if (rows[i].dense) continue;
        host[i] = testing::BuildIntervals(rows[i].mask, 1, s);
        pairs[i] = double(testing::VisiblePairsOf(host[i], 0, 0, s, 0, s));
      }
      std::vector<std::vector<float>> fwd_ms(n_rows), bwd_ms(n_rows);
      for (int r = 0; r < mask_rounds; ++r) {
        for (size_t j = 0; j < n_rows; ++j) {
          const size_t i = (j + size_t(r)) % n_rows;
          MaskIntervals iv;
          if (!rows[i].dense) {
            const std::vector<int32_t>* src[4] = {&host[i].q_lo, &host[i].q_hi, &host[i].k_lo,
                                                  &host[i].k_hi};
            for (int c = 0; c < 4; ++c) {
              BENCH_CHECK(be.Copy(iv_dev[c], src[c]->data(), size_t(s) * 4,
                                  AttentionBackend::CopyKind::kHostToDevice, nullptr));
            }
            BENCH_CHECK(be.Synchronize(nullptr));
            iv.q_lo = iv_dev[0], iv.q_hi = iv_dev[1], iv.k_lo = iv_dev[2], iv.k_hi = iv_dev[3];
            iv.seq = s;
          }
          float f_ms = 0, b_ms = 0;
          BENCH_CHECK(time_unit(rows[i].dense ? MaskKind::kCausal : MaskKind::kIntervals, iv, s, d,
                                reps, &f_ms, &b_ms));
          fwd_ms[i].push_back(f_ms);
          bwd_ms[i].push_back(b_ms);
        }
      }
      auto median = [](std::vector<float> v) {
        std::sort(v.begin(), v.end());
        return v.size() % 2 ? double(v[v.size() / 2])
                            : 0.5 * (double(v[v.size() / 2 - 1]) + double(v[v.size() / 2]));
      };
      double dense_fwd = 0, dense_bwd = 0;
      for (size_t i = 0; i < n_rows; ++i) {
        const MaskRow& row = rows[i];
        const double f_ms = median(fwd_ms[i]), b_ms = median(bwd_ms[i]);
        const double flops = 4.0 * kHeads * d * pairs[i];
        const double tf = flops / (f_ms * 1e-3) / 1e12, tb = 2.5 * flops / (b_ms * 1e-3) / 1e12;
        if (row.dense) dense_fwd = tf, dense_bwd = tb;
        std::printf("| dfa-%s%s | %d | %lldK | %s | %.3g | %.3f | %.1f | %.2f | %.3f | %.1f | %.2f |\n",
                    std::string(DTypeName(dtype)).c_str(), kernel_tag, d,
                    static_cast<long long>(s / 1024), row.name.c_str(), pairs[i], f_ms, tf,
                    tf / dense_fwd, b_ms, tb, tb / dense_bwd);
        std::fflush(stdout);
      }
    }
    for (int32_t* p : iv_dev) be.Free(p);
  } else {
    std::printf("| kernel | D | S | causal | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s |\n");
    std::printf("|---|---|---|---|---|---|---|---|\n");
  }
  for (int d : {64, 128}) {
    if (masks) break;
    if (only_hdim != 0 && d != only_hdim) continue;
    for (int64_t s : lengths) {
      for (MaskKind mask : {MaskKind::kCausal, MaskKind::kFull}) {
        const double flops = ForwardFlops(1, kHeads, d, 0, s, 0, s, mask);
        const int reps =
            forced_reps > 0 ? forced_reps : (s >= 65536 ? 3 : (s >= 16384 ? 5 : 20));
        float fwd_ms = 0, bwd_ms = 0;
        BENCH_CHECK(time_unit(mask, {}, s, d, reps, &fwd_ms, &bwd_ms));
        std::printf("| dfa-%s%s | %d | %lldK | %s | %.3f | %.1f | %.3f | %.1f |\n", std::string(DTypeName(dtype)).c_str(),
                    kernel_tag, d,
                    static_cast<long long>(s / 1024), mask == MaskKind::kCausal ? "yes" : "no", fwd_ms,
                    flops / (fwd_ms * 1e-3) / 1e12, bwd_ms, 2.5 * flops / (bwd_ms * 1e-3) / 1e12);
        std::fflush(stdout);
      }
    }
  }
  for (void* p : {q, k, v, dout, out}) be.Free(p);
  for (float* p : {lse, delta, dq, dk, dv}) be.Free(p);
  return 0;
}

}  // namespace
}  // namespace dfa

int main(int argc, char** argv) { return dfa::Main(argc, argv); }
