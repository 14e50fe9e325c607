// The CUDA backend's kIntervals mask (documents, sliding windows) against the fp64 reference of
// tests/gpu/masked_reference.h, forward and backward, for every kernel that can run it (the
// table: TMA forward + pipe backward on Hopper; the mma.sync pair forced; the sm90 cp.async
// choice, whose place the mma.sync kernels take): 1-token documents, documents crossing the
// kernels' tile boundaries (64 / 128 / 192 rows) and the unit's edges (q_row0 / kv_row0
// offsets), rows that see nothing (LSE -inf, O 0, no NaN, no gradient), windows from 0 to S,
// causal and not, GQA, head dims 64 and 128, bf16 and f16, batch rows with their own documents.
// Also (no GPU needed): the tests' interval builder equals brute force over every pair and
// core/mask.h BuildMaskIntervals. A bad MaskIntervals is refused naming the field. The GPU
// tests skip cleanly without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "kernels/attention_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/gpu/mask_intervals_host.h"
#include "tests/gpu/masked_reference.h"
#include "tests/gpu/unit_inputs.h"

namespace dfa {
namespace {

using testing::BuildIntervals;
using testing::BuildIntervalsBruteForce;
using testing::Eps;
using testing::HostIntervals;
using testing::HostMask;
using testing::Inputs;
using testing::MakeInputs;
using testing::MaskedReference;
using testing::RelError;
using testing::Stat;
using testing::UnitShape;
using testing::View;

struct KernelCase {
  const char* name;
  cuda::KernelChoice choice;
};
void PrintTo(const KernelCase& c, std::ostream* os) { *os << c.name; }
std::vector<KernelCase> KernelCases() {
  std::vector<KernelCase> cases;
  cases.push_back({"table", {}});
  cuda::KernelChoice c;
  c.forward = cuda::FwdKernel::kMmaSync;
  c.backward = cuda::BwdKernel::kMmaSync;
  cases.push_back({"mma_sync", c});
  c.forward = cuda::FwdKernel::kSm90CpAsync;
  c.backward = cuda::BwdKernel::kSm90CpAsync;
  cases.push_back({"sm90_cpasync", c});
  return cases;
}

// One masked unit: its shape (s.mask is ignored), the whole sequence length and the mask.
struct MaskCase {
  std::string name;
  UnitShape s;
  int64_t seq = 0;
  HostMask mask;
};

MaskCase Case(std::string name, DType t, int d, int hq, int hk, int64_t seq, int64_t q0, int64_t m,
              int64_t k0, int64_t n, HostMask mask, int batch = 1) {
  MaskCase c;
  c.name = std::move(name);
  c.s.dtype = t, c.s.head_dim = d, c.s.q_heads = hq, c.s.kv_heads = hk, c.s.batch = batch;
  c.s.q_row0 = q0, c.s.m = m, c.s.kv_row0 = k0, c.s.n = n;
  c.seq = seq;
  c.mask = std::move(mask);
  return c;
}
HostMask Docs(std::vector<int64_t> lengths, bool causal, int64_t left = -1, int64_t right = -1) {
  HostMask m;
  m.causal = causal, m.left = left, m.right = right;
  std::vector<int64_t> o{0};
  for (int64_t l : lengths) o.push_back(o.back() + l);
  m.docs = {o};
  return m;
}

std::vector<MaskCase> Cases() {
  std::vector<MaskCase> c;
  const DType bf = DType::kBF16, f16 = DType::kF16;
  // Documents crossing the 64 / 128 / 192-row tiles, whole sequence in one unit.
  c.push_back(Case("docs_causal_d128", bf, 128, 4, 2, 600, 0, 600, 0, 600,
                   Docs({1, 127, 130, 64, 193, 1, 45, 39}, true)));
  c.push_back(Case("docs_full_d64", f16, 64, 4, 4, 520, 0, 520, 0, 520,
                   Docs({200, 1, 1, 1, 129, 188}, false)));
  // 1-token documents only (every row sees exactly itself), and mixed with long ones.
  {
    std::vector<int64_t> ones(300, 1);
    c.push_back(Case("one_token_docs_d64", bf, 64, 2, 1, 300, 0, 300, 0, 300, Docs(ones, true)));
  }
  c.push_back(Case("one_token_mixed_d128", f16, 128, 2, 2, 400, 0, 400, 0, 400,
                   Docs({1, 1, 1, 250, 1, 1, 145}, false)));
  // Unit edges: queries and keys at global offsets, documents crossing them; some rows of the
  // unit see none of its keys (their documents end before kv_row0 + n starts, or start after).
  c.push_back(Case("offsets_causal_d128", bf, 128, 4, 1, 700, 300, 190, 150, 250,
                   Docs({100, 180, 70, 190, 160}, true)));
  c.push_back(Case("offsets_rows_see_nothing_d64", f16, 64, 2, 2, 800, 500, 200, 250, 260,
                   Docs({260, 250, 290}, false)));
  c.push_back(Case("offsets_full_block_d64", bf, 64, 4, 2, 900, 640, 260, 300, 300,
                   Docs({400, 500}, true)));
  // Windows from 0 to S, causal (left only), one document.
  for (int64_t w : {0, 1, 63, 128, 200, 511, 512}) {
    c.push_back(Case("causal_window_" + std::to_string(w), w % 2 ? bf : f16, w < 100 ? 64 : 128,
                     2, 1, 512, 0, 512, 0, 512, Docs({512}, true, w)));
  }
  // Non-causal windows (left and right), with documents, and causal + window + documents.
  c.push_back(Case("window_50_70_docs", bf, 128, 2, 2, 600, 0, 600, 0, 600,
                   Docs({300, 1, 299}, false, 50, 70)));
  c.push_back(Case("window_right_only", f16, 64, 2, 1, 400, 0, 400, 0, 400,
                   Docs({400}, false, -1, 30)));
  c.push_back(Case("causal_window_docs_offsets", bf, 64, 4, 2, 1000, 400, 300, 250, 400,
                   Docs({350, 2, 300, 348}, true, 100)));
  // Two batch rows, each with its own documents.
  {
    HostMask m;
    m.causal = true;
    m.docs = {{0, 100, 101, 330, 400}, {0, 1, 257, 400}};
    c.push_back(Case("batch2_own_docs", bf, 128, 2, 2, 400, 0, 400, 0, 400, m, 2));
  }
  return c;
}

class CudaIntervalsTest : public ::testing::TestWithParam<KernelCase> {
 protected:
  void SetUp() override {
    auto probe = CreateBackend("cuda", {});
    if (!probe.ok()) GTEST_SKIP() << "no usable GPU: " << probe.status();
    auto b = CreateCudaBackend({}, GetParam().choice);
    if (absl::IsInvalidArgument(b.status())) GTEST_SKIP() << "not on this GPU: " << b.status();
    ASSERT_TRUE(b.ok()) << b.status();
    be_ = std::move(*b);
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
  MaskIntervals UploadIntervals(const HostIntervals& iv) {
    return testing::UploadIntervals(iv, [this](const void* h, size_t b) { return Upload(h, b); });
  }
  // The forward `f` over its keys in two parts split at `split` (the second accumulated into the
  // first's fp32 partial) equals the reference output.
  void ExpectSplitForwardMatches(const ForwardArgs& f, const UnitShape& s,
                                 const std::vector<double>& ref_out, int64_t split) {
    const size_t nq = size_t(s.batch) * s.m * s.q_heads * s.head_dim;
    const size_t nstat = size_t(s.batch) * s.q_heads * s.m;
    float* out_acc = Filled(nq, NAN);
    ForwardArgs fa = f;
    fa.out = View(out_acc, DType::kF32, s, false);
    fa.lse = Stat(Filled(nstat, NAN), s);
    fa.k = f.k.Slice(0, split), fa.v = f.v.Slice(0, split);
    ASSERT_TRUE(be_->Forward(fa).ok());
    fa.k = f.k.Slice(split, s.n - split), fa.v = f.v.Slice(split, s.n - split);
    fa.kv_row0 = s.kv_row0 + split;
    fa.accumulate = true;
    ASSERT_TRUE(be_->Forward(fa).ok());
    EXPECT_LT(RelError(Download<float>(out_acc, nq), ref_out), 2 * Eps(s.dtype)) << "split at " << split;
  }

  std::unique_ptr<AttentionBackend> be_;
  std::vector<void*> allocs_;
};
INSTANTIATE_TEST_SUITE_P(Kernels, CudaIntervalsTest, ::testing::ValuesIn(KernelCases()),
                         [](const ::testing::TestParamInfo<KernelCase>& i) { return i.param.name; });

TEST_P(CudaIntervalsTest, ForwardAndBackwardMatchFp64Reference) {
  uint64_t seed = 4321;
  for (const MaskCase& c : Cases()) {
    const UnitShape& s = c.s;
    SCOPED_TRACE(::testing::Message() << c.name << " dtype=" << DTypeName(s.dtype) << " D=" << s.head_dim
                                      << " q=[" << s.q_row0 << "+" << s.m << ") k=[" << s.kv_row0 << "+"
                                      << s.n << ") S=" << c.seq);
    const HostIntervals iv = BuildIntervals(c.mask, s.batch, c.seq);
    const Inputs in = MakeInputs(s, seed += 10);
    const float scale = 1.f / std::sqrt(float(s.head_dim));
    const auto ref = MaskedReference(s, iv, in.q, in.k, in.v, &in.dout, scale);
    const size_t nq = in.q.size(), nk = in.k.size(), nstat = size_t(s.batch) * s.q_heads * s.m;
    const MaskIntervals div = UploadIntervals(iv);

    void* q = Upload(in.qb.data(), nq * 2);
    void* k = Upload(in.kb.data(), nk * 2);
    void* v = Upload(in.vb.data(), nk * 2);
    void* dout = Upload(in.dob.data(), nq * 2);
    float* out = Filled(nq, NAN);
    float* lse = Filled(nstat, NAN);
    void* out16 = Upload(std::vector<uint16_t>(nq, 0x7fff).data(), nq * 2);

    ForwardArgs f;
    f.scale = scale;
    f.mask = MaskKind::kIntervals;
    f.intervals = div;
    f.q = View(q, s.dtype, s, false);
    f.k = View(k, s.dtype, s, true);
    f.v = View(v, s.dtype, s, true);
    f.q_row0 = s.q_row0;
    f.kv_row0 = s.kv_row0;
    f.out = View(out, DType::kF32, s, false);
    f.lse = Stat(lse, s);
    ASSERT_TRUE(be_->Forward(f).ok());
    const auto out_h = Download<float>(out, nq);
    const auto lse_h = Download<float>(lse, nstat);
    EXPECT_LT(RelError(out_h, ref.out), 2 * Eps(s.dtype));
    int empty_rows = 0;
    for (size_t i = 0; i < nstat; ++i) {
      if (std::isinf(ref.lse[i])) {
        ++empty_rows;
        ASSERT_TRUE(std::isinf(lse_h[i]) && lse_h[i] < 0) << "stat " << i << " sees no key: lse " << lse_h[i];
      } else {
        ASSERT_NEAR(lse_h[i], ref.lse[i], 4 * Eps(s.dtype)) << "stat " << i;
      }
    }
    for (size_t i = 0; i < nq; ++i) {
      ASSERT_TRUE(std::isfinite(out_h[i])) << "out " << i;
      if (ref.out[i] == 0.0) {
        ASSERT_EQ(out_h[i], 0.f) << "out " << i << " of a row that sees nothing";
      }
    }
    // The same into q's dtype.
    f.out = View(out16, s.dtype, s, false);
    f.lse = Stat(Filled(nstat, NAN), s);
    ASSERT_TRUE(be_->Forward(f).ok());
    const auto out16_bits = Download<uint16_t>(out16, nq);
    std::vector<float> out16_h(nq);
    for (size_t i = 0; i < nq; ++i) out16_h[i] = LoadAsFloat(out16_bits.data(), s.dtype, int64_t(i));
    EXPECT_LT(RelError(out16_h, ref.out), 3 * Eps(s.dtype));

    // Forward over the keys in two parts (split inside a document), the second accumulated.
    ExpectSplitForwardMatches(f, s, ref.out, s.n * 3 / 7);

    // Backward with += semantics from known non-zero gradients.
    float* delta = Filled(nstat, NAN);
    ASSERT_TRUE(be_->ComputeDelta(View(dout, s.dtype, s, false), View(out, DType::kF32, s, false),
                                  Stat(delta, s), nullptr).ok());
    float* dq = Filled(nq, 0.5f);
    float* dk = Filled(nk, -0.25f);
    float* dv = Filled(nk, 1.0f);
    BackwardArgs bw;
    bw.scale = scale;
    bw.mask = MaskKind::kIntervals;
    bw.intervals = div;
    bw.q = f.q, bw.k = f.k, bw.v = f.v;
    bw.q_row0 = s.q_row0, bw.kv_row0 = s.kv_row0;
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
    // Keys that no query of the unit sees get no gradient at all.
    const size_t key_elems = size_t(s.kv_heads) * s.head_dim;
    for (int b = 0; b < s.batch; ++b) {
      for (int64_t c = 0; c < s.n; ++c) {
        const size_t at = size_t(b * iv.seq + s.kv_row0 + c);
        if (std::min<int64_t>(iv.k_hi[at], s.q_row0 + s.m) > std::max<int64_t>(iv.k_lo[at], s.q_row0)) continue;
        for (size_t e = 0; e < key_elems; ++e) {
          const size_t i = (size_t(b) * s.n + c) * key_elems + e;
          ASSERT_EQ(dk_h[i], 0.f) << "dk of unseen key " << c;
          ASSERT_EQ(dv_h[i], 0.f) << "dv of unseen key " << c;
        }
      }
    }
    if (c.name == "offsets_rows_see_nothing_d64") {
      EXPECT_GT(empty_rows, 0) << "the case must have empty rows";
    }
  }
}

// The closed-form intervals equal the brute-force ones (every pair tested against the rule).
TEST(HostIntervalsTest, ClosedFormEqualsBruteForce) {
  for (const MaskCase& c : Cases()) {
    SCOPED_TRACE(c.name);
    HostIntervals brute;
    ASSERT_TRUE(BuildIntervalsBruteForce(c.mask, c.s.batch, c.seq, &brute)) << "not intervals";
    const HostIntervals closed = BuildIntervals(c.mask, c.s.batch, c.seq);
    for (size_t i = 0; i < brute.q_lo.size(); ++i) {
      const bool q_empty = brute.q_hi[i] <= brute.q_lo[i], k_empty = brute.k_hi[i] <= brute.k_lo[i];
      ASSERT_EQ(closed.q_hi[i] <= closed.q_lo[i], q_empty) << "position " << i;
      ASSERT_EQ(closed.k_hi[i] <= closed.k_lo[i], k_empty) << "position " << i;
      if (!q_empty) {
        ASSERT_EQ(closed.q_lo[i], brute.q_lo[i]) << "position " << i;
        ASSERT_EQ(closed.q_hi[i], brute.q_hi[i]) << "position " << i;
      }
      if (!k_empty) {
        ASSERT_EQ(closed.k_lo[i], brute.k_lo[i]) << "position " << i;
        ASSERT_EQ(closed.k_hi[i], brute.k_hi[i]) << "position " << i;
      }
    }
  }
}

// core/mask.h BuildMaskIntervals (what the services hand to the kernels) gives the same
// intervals as the tests' own builder for every case above.
TEST(HostIntervalsTest, EqualsCoreBuildMaskIntervals) {
  for (const MaskCase& c : Cases()) {
    SCOPED_TRACE(c.name);
    MaskSpec spec;
    spec.causal = c.mask.causal;
    spec.window_left = c.mask.left;
    spec.window_right = c.mask.right;
    spec.doc_offsets = c.mask.docs;
    ASSERT_TRUE(ValidateMask(spec, c.s.batch, c.seq).ok()) << ValidateMask(spec, c.s.batch, c.seq);
    const MaskIntervalArrays core = BuildMaskIntervals(spec, c.s.batch, c.seq);
    const HostIntervals ours = BuildIntervals(c.mask, c.s.batch, c.seq);
    ASSERT_EQ(core.q_lo.size(), ours.q_lo.size());
    for (size_t i = 0; i < ours.q_lo.size(); ++i) {
      const bool q_empty = ours.q_hi[i] <= ours.q_lo[i], k_empty = ours.k_hi[i] <= ours.k_lo[i];
      ASSERT_EQ(core.q_hi[i] <= core.q_lo[i], q_empty) << "position " << i;
      ASSERT_EQ(core.k_hi[i] <= core.k_lo[i], k_empty) << "position " << i;
      if (!q_empty) {
        ASSERT_EQ(core.q_lo[i], ours.q_lo[i]) << "position " << i;
        ASSERT_EQ(core.q_hi[i], ours.q_hi[i]) << "position " << i;
      }
      if (!k_empty) {
        ASSERT_EQ(core.k_lo[i], ours.k_lo[i]) << "position " << i;
        ASSERT_EQ(core.k_hi[i], ours.k_hi[i]) << "position " << i;
      }
    }
  }
}

// Units with several waves of query tiles (more tiles than the GPU has SMs; the cases above fit
// in one wave): long-tailed documents (causal, two batch rows), a causal window with head dim 64
// (3 consumers, 192-row tiles) and a unit at offsets, GQA, each also accumulated over two key
// parts. Forward only (the reference's cost).
TEST_P(CudaIntervalsTest, ForwardOverManyTilesPerSmMatchesFp64Reference) {
  std::vector<MaskCase> cases;
  HostMask docs;
  docs.causal = true;
  docs.docs = {testing::ParetoDocOffsets(4096, 1.2, 64, 1500, 7)};
  cases.push_back(Case("pareto_docs_d128_batch2", DType::kBF16, 128, 8, 2, 4096, 0, 4096, 0, 4096,
                       docs, 2));
  HostMask window;
  window.causal = true, window.left = 300;
  window.docs = {{0, 4000}};
  cases.push_back(Case("causal_window_300_d64", DType::kF16, 64, 12, 4, 4000, 0, 4000, 0, 4000,
                       window));
  cases.push_back(Case("pareto_docs_offsets_d128", DType::kF16, 128, 16, 4, 4096, 1000, 3000, 300,
                       3500, docs));
  uint64_t seed = 977;
  for (const MaskCase& c : cases) {
    const UnitShape& s = c.s;
    SCOPED_TRACE(c.name);
    const HostIntervals iv = BuildIntervals(c.mask, s.batch, c.seq);
    const Inputs in = MakeInputs(s, seed += 10);
    const float scale = 1.f / std::sqrt(float(s.head_dim));
    const auto ref = MaskedReference(s, iv, in.q, in.k, in.v, nullptr, scale);
    const size_t nq = in.q.size(), nk = in.k.size(), nstat = size_t(s.batch) * s.q_heads * s.m;
    const MaskIntervals div = UploadIntervals(iv);
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
    ASSERT_TRUE(be_->Forward(f).ok());
    EXPECT_LT(RelError(Download<float>(out, nq), ref.out), 2 * Eps(s.dtype));
    const auto lse_h = Download<float>(lse, nstat);
    for (size_t i = 0; i < nstat; ++i) {
      if (std::isinf(ref.lse[i])) {
        ASSERT_TRUE(std::isinf(lse_h[i]) && lse_h[i] < 0) << "stat " << i;
      } else {
        ASSERT_NEAR(lse_h[i], ref.lse[i], 4 * Eps(s.dtype)) << "stat " << i;
      }
    }
    ExpectSplitForwardMatches(f, s, ref.out, s.n * 5 / 9);
  }
}

// kIntervals without the arrays, or with arrays shorter than the unit's positions: refused,
// naming the field, nothing launched.
TEST_P(CudaIntervalsTest, RejectsMissingOrShortIntervals) {
  UnitShape s;
  s.head_dim = 64, s.m = 64, s.n = 64, s.q_row0 = 32;
  std::vector<uint16_t> h(size_t(s.m) * s.q_heads * s.head_dim, 0);
  void* buf = Upload(h.data(), h.size() * 2);
  float* out = Filled(h.size(), 0.f);
  float* lse = Filled(size_t(s.q_heads) * s.m, 0.f);
  ForwardArgs f;
  f.scale = 0.1f;
  f.mask = MaskKind::kIntervals;
  f.q = View(buf, s.dtype, s, false), f.k = View(buf, s.dtype, s, true), f.v = f.k;
  f.q_row0 = s.q_row0;
  f.out = View(out, DType::kF32, s, false), f.lse = Stat(lse, s);
  absl::Status st = be_->Forward(f);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("intervals"), std::string::npos) << st;
  EXPECT_NE(st.message().find("q_lo"), std::string::npos) << st;
  HostMask m = Docs({64}, true);
  f.intervals = UploadIntervals(BuildIntervals(m, 1, 64));  // covers 64 positions, needs 96
  st = be_->Forward(f);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("intervals.seq"), std::string::npos) << st;
}

}  // namespace
}  // namespace dfa
