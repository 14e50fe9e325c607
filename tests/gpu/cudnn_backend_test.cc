// The "cudnn" backend against the fp64 reference and against our CUDA backend: global offsets
// (partial diagonals, rows that see nothing, units wholly masked), GQA/MQA, batch 2, both masks
// and dtypes, a head dim only cuDNN runs (96), fp32 and 16-bit outputs, accumulate, backward +=
// with the final O, the fallback to our kernels without it, and kIntervals units (always on our
// kernels). The unit tests run twice: with
// the table of kernels/cuda/kernel_dispatch.h (head dim 128 on our kernels on Hopper) and with
// every unit cuDNN can run on cuDNN (cuda::KernelChoice). Tolerances derive from the dtype's unit
// roundoff. Skips cleanly without a GPU or without libcudnn.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <ostream>
#include <vector>

#include "kernels/attention_backend.h"
#include "kernels/cuda/cudnn_backend.h"
#include "tests/gpu/mask_intervals_host.h"
#include "tests/gpu/masked_reference.h"
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

class CudnnBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = CreateCudnnBackend({}, Choice());
    if (!b.ok()) GTEST_SKIP() << "cudnn backend unavailable: " << b.status();
    be_ = std::move(*b);
    std::printf("cuDNN %s\n", be_->CudnnVersion().c_str());
  }
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
  float* Filled(size_t count, float value) {
    std::vector<float> h(count, value);
    return static_cast<float*>(Upload(h.data(), count * sizeof(float)));
  }
  std::vector<float> DownloadAsFloat(const void* dev, DType t, size_t count) {
    if (t == DType::kF32) return Download<float>(dev, count);
    const auto bits = Download<uint16_t>(dev, count);
    std::vector<float> f(count);
    for (size_t i = 0; i < count; ++i) f[i] = LoadAsFloat(bits.data(), t, int64_t(i));
    return f;
  }

  // The engine choice under test (default: the table).
  virtual cuda::KernelChoice Choice() const { return {}; }

  std::unique_ptr<CudnnAttentionBackend> be_;
  std::vector<void*> allocs_;
};

struct EngineCase {
  const char* name;
  cuda::KernelChoice choice;
};
// Test names and gtest output show the case by its name.
void PrintTo(const EngineCase& c, std::ostream* os) { *os << c.name; }
std::vector<EngineCase> EngineCases() {
  cuda::KernelChoice cudnn;
  cudnn.cudnn_forward = cuda::UnitEngine::kCudnn;
  cudnn.cudnn_backward = cuda::UnitEngine::kCudnn;
  return {{"table", {}}, {"cudnn", cudnn}};
}

class CudnnEngineTest : public CudnnBackendTest, public ::testing::WithParamInterface<EngineCase> {
 protected:
  cuda::KernelChoice Choice() const override { return GetParam().choice; }
};
INSTANTIATE_TEST_SUITE_P(Engines, CudnnEngineTest, ::testing::ValuesIn(EngineCases()),
                         [](const ::testing::TestParamInfo<EngineCase>& i) { return i.param.name; });

UnitShape Shape(DType t, int d, int64_t m, int64_t n, int hq, int hk, int64_t q0, int64_t k0, MaskKind mk,
                int b = 1) {
  UnitShape s;
  s.dtype = t, s.head_dim = d, s.m = m, s.n = n, s.q_heads = hq, s.kv_heads = hk;
  s.q_row0 = q0, s.kv_row0 = k0, s.mask = mk, s.batch = b;
  return s;
}

std::string Describe(const UnitShape& s) {
  return std::string(DTypeName(s.dtype)) + " D=" + std::to_string(s.head_dim) + " m=" + std::to_string(s.m) +
         " n=" + std::to_string(s.n) + " Hq=" + std::to_string(s.q_heads) + " Hkv=" + std::to_string(s.kv_heads) +
         " q0=" + std::to_string(s.q_row0) + " k0=" + std::to_string(s.kv_row0) +
         (s.mask == MaskKind::kCausal ? " causal" : " full") + " B=" + std::to_string(s.batch);
}

