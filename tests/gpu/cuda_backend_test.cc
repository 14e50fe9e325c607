// The CUDA backend against the fp64 reference (kernels/reference) and against the CPU backend,
// over shapes whose lengths are not tile multiples, global offsets, GQA, both masks and both
// dtypes, for every kernel the table of kernels/cuda/kernel_dispatch.h can run (forced through
// cuda::KernelChoice: the Hopper kernels are skipped on other GPUs). Tolerances derive from the
// dtype's unit roundoff. Skips cleanly without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <ostream>
#include <vector>

#include "kernels/attention_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/gpu/kernel_flags.h"
#include "tests/gpu/unit_inputs.h"

namespace dfa {
namespace {

using testing::Eps;
using testing::RandomRounded;
using testing::ReferenceAttention;
using testing::RelError;
using testing::UnitShape;
using testing::Inputs;
using testing::MakeInputs;
using testing::Stat;
using testing::View;

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto probe = CreateBackend("cuda", {});
    if (!probe.ok()) GTEST_SKIP() << "no usable GPU: " << probe.status();
    auto b = CreateCudaBackend({}, Choice());
    if (absl::IsInvalidArgument(b.status())) GTEST_SKIP() << "not on this GPU: " << b.status();
    ASSERT_TRUE(b.ok()) << b.status();
    be_ = std::move(*b);
  }
  // The kernels under test (default: the table).
  virtual cuda::KernelChoice Choice() const { return {}; }
  void TearDown() override {
    for (void* p : allocs_) be_->Free(p);
  }
  void* Upload(const void* host, size_t bytes) {
    auto p = be_->Alloc(bytes);
    EXPECT_TRUE(p.ok());
    allocs_.push_back(*p);
    EXPECT_TRUE(be_->Copy(*p, host, bytes, AttentionBackend::CopyKind::kHostToDevice, nullptr).ok());
    return *p;
  }
  template <typename T>
  std::vector<T> Download(const void* dev, size_t count) {
    std::vector<T> h(count);
    EXPECT_TRUE(be_->Copy(h.data(), dev, count * sizeof(T), AttentionBackend::CopyKind::kDeviceToHost, nullptr).ok());
    EXPECT_TRUE(be_->Synchronize(nullptr).ok());
    return h;
  }
  // Device buffer of `count` floats filled with a poison value.
  float* Poisoned(size_t count, float value) {
    std::vector<float> h(count, value);
    return static_cast<float*>(Upload(h.data(), count * sizeof(float)));
  }

  std::unique_ptr<AttentionBackend> be_;
  std::vector<void*> allocs_;
};

// The kernel tests run once per kernel choice: the table, each fallback kernel forced, and the
// pipe backward's causal tile orders (the table picks chunks of 4 at these grid sizes).
struct KernelCase {
  const char* name;
  cuda::KernelChoice choice;
};
// Test names and gtest output show the case by its name.
void PrintTo(const KernelCase& c, std::ostream* os) { *os << c.name; }
std::vector<KernelCase> KernelCases() {
  std::vector<KernelCase> cases;
  cases.push_back({"table", {}});
  cuda::KernelChoice c;
  c.forward = cuda::FwdKernel::kSm90CpAsync;
  c.backward = cuda::BwdKernel::kSm90CpAsync;
  cases.push_back({"sm90_cpasync", c});
  c.forward = cuda::FwdKernel::kMmaSync;
  c.backward = cuda::BwdKernel::kMmaSync;
  cases.push_back({"mma_sync", c});
  c = {};
  c.bwd_tile_chunk = 0;
  cases.push_back({"grid_order", c});
  c.bwd_tile_chunk = 3;
  cases.push_back({"chunks_of_3", c});
  return cases;
}

class CudaKernelTest : public CudaBackendTest, public ::testing::WithParamInterface<KernelCase> {
 protected:
  cuda::KernelChoice Choice() const override { return GetParam().choice; }
};
INSTANTIATE_TEST_SUITE_P(Kernels, CudaKernelTest, ::testing::ValuesIn(KernelCases()),
                         [](const ::testing::TestParamInfo<KernelCase>& i) { return i.param.name; });

