// dfa_cudnn_bench: TFLOP/s of attention units through OUR AttentionBackend interface, for the
// "cudnn" backend (and, side by side, "cuda"), one GPU, bf16, batch 1, 32 query heads.
//   dfa_cudnn_bench [--quick (D = 128, S = 16K and 64K)] [--backends cudnn,cuda]
//                   [--cudnn-fwd ...] [--cudnn-bwd ...] [--fwd-kernel ...] [--bwd-kernel ...]
// The last four override the table of kernels/cuda/kernel_dispatch.h (tests/gpu/kernel_flags.h;
// e.g. --cudnn-fwd cudnn runs every forward unit cuDNN can take on cuDNN); rows then carry a tag.
// Columns:
//   fwd      Forward, out in bf16, not accumulating (cuDNN writes O and LSE in place)
//   fwd-acc  Forward, fp32 out with accumulate=true (what the executor does for a unit after the
//            first: cuDNN into bf16 scratch, then one fused LSE-merge pass into the fp32 partial)
//   bwd      Backward with the final O given (cuDNN forms D itself) and the += into fp32
//            dQ/dK/dV; for "cuda" the D pre-pass (ComputeDelta) is included, as our kernel needs it.
// FLOPs: forward 4·B·H·S²·D, halved for causal (core/mask.h ForwardFlops); backward 2.5×.
// Timing: CUDA events around `reps` calls after one warm-up call (which builds cuDNN's graph).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "kernels/attention_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cudnn_backend.h"
#include "tests/gpu/kernel_flags.h"