// Diagonal, band (q ahead of k), leading empty rows (k ahead of q), wholly masked, full;
// lengths off the tile sizes; GQA 3:1, 4:1, MQA; batch 2; head dim 96 (cuDNN only).
std::vector<UnitShape> Grid() {
  const MaskKind C = MaskKind::kCausal, F = MaskKind::kFull;
  return {Shape(DType::kBF16, 128, 200, 200, 4, 4, 0, 0, C),
          Shape(DType::kBF16, 64, 77, 301, 4, 1, 0, 0, F),
          Shape(DType::kF16, 128, 130, 97, 6, 2, 150, 100, C),
          Shape(DType::kF16, 64, 100, 150, 2, 2, 10, 50, C),
          Shape(DType::kBF16, 128, 129, 65, 2, 1, 0, 0, F, 2),
          Shape(DType::kBF16, 128, 64, 192, 4, 2, 300, 0, C),
          Shape(DType::kBF16, 64, 257, 129, 8, 2, 128, 0, C),
          Shape(DType::kBF16, 128, 96, 80, 4, 4, 0, 500, C),
          Shape(DType::kBF16, 96, 120, 140, 4, 2, 60, 0, C)};
}

TEST_P(CudnnEngineTest, ForwardAndBackwardMatchFp64Reference) {
  uint64_t seed = 4321;
  for (const UnitShape& s : Grid()) {
    SCOPED_TRACE(Describe(s));
    const Inputs in = MakeInputs(s, seed += 10);
    const float scale = 1.f / std::sqrt(float(s.head_dim));
    const auto ref = ReferenceAttention(s, in.q, in.k, in.v, &in.dout, scale);
    const size_t nq = in.q.size(), nk = in.k.size(), nstat = size_t(s.batch) * s.q_heads * s.m;
    void* q = Upload(in.qb.data(), nq * 2);
    void* k = Upload(in.kb.data(), nk * 2);
    void* v = Upload(in.vb.data(), nk * 2);
    void* dout = Upload(in.dob.data(), nq * 2);
    const CudnnBackendCounters before = be_->Counters();

    for (DType out_t : {DType::kF32, s.dtype}) {
      SCOPED_TRACE(std::string("out ") + std::string(DTypeName(out_t)));
      void* out = out_t == DType::kF32 ? static_cast<void*>(Filled(nq, NAN))
                                       : Upload(std::vector<uint16_t>(nq, 0x7fff).data(), nq * 2);
      float* lse = Filled(nstat, NAN);
      ForwardArgs f;
      f.scale = scale;
      f.mask = s.mask;
      f.q = View(q, s.dtype, s, false);
      f.k = View(k, s.dtype, s, true);
      f.v = View(v, s.dtype, s, true);
      f.q_row0 = s.q_row0;
      f.kv_row0 = s.kv_row0;
      f.out = View(out, out_t, s, false);
      f.lse = Stat(lse, s);
      ASSERT_TRUE(be_->Forward(f).ok());
      EXPECT_LT(RelError(DownloadAsFloat(out, out_t, nq), ref.out), 3 * Eps(s.dtype));
      const auto lse_h = Download<float>(lse, nstat);
      for (size_t i = 0; i < nstat; ++i) {
        if (std::isinf(ref.lse[i])) {
          ASSERT_TRUE(std::isinf(lse_h[i]) && lse_h[i] < 0) << "row " << i << " sees no key: lse " << lse_h[i];
        } else {
          ASSERT_NEAR(lse_h[i], ref.lse[i], 4 * Eps(s.dtype)) << "row " << i;
        }
      }

      // Backward with the final O in this dtype: += into non-zero gradients.
      float* delta = Filled(nstat, NAN);
      ASSERT_TRUE(be_->ComputeDelta(View(dout, s.dtype, s, false), f.out, Stat(delta, s), nullptr).ok());
      float* dq = Filled(nq, 0.5f);
      float* dk = Filled(nk, -0.25f);
      float* dv = Filled(nk, 1.0f);
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
      bw.out = f.out;
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
      // cuDNN rounds each unit's gradients to the dtype once before our fp32 +=.
      EXPECT_LT(RelError(dq_h, ref.dq), 8 * Eps(s.dtype));
      EXPECT_LT(RelError(dk_h, ref.dk), 8 * Eps(s.dtype));
      EXPECT_LT(RelError(dv_h, ref.dv), 6 * Eps(s.dtype));
    }
    const CudnnBackendCounters after = be_->Counters();
    EXPECT_EQ(after.fallback_forward, before.fallback_forward) << after.last_fallback_reason;
    EXPECT_EQ(after.fallback_backward, before.fallback_backward) << after.last_fallback_reason;
    // Forward units run on cuDNN or, by choice (head dim 128 on Hopper), on our kernels.
    EXPECT_EQ(after.cudnn_forward + after.own_forward - before.cudnn_forward - before.own_forward, 2);
    EXPECT_EQ(after.cudnn_backward + after.own_backward - before.cudnn_backward - before.own_backward, 2);
  }
}