// The grid: tails, offsets (some rows see no key), GQA and MQA, batch 2, both masks/dtypes.
std::vector<UnitShape> Grid() {
  std::vector<UnitShape> g;
  auto add = [&](DType t, int d, int64_t m, int64_t n, int hq, int hk, int64_t q0, int64_t k0, MaskKind mk, int b = 1) {
    UnitShape s;
    s.dtype = t, s.head_dim = d, s.m = m, s.n = n, s.q_heads = hq, s.kv_heads = hk;
    s.q_row0 = q0, s.kv_row0 = k0, s.mask = mk, s.batch = b;
    g.push_back(s);
  };
  add(DType::kBF16, 128, 200, 200, 4, 4, 0, 0, MaskKind::kCausal);
  add(DType::kBF16, 64, 77, 301, 4, 1, 0, 0, MaskKind::kFull);
  add(DType::kF16, 128, 130, 97, 6, 2, 150, 100, MaskKind::kCausal);
  add(DType::kF16, 64, 100, 150, 2, 2, 10, 50, MaskKind::kCausal);
  add(DType::kBF16, 128, 129, 65, 2, 1, 0, 0, MaskKind::kFull, 2);
  add(DType::kF16, 128, 64, 192, 4, 2, 300, 0, MaskKind::kCausal);
  add(DType::kBF16, 64, 257, 129, 8, 2, 128, 0, MaskKind::kCausal);
  return g;
}

TEST_P(CudaKernelTest, ForwardAndBackwardMatchFp64Reference) {
  uint64_t seed = 1234;
  for (const UnitShape& s : Grid()) {
    SCOPED_TRACE(::testing::Message() << "dtype=" << DTypeName(s.dtype) << " D=" << s.head_dim << " m=" << s.m
                                      << " n=" << s.n << " Hq=" << s.q_heads << " Hkv=" << s.kv_heads
                                      << " q0=" << s.q_row0 << " k0=" << s.kv_row0
                                      << " causal=" << (s.mask == MaskKind::kCausal) << " B=" << s.batch);
    const Inputs in = MakeInputs(s, seed += 10);
    const float scale = 1.f / std::sqrt(float(s.head_dim));
    const auto ref = ReferenceAttention(s, in.q, in.k, in.v, &in.dout, scale);
    const size_t nq = in.q.size(), nk = in.k.size(), nstat = size_t(s.batch) * s.q_heads * s.m;

    void* q = Upload(in.qb.data(), nq * 2);
    void* k = Upload(in.kb.data(), nk * 2);
    void* v = Upload(in.vb.data(), nk * 2);
    void* dout = Upload(in.dob.data(), nq * 2);
    float* out = Poisoned(nq, NAN);
    float* lse = Poisoned(nstat, NAN);
    void* out16 = Upload(std::vector<uint16_t>(nq, 0x7fff).data(), nq * 2);
    float* lse16 = Poisoned(nstat, NAN);

    ForwardArgs f;
    f.scale = scale;
    f.mask = s.mask;
    f.q = View(q, s.dtype, s, false);
    f.k = View(k, s.dtype, s, true);
    f.v = View(v, s.dtype, s, true);
    f.q_row0 = s.q_row0;
    f.kv_row0 = s.kv_row0;
    f.out = View(out, DType::kF32, s, false);
    f.lse = Stat(lse, s);
    ASSERT_TRUE(be_->Forward(f).ok());
    f.out = View(out16, s.dtype, s, false);
    f.lse = Stat(lse16, s);
    ASSERT_TRUE(be_->Forward(f).ok());

    const auto out_h = Download<float>(out, nq);
    const auto lse_h = Download<float>(lse, nstat);
    const auto out16_bits = Download<uint16_t>(out16, nq);
    std::vector<float> out16_h(nq);
    for (size_t i = 0; i < nq; ++i) out16_h[i] = LoadAsFloat(out16_bits.data(), s.dtype, int64_t(i));
    EXPECT_LT(RelError(out_h, ref.out), 2 * Eps(s.dtype));
    EXPECT_LT(RelError(out16_h, ref.out), 3 * Eps(s.dtype));
    for (size_t i = 0; i < nstat; ++i) {
      if (std::isinf(ref.lse[i])) {
        ASSERT_TRUE(std::isinf(lse_h[i]) && lse_h[i] < 0) << "row " << i << " sees no key: lse " << lse_h[i];
      } else {
        ASSERT_NEAR(lse_h[i], ref.lse[i], 4 * Eps(s.dtype)) << "row " << i;
      }
    }

    // Backward with += semantics: start from known non-zero gradients.
    float* delta = Poisoned(nstat, NAN);
    ASSERT_TRUE(be_->ComputeDelta(View(dout, s.dtype, s, false), View(out, DType::kF32, s, false),
                                  Stat(delta, s), nullptr).ok());
    float* dq = Poisoned(nq, 0.5f);
    float* dk = Poisoned(nk, -0.25f);
    float* dv = Poisoned(nk, 1.0f);
    BackwardArgs bw;
    bw.scale = scale;
    bw.mask = s.mask;
    bw.q = f.q;
    bw.k = f.k;
    bw.v = f.v;
    bw.q_row0 = s.q_row0;
    bw.kv_row0 = s.kv_row0;
    bw.dout = View(dout, s.dtype, s, false);
    bw.lse = Stat(lse, s);
    bw.delta = Stat(delta, s);
    bw.dq = View(dq, DType::kF32, s, false);
    bw.dk = View(dk, DType::kF32, s, true);
    bw.dv = View(dv, DType::kF32, s, true);
    ASSERT_TRUE(be_->Backward(bw).ok());
    auto dq_h = Download<float>(dq, nq);
    auto dk_h = Download<float>(dk, nk);
    auto dv_h = Download<float>(dv, nk);
    for (auto& x : dq_h) x -= 0.5f;
    for (auto& x : dk_h) x += 0.25f;
    for (auto& x : dv_h) x -= 1.0f;
    EXPECT_LT(RelError(dq_h, ref.dq), 6 * Eps(s.dtype));
    EXPECT_LT(RelError(dk_h, ref.dk), 6 * Eps(s.dtype));
    EXPECT_LT(RelError(dv_h, ref.dv), 4 * Eps(s.dtype));
  }
}