namespace dfa {
namespace {

#define BENCH_CHECK(expr)                                                        \
  do {                                                                           \
    auto st_ = (expr);                                                           \
    if (!st_.ok()) {                                                             \
      std::fprintf(stderr, "%s failed: %s\n", #expr, st_.ToString().c_str());    \
      return false;                                                              \
    }                                                                            \
  } while (0)

absl::Status FillRandom(AttentionBackend& be, void* dst, size_t bytes, uint64_t seed) {
  const size_t kBlock = size_t{1} << 22;
  std::vector<uint16_t> h(kBlock);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (auto& x : h) x = FloatToBF16(dist(rng));
  for (size_t off = 0; off < bytes; off += kBlock * 2) {
    RETURN_IF_ERROR(be.Copy(static_cast<char*>(dst) + off, h.data(), std::min(kBlock * 2, bytes - off),
                            AttentionBackend::CopyKind::kHostToDevice, nullptr));
  }
  return be.Synchronize(nullptr);
}

template <typename F>
double TimeMs(F&& fn, int reps, bool* ok) {
  if (!fn()) {
    *ok = false;
    return 0;
  }
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaDeviceSynchronize();
  cudaEventRecord(a);
  for (int i = 0; i < reps; ++i) *ok = *ok && fn();
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / reps;
}

bool RunConfig(AttentionBackend& be, const std::string& name, const std::string& tag, int d, int64_t s,
               bool causal) {
  const int heads = 32;
  const size_t n16 = size_t(s) * heads * d, nstat = size_t(heads) * s;
  std::vector<void*> bufs;
  auto alloc = [&](size_t bytes) -> void* {
    auto p = be.Alloc(bytes);
    if (!p.ok()) return nullptr;
    bufs.push_back(*p);
    return *p;
  };
  void *q = alloc(n16 * 2), *k = alloc(n16 * 2), *v = alloc(n16 * 2), *dout = alloc(n16 * 2), *o16 = alloc(n16 * 2);
  void *o32 = alloc(n16 * 4), *lse = alloc(nstat * 4), *delta = alloc(nstat * 4);
  void *dq = alloc(n16 * 4), *dk = alloc(n16 * 4), *dv = alloc(n16 * 4);
  bool ok = true;
  for (void* p : bufs) ok = ok && p != nullptr;
  if (!ok || bufs.size() != 11) {
    std::fprintf(stderr, "out of memory at S=%lld\n", static_cast<long long>(s));
    for (void* p : bufs) be.Free(p);
    return false;
  }
  BENCH_CHECK(FillRandom(be, q, n16 * 2, 1));
  BENCH_CHECK(FillRandom(be, k, n16 * 2, 2));
  BENCH_CHECK(FillRandom(be, v, n16 * 2, 3));
  BENCH_CHECK(FillRandom(be, dout, n16 * 2, 4));
  TensorView tv;
  tv.dtype = DType::kBF16;
  tv.rows = s;
  tv.heads = heads;
  tv.head_dim = d;
  auto view = [&](void* p, DType t) {
    TensorView x = tv;
    x.data = p;
    x.dtype = t;
    return x;
  };
  RowStatView st;
  st.heads = heads;
  st.rows = s;
  auto stat = [&](void* p) {
    RowStatView x = st;
    x.data = static_cast<float*>(p);
    return x;
  };
  ForwardArgs f;
  f.scale = 1.f / std::sqrt(float(d));
  f.mask = causal ? MaskKind::kCausal : MaskKind::kFull;
  f.q = view(q, DType::kBF16);
  f.k = view(k, DType::kBF16);
  f.v = view(v, DType::kBF16);
  f.out = view(o16, DType::kBF16);
  f.lse = stat(lse);
  const double flops = ForwardFlops(1, heads, d, 0, s, 0, s, f.mask);
  const int reps = s >= 65536 ? 3 : (s >= 16384 ? 10 : 30);
  bool fok = true;
  const double fwd = TimeMs([&] { return be.Forward(f).ok(); }, reps, &fok);
  // fp32 partial that already holds a result: accumulate merges the same unit into it again.
  ForwardArgs fa = f;
  fa.out = view(o32, DType::kF32);
  fa.accumulate = false;
  fok = fok && be.Forward(fa).ok();
  fa.accumulate = true;
  const double fwd_acc = TimeMs([&] { return be.Forward(fa).ok(); }, reps, &fok);
  // Backward against the (bf16) final O of a fresh forward.
  fok = fok && be.Forward(f).ok();
  BackwardArgs b;
  b.scale = f.scale;
  b.mask = f.mask;
  b.q = f.q;
  b.k = f.k;
  b.v = f.v;
  b.dout = view(dout, DType::kBF16);
  b.out = f.out;
  b.lse = stat(lse);
  b.delta = stat(delta);
  b.dq = view(dq, DType::kF32);
  b.dk = view(dk, DType::kF32);
  b.dv = view(dv, DType::kF32);
  const bool needs_delta = name != "cudnn";
  const double bwd = TimeMs(
      [&] {
        if (needs_delta && !be.ComputeDelta(b.dout, b.out, b.delta, nullptr).ok()) return false;
        return be.Backward(b).ok();
      },
      reps, &fok);
  if (!fok) std::fprintf(stderr, "%s: a call failed at D=%d S=%lld\n", name.c_str(), d, static_cast<long long>(s));
  std::printf("| %s%s | %d | %lldK | %s | %.3f | %.1f | %.3f | %.1f | %.3f | %.1f |\n", name.c_str(), tag.c_str(), d,
              static_cast<long long>(s / 1024), causal ? "yes" : "no", fwd, flops / fwd / 1e9, fwd_acc,
              flops / fwd_acc / 1e9, bwd, 2.5 * flops / bwd / 1e9);
  std::fflush(stdout);
  for (void* p : bufs) be.Free(p);
  return fok;
}

int Main(int argc, char** argv) {
  bool quick = false;
  std::string backends = "cudnn,cuda";
  cuda::KernelChoice choice;
  for (int i = 1; i < argc; ++i) {
    std::string error;
    if (testing::ParseKernelFlag(argc, argv, &i, &choice, &error)) {
      if (!error.empty()) {
        std::fprintf(stderr, "%s\n", error.c_str());
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--backends") && i + 1 < argc) {
      backends = argv[++i];
    } else {
      std::fprintf(stderr, "unknown flag %s (see the comment at the top of cudnn_bench.cc)\n",
                   argv[i]);
      return 2;
    }
  }
  const std::string tag = testing::KernelTag(choice);
  std::printf("| backend | D | S | causal | fwd ms | fwd TFLOP/s | fwd-acc ms | fwd-acc TFLOP/s | bwd ms | bwd TFLOP/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  int failures = 0;
  for (const std::string& name : std::vector<std::string>(absl::StrSplit(backends, ','))) {
    absl::StatusOr<std::unique_ptr<AttentionBackend>> be_or =
        absl::UnavailableError("backends: expected cudnn or cuda");
    if (name == "cuda") be_or = CreateCudaBackend({}, choice);
    if (name == "cudnn") {
      auto cudnn = CreateCudnnBackend({}, choice);
      if (cudnn.ok()) {
        be_or = std::unique_ptr<AttentionBackend>(std::move(*cudnn));
      } else {
        be_or = cudnn.status();
      }
    }
    if (!be_or.ok()) {
      std::fprintf(stderr, "backend %s unavailable: %s\n", name.c_str(), be_or.status().ToString().c_str());
      ++failures;
      continue;
    }
    for (int d : quick ? std::vector<int>{128} : std::vector<int>{128, 64}) {
      for (int64_t s : quick ? std::vector<int64_t>{16384, 65536} : std::vector<int64_t>{4096, 16384, 65536}) {
        for (bool causal : {true, false}) failures += RunConfig(**be_or, name, tag, d, s, causal) ? 0 : 1;
      }
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace dfa

int main(int argc, char** argv) { return dfa::Main(argc, argv); }