// A causal sequence of 3 chunks processed unit by unit as the executor does: forward partials
// LSE-merged with `accumulate` in an fp32 output, then every unit's backward with the final O
// and LSE; the result equals the whole sequence's reference.
TEST_P(CudnnEngineTest, ChunkedSequenceWithAccumulateEqualsWholeSequence) {
  const int64_t kChunk = 96, kChunks = 3, S = kChunk * kChunks;
  UnitShape whole = Shape(DType::kBF16, 128, S, S, 4, 2, 0, 0, MaskKind::kCausal);
  const Inputs in = MakeInputs(whole, 77);
  const float scale = 1.f / std::sqrt(128.f);
  const auto ref = ReferenceAttention(whole, in.q, in.k, in.v, &in.dout, scale);
  const size_t nq = in.q.size(), nk = in.k.size(), nstat = size_t(whole.q_heads) * S;
  void* q = Upload(in.qb.data(), nq * 2);
  void* k = Upload(in.kb.data(), nk * 2);
  void* v = Upload(in.vb.data(), nk * 2);
  void* dout = Upload(in.dob.data(), nq * 2);
  float* out = Filled(nq, NAN);
  float* lse = Filled(nstat, NAN);
  const TensorView qv = View(q, whole.dtype, whole, false), kv = View(k, whole.dtype, whole, true),
                   vv = View(v, whole.dtype, whole, true), ov = View(out, DType::kF32, whole, false);
  const RowStatView lv = Stat(lse, whole);
  // Key chunks in reverse order so the first unit of a row block is the most masked one.
  for (int64_t i = 0; i < kChunks; ++i) {
    for (int64_t j = kChunks - 1; j >= 0; --j) {
      ForwardArgs f;
      f.scale = scale;
      f.mask = MaskKind::kCausal;
      f.q = qv.Slice(i * kChunk, kChunk);
      f.q_row0 = i * kChunk;
      f.k = kv.Slice(j * kChunk, kChunk);
      f.v = vv.Slice(j * kChunk, kChunk);
      f.kv_row0 = j * kChunk;
      f.out = ov.Slice(i * kChunk, kChunk);
      f.lse = lv.Slice(i * kChunk, kChunk);
      f.accumulate = j != kChunks - 1;
      ASSERT_TRUE(be_->Forward(f).ok()) << i << "," << j;
    }
  }
  EXPECT_LT(RelError(Download<float>(out, nq), ref.out), 3 * Eps(whole.dtype));
  const auto lse_h = Download<float>(lse, nstat);
  for (size_t i = 0; i < nstat; ++i) ASSERT_NEAR(lse_h[i], ref.lse[i], 4 * Eps(whole.dtype)) << i;

  float* delta = Filled(nstat, NAN);
  ASSERT_TRUE(be_->ComputeDelta(View(dout, whole.dtype, whole, false), ov, Stat(delta, whole), nullptr).ok());
  float* dq = Filled(nq, 0.f);
  float* dk = Filled(nk, 0.f);
  float* dv = Filled(nk, 0.f);
  const TensorView dov = View(dout, whole.dtype, whole, false), dqv = View(dq, DType::kF32, whole, false),
                   dkv = View(dk, DType::kF32, whole, true), dvv = View(dv, DType::kF32, whole, true);
  const RowStatView dl = Stat(delta, whole);
  for (int64_t i = 0; i < kChunks; ++i) {
    for (int64_t j = 0; j <= i; ++j) {
      BackwardArgs b;
      b.scale = scale;
      b.mask = MaskKind::kCausal;
      b.q = qv.Slice(i * kChunk, kChunk);
      b.q_row0 = i * kChunk;
      b.k = kv.Slice(j * kChunk, kChunk);
      b.v = vv.Slice(j * kChunk, kChunk);
      b.kv_row0 = j * kChunk;
      b.dout = dov.Slice(i * kChunk, kChunk);
      b.out = ov.Slice(i * kChunk, kChunk);
      b.lse = lv.Slice(i * kChunk, kChunk);
      b.delta = dl.Slice(i * kChunk, kChunk);
      b.dq = dqv.Slice(i * kChunk, kChunk);
      b.dk = dkv.Slice(j * kChunk, kChunk);
      b.dv = dvv.Slice(j * kChunk, kChunk);
      ASSERT_TRUE(be_->Backward(b).ok()) << i << "," << j;
    }
  }
  EXPECT_LT(RelError(Download<float>(dq, nq), ref.dq), 8 * Eps(whole.dtype));
  EXPECT_LT(RelError(Download<float>(dk, nk), ref.dk), 8 * Eps(whole.dtype));
  EXPECT_LT(RelError(Download<float>(dv, nk), ref.dv), 6 * Eps(whole.dtype));
  EXPECT_EQ(be_->Counters().fallback_forward, 0) << be_->Counters().last_fallback_reason;
  EXPECT_EQ(be_->Counters().fallback_backward, 0) << be_->Counters().last_fallback_reason;
}