// Two halves of the keys: Forward then Forward(accumulate), and two partials + Merge, both equal
// the whole unit.
TEST_P(CudaKernelTest, AccumulateAndMergeEqualTheWholeUnit) {
  UnitShape s;
  s.dtype = DType::kBF16, s.head_dim = 64, s.m = 150, s.n = 170, s.q_heads = 4, s.kv_heads = 2;
  s.q_row0 = 100, s.kv_row0 = 0, s.mask = MaskKind::kCausal;
  const Inputs in = MakeInputs(s, 77);
  const float scale = 0.125f;
  const auto ref = ReferenceAttention(s, in.q, in.k, in.v, nullptr, scale);
  const size_t nq = in.q.size(), nstat = size_t(s.q_heads) * s.m;
  void* q = Upload(in.qb.data(), nq * 2);
  void* k = Upload(in.kb.data(), in.kb.size() * 2);
  void* v = Upload(in.vb.data(), in.vb.size() * 2);
  const int64_t split = 90;
  auto half = [&](void* base, int64_t r0, int64_t rows) {
    TensorView t = View(base, s.dtype, s, true);
    return t.Slice(r0, rows);
  };
  ForwardArgs f;
  f.scale = scale;
  f.mask = s.mask;
  f.q = View(q, s.dtype, s, false);
  f.q_row0 = s.q_row0;
  float* out_a = Poisoned(nq, NAN);
  float* lse_a = Poisoned(nstat, NAN);
  float* out_b = Poisoned(nq, NAN);
  float* lse_b = Poisoned(nstat, NAN);
  float* out_c = Poisoned(nq, NAN);
  float* lse_c = Poisoned(nstat, NAN);
  // a: first half, then accumulate the second half.
  f.k = half(k, 0, split), f.v = half(v, 0, split), f.kv_row0 = 0;
  f.out = View(out_a, DType::kF32, s, false), f.lse = Stat(lse_a, s);
  ASSERT_TRUE(be_->Forward(f).ok());
  f.k = half(k, split, s.n - split), f.v = half(v, split, s.n - split), f.kv_row0 = split;
  f.accumulate = true;
  ASSERT_TRUE(be_->Forward(f).ok());
  // b = first half, c = second half, merged with Merge.
  f.accumulate = false;
  f.out = View(out_c, DType::kF32, s, false), f.lse = Stat(lse_c, s);
  ASSERT_TRUE(be_->Forward(f).ok());
  f.k = half(k, 0, split), f.v = half(v, 0, split), f.kv_row0 = 0;
  f.out = View(out_b, DType::kF32, s, false), f.lse = Stat(lse_b, s);
  ASSERT_TRUE(be_->Forward(f).ok());
  MergeArgs mg;
  mg.out_a = View(out_b, DType::kF32, s, false), mg.lse_a = Stat(lse_b, s);
  mg.out_b = View(out_c, DType::kF32, s, false), mg.lse_b = Stat(lse_c, s);
  ASSERT_TRUE(be_->Merge(mg).ok());
  for (float* o : {out_a, out_b}) {
    EXPECT_LT(RelError(Download<float>(o, nq), ref.out), 2 * Eps(s.dtype));
  }
  const auto la = Download<float>(lse_a, nstat), lb = Download<float>(lse_b, nstat);
  for (size_t i = 0; i < nstat; ++i) {
    ASSERT_NEAR(la[i], ref.lse[i], 4 * Eps(s.dtype));
    ASSERT_NEAR(lb[i], ref.lse[i], 4 * Eps(s.dtype));
  }
}