// Without the final O (and no stand-in from D) the unit runs on our CUDA kernels, still exact.
TEST_F(CudnnBackendTest, BackwardWithoutFinalOFallsBackToOurKernels) {
  be_->SetOutFromDelta(false);
  const UnitShape s = Shape(DType::kF16, 64, 100, 150, 2, 2, 10, 50, MaskKind::kCausal);
  const Inputs in = MakeInputs(s, 99);
  const float scale = 0.125f;
  const auto ref = ReferenceAttention(s, in.q, in.k, in.v, &in.dout, scale);
  const size_t nq = in.q.size(), nk = in.k.size(), nstat = size_t(s.batch) * s.q_heads * s.m;
  void* q = Upload(in.qb.data(), nq * 2);
  void* k = Upload(in.kb.data(), nk * 2);
  void* v = Upload(in.vb.data(), nk * 2);
  void* dout = Upload(in.dob.data(), nq * 2);
  float* out = Filled(nq, 0.f);
  float* lse = Filled(nstat, 0.f);
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
  float* delta = Filled(nstat, NAN);
  ASSERT_TRUE(be_->ComputeDelta(View(dout, s.dtype, s, false), f.out, Stat(delta, s), nullptr).ok());
  float* dq = Filled(nq, 0.f);
  float* dk = Filled(nk, 0.f);
  float* dv = Filled(nk, 0.f);
  BackwardArgs bw;
  bw.scale = scale;
  bw.mask = s.mask;
  bw.q = f.q;
  bw.k = f.k;
  bw.v = f.v;
  bw.q_row0 = s.q_row0;
  bw.kv_row0 = s.kv_row0;
  bw.dout = View(dout, s.dtype, s, false);
  bw.lse = f.lse;
  bw.delta = Stat(delta, s);
  bw.dq = View(dq, DType::kF32, s, false);
  bw.dk = View(dk, DType::kF32, s, true);
  bw.dv = View(dv, DType::kF32, s, true);
  const int64_t fallbacks = be_->Counters().fallback_backward;
  ASSERT_TRUE(be_->Backward(bw).ok());
  EXPECT_EQ(be_->Counters().fallback_backward, fallbacks + 1);
  EXPECT_NE(be_->Counters().last_fallback_reason.find("out"), std::string::npos);
  EXPECT_LT(RelError(Download<float>(dq, nq), ref.dq), 6 * Eps(s.dtype));
  EXPECT_LT(RelError(Download<float>(dk, nk), ref.dk), 6 * Eps(s.dtype));
  EXPECT_LT(RelError(Download<float>(dv, nk), ref.dv), 4 * Eps(s.dtype));
}

// With SetOutFromDelta the same unit runs on cuDNN from a stand-in O built from D, as precise.
TEST_P(CudnnEngineTest, BackwardFromDeltaWithoutFinalORunsOnCudnn) {
  be_->SetOutFromDelta(true);
  for (const UnitShape& s : {Shape(DType::kBF16, 128, 160, 200, 4, 2, 100, 0, MaskKind::kCausal),
                             Shape(DType::kF16, 64, 100, 150, 2, 2, 10, 50, MaskKind::kCausal)}) {
    SCOPED_TRACE(Describe(s));
    const Inputs in = MakeInputs(s, 123);
    const float scale = 1.f / std::sqrt(float(s.head_dim));
    const auto ref = ReferenceAttention(s, in.q, in.k, in.v, &in.dout, scale);
    const size_t nq = in.q.size(), nk = in.k.size(), nstat = size_t(s.batch) * s.q_heads * s.m;
    void* q = Upload(in.qb.data(), nq * 2);
    void* k = Upload(in.kb.data(), nk * 2);
    void* v = Upload(in.vb.data(), nk * 2);
    void* dout = Upload(in.dob.data(), nq * 2);
    // The reference's own O and LSE (rounded to fp32) stand for the final ones.
    std::vector<float> lse_ref(nstat), out_ref(nq);
    for (size_t i = 0; i < nstat; ++i) lse_ref[i] = float(ref.lse[i]);
    for (size_t i = 0; i < nq; ++i) out_ref[i] = float(ref.out[i]);
    float* lse = static_cast<float*>(Upload(lse_ref.data(), nstat * 4));
    float* out = static_cast<float*>(Upload(out_ref.data(), nq * 4));
    float* delta = Filled(nstat, NAN);
    ASSERT_TRUE(be_->ComputeDelta(View(dout, s.dtype, s, false), View(out, DType::kF32, s, false), Stat(delta, s),
                                  nullptr).ok());
    float* dq = Filled(nq, 0.f);
    float* dk = Filled(nk, 0.f);
    float* dv = Filled(nk, 0.f);
    BackwardArgs bw;
    bw.scale = scale;
    bw.mask = s.mask;
    bw.q = View(q, s.dtype, s, false);
    bw.k = View(k, s.dtype, s, true);
    bw.v = View(v, s.dtype, s, true);
    bw.q_row0 = s.q_row0;
    bw.kv_row0 = s.kv_row0;
    bw.dout = View(dout, s.dtype, s, false);
    bw.lse = Stat(lse, s);
    bw.delta = Stat(delta, s);
    bw.dq = View(dq, DType::kF32, s, false);
    bw.dk = View(dk, DType::kF32, s, true);
    bw.dv = View(dv, DType::kF32, s, true);
    const CudnnBackendCounters before = be_->Counters();
    ASSERT_TRUE(be_->Backward(bw).ok());
    // Not a fallback: cuDNN (from the stand-in O), or our kernels by choice at head dim 128 on Hopper.
    const CudnnBackendCounters after = be_->Counters();
    EXPECT_EQ(after.fallback_backward, before.fallback_backward) << after.last_fallback_reason;
    EXPECT_EQ(after.cudnn_backward + after.own_backward, before.cudnn_backward + before.own_backward + 1);
    EXPECT_LT(RelError(Download<float>(dq, nq), ref.dq), 8 * Eps(s.dtype));
    EXPECT_LT(RelError(Download<float>(dk, nk), ref.dk), 8 * Eps(s.dtype));
    EXPECT_LT(RelError(Download<float>(dv, nk), ref.dv), 6 * Eps(s.dtype));
  }
}