// Head dim 128 on non-dense views: Q rows padded, K and V
// interleaved in one buffer (as a packed KV chunk), batch 2, padded batch strides; forward in
// two key halves with accumulate equals the whole unit; causal and full.
TEST_P(CudaKernelTest, Hdim128StridedViewsAndAccumulate) {
  for (int variant = 0; variant < 3; ++variant) {
    const DType t = variant == 1 ? DType::kF16 : DType::kBF16;
    UnitShape s;
    s.dtype = t, s.head_dim = 128, s.m = 200, s.n = 300, s.q_heads = 4, s.kv_heads = 2;
    s.q_row0 = 60, s.kv_row0 = 0, s.batch = 2;
    s.mask = variant == 2 ? MaskKind::kFull : MaskKind::kCausal;
    SCOPED_TRACE(variant == 0 ? "bf16 causal" : variant == 1 ? "f16 causal" : "bf16 full");
    const Inputs in = MakeInputs(s, 91);
    const float scale = 0.088f;
    const auto ref = ReferenceAttention(s, in.q, in.k, in.v, nullptr, scale);
    const int64_t d = s.head_dim, q_rs = s.q_heads * d + 64, q_bs = s.m * q_rs + 128;
    const int64_t kv_rs = 2 * s.kv_heads * d, kv_bs = s.n * kv_rs + 64;
    std::vector<uint16_t> qh(size_t(s.batch) * q_bs, 0x7fc0), kvh(size_t(s.batch) * kv_bs, 0x7fc0);
    for (int b = 0; b < s.batch; ++b) {
      for (int64_t r = 0; r < s.m; ++r) {
        std::memcpy(&qh[b * q_bs + r * q_rs], &in.qb[(b * s.m + r) * s.q_heads * d], s.q_heads * d * 2);
      }
      for (int64_t r = 0; r < s.n; ++r) {
        const size_t src = (b * s.n + r) * s.kv_heads * d;
        std::memcpy(&kvh[b * kv_bs + r * kv_rs], &in.kb[src], s.kv_heads * d * 2);
        std::memcpy(&kvh[b * kv_bs + r * kv_rs + s.kv_heads * d], &in.vb[src], s.kv_heads * d * 2);
      }
    }
    char* q = static_cast<char*>(Upload(qh.data(), qh.size() * 2));
    char* kv = static_cast<char*>(Upload(kvh.data(), kvh.size() * 2));
    const size_t nq = in.q.size(), nstat = size_t(s.batch) * s.q_heads * s.m;
    ForwardArgs f;
    f.scale = scale;
    f.mask = s.mask;
    f.q = View(q, t, s, false), f.q.row_stride = q_rs, f.q.batch_stride = q_bs;
    f.q_row0 = s.q_row0;
    TensorView k = View(kv, t, s, true), v = View(kv + s.kv_heads * d * 2, t, s, true);
    k.row_stride = v.row_stride = kv_rs;
    k.batch_stride = v.batch_stride = kv_bs;
    float* out = Poisoned(nq, NAN);
    float* lse = Poisoned(nstat, NAN);
    f.out = View(out, DType::kF32, s, false), f.lse = Stat(lse, s);
    const int64_t split = 136;
    f.k = k.Slice(0, split), f.v = v.Slice(0, split), f.kv_row0 = 0;
    ASSERT_TRUE(be_->Forward(f).ok());
    f.k = k.Slice(split, s.n - split), f.v = v.Slice(split, s.n - split), f.kv_row0 = split;
    f.accumulate = true;
    ASSERT_TRUE(be_->Forward(f).ok());
    EXPECT_LT(RelError(Download<float>(out, nq), ref.out), 2 * Eps(t));
    const auto l = Download<float>(lse, nstat);
    for (size_t i = 0; i < nstat; ++i) ASSERT_NEAR(l[i], ref.lse[i], 4 * Eps(t)) << "row " << i;
    // The whole unit at once, out in the input dtype with a padded row stride.
    std::vector<uint16_t> oh(size_t(s.batch) * q_bs, 0);
    char* o16 = static_cast<char*>(Upload(oh.data(), oh.size() * 2));
    f.k = k, f.v = v, f.kv_row0 = 0, f.accumulate = false;
    f.out = View(o16, t, s, false), f.out.row_stride = q_rs, f.out.batch_stride = q_bs;
    ASSERT_TRUE(be_->Forward(f).ok());
    const auto o_bits = Download<uint16_t>(o16, oh.size());
    std::vector<float> o_dense(nq);
    for (int b = 0; b < s.batch; ++b)
      for (int64_t r = 0; r < s.m; ++r)
        for (int64_t c = 0; c < s.q_heads * d; ++c) {
          const uint16_t x = o_bits[b * q_bs + r * q_rs + c];
          o_dense[(b * s.m + r) * s.q_heads * d + c] = t == DType::kBF16 ? BF16ToFloat(x) : HalfToFloat(x);
        }
    EXPECT_LT(RelError(o_dense, ref.out), 4 * Eps(t));
  }
}