// Same unit through "cuda" and "cudnn": outputs and LSE agree within the dtype's precision.
TEST_P(CudnnEngineTest, AgreesWithCudaBackend) {
  auto cuda_or = CreateBackend("cuda", {});
  ASSERT_TRUE(cuda_or.ok()) << cuda_or.status();
  AttentionBackend& cuda = **cuda_or;
  const UnitShape s = Shape(DType::kBF16, 128, 333, 517, 8, 2, 400, 0, MaskKind::kCausal);
  const Inputs in = MakeInputs(s, 5);
  const size_t nq = in.q.size(), nk = in.k.size(), nstat = size_t(s.batch) * s.q_heads * s.m;
  void* q = Upload(in.qb.data(), nq * 2);
  void* k = Upload(in.kb.data(), nk * 2);
  void* v = Upload(in.vb.data(), nk * 2);
  float* out_a = Filled(nq, NAN);
  float* lse_a = Filled(nstat, NAN);
  float* out_b = Filled(nq, NAN);
  float* lse_b = Filled(nstat, NAN);
  ForwardArgs f;
  f.scale = 0.09f;
  f.mask = s.mask;
  f.q = View(q, s.dtype, s, false);
  f.k = View(k, s.dtype, s, true);
  f.v = View(v, s.dtype, s, true);
  f.q_row0 = s.q_row0;
  f.kv_row0 = s.kv_row0;
  f.out = View(out_a, DType::kF32, s, false);
  f.lse = Stat(lse_a, s);
  ASSERT_TRUE(be_->Forward(f).ok());
  f.out = View(out_b, DType::kF32, s, false);
  f.lse = Stat(lse_b, s);
  ASSERT_TRUE(cuda.Forward(f).ok());
  const auto a = Download<float>(out_a, nq), b = Download<float>(out_b, nq);
  EXPECT_LT(RelError(a, std::vector<double>(b.begin(), b.end())), 3 * Eps(s.dtype));
  const auto la = Download<float>(lse_a, nstat), lb = Download<float>(lse_b, nstat);
  for (size_t i = 0; i < nstat; ++i) ASSERT_NEAR(la[i], lb[i], 4 * Eps(s.dtype)) << i;
}

// kIntervals units (documents + window, at global offsets) run on our kernels under every engine
// choice, counted as own_forward / own_backward (docs/kernels-cudnn.md), and match the fp64
// reference; head dim 64 (cuDNN's under the table) and 128.
TEST_P(CudnnEngineTest, IntervalUnitsRunOnOurKernels) {
  for (int d : {64, 128}) {
    SCOPED_TRACE(::testing::Message() << "D=" << d);
    UnitShape s = Shape(DType::kBF16, d, 300, 350, 4, 2, 200, 100, MaskKind::kCausal);
    testing::HostMask mask;
    mask.causal = true;
    mask.left = 90;
    mask.docs = {{0, 150, 151, 380, 600}};
    const testing::HostIntervals iv = testing::BuildIntervals(mask, 1, 600);
    const Inputs in = MakeInputs(s, 17 + d);
    const float scale = 1.f / std::sqrt(float(d));
    const auto ref = testing::MaskedReference(s, iv, in.q, in.k, in.v, &in.dout, scale);
    const size_t nq = in.q.size(), nk = in.k.size(), nstat = size_t(s.batch) * s.q_heads * s.m;
    const MaskIntervals div =
        testing::UploadIntervals(iv, [this](const void* h, size_t b) { return Upload(h, b); });
    ForwardArgs f;
    f.scale = scale;
    f.mask = MaskKind::kIntervals;
    f.intervals = div;
    f.q = View(Upload(in.qb.data(), nq * 2), s.dtype, s, false);
    f.k = View(Upload(in.kb.data(), nk * 2), s.dtype, s, true);
    f.v = View(Upload(in.vb.data(), nk * 2), s.dtype, s, true);
    f.q_row0 = s.q_row0;
    f.kv_row0 = s.kv_row0;
    float* out = Filled(nq, NAN);
    float* lse = Filled(nstat, NAN);
    f.out = View(out, DType::kF32, s, false);
    f.lse = Stat(lse, s);
    const CudnnBackendCounters before = be_->Counters();
    ASSERT_TRUE(be_->Forward(f).ok());
    EXPECT_LT(RelError(Download<float>(out, nq), ref.out), 2 * Eps(s.dtype));
    void* dout = Upload(in.dob.data(), nq * 2);
    float* delta = Filled(nstat, NAN);
    ASSERT_TRUE(be_->ComputeDelta(View(dout, s.dtype, s, false), f.out, Stat(delta, s), nullptr).ok());
    float* dq = Filled(nq, 0.f);
    float* dk = Filled(nk, 0.f);
    float* dv = Filled(nk, 0.f);
    BackwardArgs bw;
    bw.scale = scale;
    bw.mask = MaskKind::kIntervals;
    bw.intervals = div;
    bw.q = f.q, bw.k = f.k, bw.v = f.v, bw.q_row0 = s.q_row0, bw.kv_row0 = s.kv_row0;
    bw.dout = View(dout, s.dtype, s, false);
    bw.lse = f.lse;
    bw.delta = Stat(delta, s);
    bw.out = f.out;
    bw.dq = View(dq, DType::kF32, s, false);
    bw.dk = View(dk, DType::kF32, s, true);
    bw.dv = View(dv, DType::kF32, s, true);
    ASSERT_TRUE(be_->Backward(bw).ok());
    EXPECT_LT(RelError(Download<float>(dq, nq), ref.dq), 6 * Eps(s.dtype));
    EXPECT_LT(RelError(Download<float>(dk, nk), ref.dk), 6 * Eps(s.dtype));
    EXPECT_LT(RelError(Download<float>(dv, nk), ref.dv), 4 * Eps(s.dtype));
    const CudnnBackendCounters after = be_->Counters();
    EXPECT_EQ(after.own_forward - before.own_forward, 1);
    EXPECT_EQ(after.own_backward - before.own_backward, 1);
    EXPECT_EQ(after.cudnn_forward, before.cudnn_forward);
    EXPECT_EQ(after.cudnn_backward, before.cudnn_backward);
  }
}

// Convert (the executor's final O, packing of strided rows): fp32 -> bf16 and back between
// strided views (batch 2, rows padded), both the row kernel (32 x 128 elements per row) and the
// flat one (statistics: 1 element per row); every element must equal the host's rounding.
TEST_F(CudnnBackendTest, ConvertStridedRowsAndStatistics) {
  for (const int hd : {32 * 128, 1}) {
    const int batch = 2;
    const int64_t rows = 300, src_row = hd + 8, dst_row = hd + 16;
    std::vector<float> host(size_t(batch) * rows * src_row);
    for (size_t i = 0; i < host.size(); ++i) host[i] = std::sin(0.37 * double(i)) * 3.0;
    float* src = static_cast<float*>(Upload(host.data(), host.size() * 4));
    const size_t dst_count = size_t(batch) * rows * dst_row;
    void* dst = Upload(std::vector<uint16_t>(dst_count, 0).data(), dst_count * 2);
    TensorView a;
    a.data = src;
    a.dtype = DType::kF32;
    a.batch = batch;
    a.rows = rows;
    a.heads = hd == 1 ? 1 : 32;
    a.head_dim = hd == 1 ? 1 : 128;
    a.row_stride = src_row;
    a.batch_stride = rows * src_row;
    TensorView b = a;
    b.data = dst;
    b.dtype = DType::kBF16;
    b.row_stride = dst_row;
    b.batch_stride = rows * dst_row;
    ASSERT_TRUE(be_->Convert(a, b, nullptr).ok());
    const auto got = DownloadAsFloat(dst, DType::kBF16, dst_count);
    for (int bi = 0; bi < batch; ++bi) {
      for (int64_t r = 0; r < rows; ++r) {
        for (int c = 0; c < hd; ++c) {
          const float want = host[size_t(bi) * rows * src_row + r * src_row + c];
          const float have = got[size_t(bi) * rows * dst_row + r * dst_row + c];
          ASSERT_NEAR(have, want, std::abs(want) * 0.0079 + 1e-6) << "b " << bi << " r " << r << " c " << c;
        }
      }
    }
    // And back: bf16 -> fp32 is exact.
    TensorView c = a;
    c.data = Filled(host.size(), -1.f);
    ASSERT_TRUE(be_->Convert(b, c, nullptr).ok());
    const auto round_trip = Download<float>(c.data, host.size());
    for (int bi = 0; bi < batch; ++bi) {
      for (int64_t r = 0; r < rows; ++r) {
        for (int c2 = 0; c2 < hd; ++c2) {
          ASSERT_EQ(round_trip[size_t(bi) * rows * src_row + r * src_row + c2],
                    got[size_t(bi) * rows * dst_row + r * dst_row + c2]);
        }
      }
    }
  }
}

}  // namespace
}  // namespace dfa