// A kernel choice outside its range, or a Hopper kernel forced on another GPU, is refused when
// the backend is created, with the reason.
TEST_F(CudaBackendTest, RejectsBadKernelChoices) {
  cuda::KernelChoice bad;
  bad.bwd_tile_chunk = 1000;
  auto b = CreateCudaBackend({}, bad);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("bwd_tile_chunk"), std::string::npos) << b.status();
  cuda::KernelChoice tma;
  tma.forward = cuda::FwdKernel::kSm90Tma;
  auto t = CreateCudaBackend({}, tma);
  if (!t.ok()) {
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find("compute capability 9.0"), std::string::npos) << t.status();
  }
  std::string error;
  cuda::KernelChoice parsed;
  const char* argv[] = {"bench", "--fwd-kernel", "tmx"};
  int i = 1;
  EXPECT_TRUE(testing::ParseKernelFlag(3, const_cast<char**>(argv), &i, &parsed, &error));
  EXPECT_NE(error.find("tmx"), std::string::npos) << error;
}

TEST_F(CudaBackendTest, RejectsUnsupportedHeadDimAndF32) {
  UnitShape s;
  s.head_dim = 96, s.m = 16, s.n = 16;
  std::vector<uint16_t> h(size_t(s.m) * s.q_heads * s.head_dim, 0);
  void* buf = Upload(h.data(), h.size() * 2);
  float* out = Poisoned(h.size(), 0.f);
  float* lse = Poisoned(size_t(s.q_heads) * s.m, 0.f);
  ForwardArgs f;
  f.scale = 0.1f;
  f.q = View(buf, s.dtype, s, false), f.k = View(buf, s.dtype, s, true), f.v = f.k;
  f.out = View(out, DType::kF32, s, false), f.lse = Stat(lse, s);
  absl::Status st = be_->Forward(f);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("head_dim"), std::string::npos) << st;
  s.head_dim = 64;
  f.q = View(out, DType::kF32, s, false), f.k = View(out, DType::kF32, s, true), f.v = f.k;
  f.out = View(out, DType::kF32, s, false);
  st = be_->Forward(f);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("dtype"), std::string::npos) << st;
}

// Same unit on the CPU backend (host memory) and on the GPU: outputs agree to the dtype's
// tolerance.
TEST_P(CudaKernelTest, AgreesWithCpuBackend) {
  auto cpu_or = CreateBackend("cpu", {});
  if (!cpu_or.ok()) GTEST_SKIP() << "cpu backend unavailable: " << cpu_or.status();
  auto& cpu = *cpu_or;
  UnitShape s;
  s.dtype = DType::kBF16, s.head_dim = 128, s.m = 190, s.n = 150, s.q_heads = 4, s.kv_heads = 2;
  s.q_row0 = 60, s.kv_row0 = 0, s.mask = MaskKind::kCausal;
  Inputs in = MakeInputs(s, 99);
  const float scale = 0.09f;
  const size_t nq = in.q.size(), nstat = size_t(s.q_heads) * s.m;
  std::vector<float> out_cpu(nq), lse_cpu(nstat);
  ForwardArgs f;
  f.scale = scale, f.mask = s.mask, f.q_row0 = s.q_row0, f.kv_row0 = s.kv_row0;
  f.q = View(in.qb.data(), s.dtype, s, false);
  f.k = View(in.kb.data(), s.dtype, s, true);
  f.v = View(in.vb.data(), s.dtype, s, true);
  f.out = View(out_cpu.data(), DType::kF32, s, false);
  f.lse = Stat(lse_cpu.data(), s);
  ASSERT_TRUE(cpu->Forward(f).ok());
  f.q.data = Upload(in.qb.data(), nq * 2);
  f.k.data = Upload(in.kb.data(), in.kb.size() * 2);
  f.v.data = Upload(in.vb.data(), in.vb.size() * 2);
  float* out = Poisoned(nq, NAN);
  float* lse = Poisoned(nstat, NAN);
  f.out.data = out;
  f.lse.data = lse;
  ASSERT_TRUE(be_->Forward(f).ok());
  const std::vector<double> ref(out_cpu.begin(), out_cpu.end());
  EXPECT_LT(RelError(Download<float>(out, nq), ref), 3 * Eps(s.dtype));
  const auto lse_gpu = Download<float>(lse, nstat);
  for (size_t i = 0; i < nstat; ++i) {
    if (std::isinf(lse_cpu[i])) {
      ASSERT_TRUE(std::isinf(lse_gpu[i]));
    } else {
      ASSERT_NEAR(lse_gpu[i], lse_cpu[i], 4 * Eps(s.dtype));
    }
  }
}

// D = rowsum(dO * O) for 16-bit O and dO (the backward pre-pass on the session's own rows: the
// vectorised head_dim-128 kernel) and for head_dim 64 (the generic one), against the host sum
// of the same rounded values; also on strided rows (a slice of a wider tensor).
TEST_F(CudaBackendTest, ComputeDeltaOf16BitRowsMatchesHostSums) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (int d : {128, 64}) {
      for (int pad_heads : {0, 2}) {  // 2: each row holds 2 more heads than the view reads
        UnitShape s;
        s.dtype = dt;
        s.batch = 2;
        s.q_heads = 3;
        s.head_dim = d;
        s.m = 77;
        const int64_t row_elems = int64_t{s.q_heads + pad_heads} * d;
        const size_t n = static_cast<size_t>(s.batch * s.m * row_elems);
        std::vector<uint16_t> dob, ob;
        const auto dof = RandomRounded(n, dt, 11 + d, &dob);
        const auto of = RandomRounded(n, dt, 23 + d, &ob);
        TensorView dout = View(Upload(dob.data(), n * 2), dt, s, false);
        TensorView out = View(Upload(ob.data(), n * 2), dt, s, false);
        for (TensorView* v : {&dout, &out}) {
          v->row_stride = row_elems;
          v->batch_stride = s.m * row_elems;
        }
        const size_t nstat = static_cast<size_t>(s.batch * s.q_heads * s.m);
        float* delta = Poisoned(nstat, NAN);
        ASSERT_TRUE(be_->ComputeDelta(dout, out, Stat(delta, s), nullptr).ok());
        const auto got = Download<float>(delta, nstat);
        for (int b = 0; b < s.batch; ++b) {
          for (int h = 0; h < s.q_heads; ++h) {
            for (int64_t r = 0; r < s.m; ++r) {
              double want = 0;
              const size_t base = static_cast<size_t>((b * s.m + r) * row_elems + int64_t{h} * d);
              for (int e = 0; e < d; ++e) want += double(dof[base + e]) * of[base + e];
              const float g = got[static_cast<size_t>((b * s.q_heads + h) * s.m + r)];
              ASSERT_NEAR(g, want, 1e-4 * (1 + std::abs(want)))
                  << "dtype " << static_cast<int>(dt) << " d " << d << " pad " << pad_heads
                  << " b " << b << " h " << h << " r " << r;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace dfa
