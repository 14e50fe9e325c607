// CPU forward and backward under MaskKind::kIntervals (packed documents, sliding windows)
// against the fp64 reference, which reads the MaskSpec's definition pair by pair: the
// sequence is cut into query shards and key shards of uneven sizes (documents and windows
// cross shard and 64-row tile boundaries), every (query shard, key shard) unit runs as one
// backend call at its global positions, forward units LSE-merge into the shard's output and
// backward units take the final LSE and D, as the distributed use does. Cases: 1-token
// documents, per-row documents, windows 0..S on either side, causal and not, GQA, units whose
// rows see nothing; and that tiles with no visible pair cost nothing.
#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention_backend.h"
#include "kernels/reference/reference_attention.h"
#include "tests/kernels/attention_test_util.h"

namespace dfa {
namespace {

using testing::HostStats;
using testing::HostTensor;

std::unique_ptr<AttentionBackend> Cpu(int threads = 2) {
  auto b = CreateBackend("cpu", BackendOptions{threads, 0});
  EXPECT_TRUE(b.ok()) << b.status();
  return std::move(b).value();
}

std::vector<int64_t> Offsets(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> off{0};
  for (int64_t l : lengths) off.push_back(off.back() + l);
  return off;
}

struct Case {
  std::string name;
  MaskSpec mask;
  int batch = 1;
  int64_t seq = 0;
  std::vector<int64_t> cuts;  // shard boundaries {0, ..., seq}
  DType dtype = DType::kF32;
  int hq = 4, hkv = 2, d = 32;
};

// Interval arrays as the kernels read them (host memory: the cpu backend).
MaskIntervals IntervalsOf(const MaskIntervalArrays& a) {
  return {a.q_lo.data(), a.q_hi.data(), a.k_lo.data(), a.k_hi.data(), a.seq};
}

double MaxAbs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// |got - want| <= tol for every element; NaN fails.
void ExpectClose(const HostTensor& got, const std::vector<double>& want, double tol,
                 const std::string& what) {
  ASSERT_EQ(static_cast<size_t>(got.size()), want.size()) << what;
  double worst = 0;
  int64_t at = 0;
  for (int64_t i = 0; i < got.size(); ++i) {
    const double g = got.get(i);
    ASSERT_FALSE(std::isnan(g)) << what << " NaN at " << i;
    const double e = std::fabs(g - want[static_cast<size_t>(i)]);
    if (e > worst) worst = e, at = i;
  }
  EXPECT_LE(worst, tol) << what << " worst error at element " << at;
}

void Check(AttentionBackend& be, const Case& c, uint32_t seed) {
  SCOPED_TRACE(c.name);
  ASSERT_TRUE(ValidateMask(c.mask, c.batch, c.seq).ok());
  std::mt19937 rng(seed);
  const int B = c.batch;
  HostTensor q(c.dtype, B, c.seq, c.hq, c.d), k(c.dtype, B, c.seq, c.hkv, c.d),
      v(c.dtype, B, c.seq, c.hkv, c.d), dout(c.dtype, B, c.seq, c.hq, c.d);
  for (HostTensor* t : {&q, &k, &v, &dout}) t->Randomize(rng);
  const float scale = 1.f / std::sqrt(static_cast<float>(c.d));
  const MaskIntervalArrays arrays = BuildMaskIntervals(c.mask, B, c.seq);
  const MaskIntervals iv = IntervalsOf(arrays);

  // Reference over the whole sequence.
  reference::Problem p{q.view(), k.view(), v.view(), 0, 0, MaskKind::kIntervals, scale,
                       &c.mask, c.seq};
  auto ref_fwd = reference::Forward(p);
  ASSERT_TRUE(ref_fwd.ok()) << ref_fwd.status();
  auto ref_bwd = reference::Backward(p, dout.view());
  ASSERT_TRUE(ref_bwd.ok()) << ref_bwd.status();

  // Backend: every (query shard, key shard) unit.
  HostTensor out(DType::kF32, B, c.seq, c.hq, c.d);
  HostStats lse(B, c.hq, c.seq, -INFINITY), delta(B, c.hq, c.seq);
  const int shards = static_cast<int>(c.cuts.size()) - 1;
  for (int qs = 0; qs < shards; ++qs) {
    const int64_t q0 = c.cuts[qs], m = c.cuts[qs + 1] - q0;
    for (int ks = 0; ks < shards; ++ks) {
      const int64_t k0 = c.cuts[ks], n = c.cuts[ks + 1] - k0;
      ForwardArgs a;
      a.scale = scale;
      a.mask = MaskKind::kIntervals;
      a.intervals = iv;
      a.q = q.view().Slice(q0, m);
      a.q_row0 = q0;
      a.k = k.view().Slice(k0, n);
      a.v = v.view().Slice(k0, n);
      a.kv_row0 = k0;
      a.out = out.view().Slice(q0, m);
      a.lse = lse.view().Slice(q0, m);
      a.accumulate = true;
      const absl::Status s = be.Forward(a);
      ASSERT_TRUE(s.ok()) << s;
    }
  }
  // LSE: -inf exactly where the reference has -inf (no row of a whole sequence sees nothing,
  // but the units above had many).
  for (size_t i = 0; i < lse.v.size(); ++i) {
    ASSERT_EQ(std::isinf(lse.v[i]), std::isinf(ref_fwd->lse[i])) << "lse " << i;
    ASSERT_NEAR(lse.v[i], ref_fwd->lse[i], 1e-4) << "lse " << i;
  }
  const double o_tol = c.dtype == DType::kF32 ? 2e-5 : 1e-4;  // O from fp32 arithmetic
  ExpectClose(out, ref_fwd->out, o_tol, "out");

  ASSERT_TRUE(be.ComputeDelta(dout.view(), out.view(), delta.view(), nullptr).ok());
  HostTensor dq(DType::kF32, B, c.seq, c.hq, c.d), dk(DType::kF32, B, c.seq, c.hkv, c.d),
      dv(DType::kF32, B, c.seq, c.hkv, c.d);
  for (int qs = 0; qs < shards; ++qs) {
    const int64_t q0 = c.cuts[qs], m = c.cuts[qs + 1] - q0;
    for (int ks = 0; ks < shards; ++ks) {
      const int64_t k0 = c.cuts[ks], n = c.cuts[ks + 1] - k0;
      BackwardArgs a;
      a.scale = scale;
      a.mask = MaskKind::kIntervals;
      a.intervals = iv;
      a.q = q.view().Slice(q0, m);
      a.q_row0 = q0;
      a.k = k.view().Slice(k0, n);
      a.v = v.view().Slice(k0, n);
      a.kv_row0 = k0;
      a.dout = dout.view().Slice(q0, m);
      a.lse = lse.view().Slice(q0, m);
      a.delta = delta.view().Slice(q0, m);
      a.dq = dq.view().Slice(q0, m);
      a.dk = dk.view().Slice(k0, n);
      a.dv = dv.view().Slice(k0, n);
      const absl::Status s = be.Backward(a);
      ASSERT_TRUE(s.ok()) << s;
    }
  }
  // Gradients: fp32 sums of up to seq products; relative to the largest gradient.
  const double g_rel = c.dtype == DType::kF32 ? 1e-4 : 5e-4;
  ExpectClose(dq, ref_bwd->dq, g_rel * std::max(1.0, MaxAbs(ref_bwd->dq)), "dq");
  ExpectClose(dk, ref_bwd->dk, g_rel * std::max(1.0, MaxAbs(ref_bwd->dk)), "dk");
  ExpectClose(dv, ref_bwd->dv, g_rel * std::max(1.0, MaxAbs(ref_bwd->dv)), "dv");
}

MaskSpec Mask(bool causal, int64_t left, int64_t right, std::vector<std::vector<int64_t>> docs) {
  MaskSpec m;
  m.causal = causal;
  m.window_left = left;
  m.window_right = right;
  m.doc_offsets = std::move(docs);
  return m;
}

// Documents crossing the shard cuts {0, 70, 150, 230} and the 64-row tiles.
const std::vector<int64_t> kCuts3 = {0, 70, 150, 230};
const std::vector<int64_t> kDocs = Offsets({1, 40, 1, 1, 97, 63, 27});  // 230 tokens

TEST(CpuMask, DocumentsCausalAndFull) {
  auto be = Cpu();
  Check(*be, {"docs causal", Mask(true, -1, -1, {kDocs}), 1, 230, kCuts3}, 1);
  Check(*be, {"docs full", Mask(false, -1, -1, {kDocs}), 1, 230, kCuts3}, 2);
  std::vector<int64_t> ones;
  for (int i = 0; i < 150; ++i) ones.push_back(1);
  Check(*be, {"1-token docs", Mask(true, -1, -1, {Offsets(ones)}), 1, 150, {0, 64, 100, 150}},
        3);
  Check(*be, {"1-token docs full", Mask(false, -1, -1, {Offsets(ones)}), 1, 150, {0, 150}}, 4);
}

TEST(CpuMask, WindowsFromZeroToSeq) {
  auto be = Cpu();
  uint32_t seed = 10;
  for (bool causal : {true, false}) {
    for (int64_t w : {0, 1, 5, 64, 100, 229, 230}) {
      const std::string tag = std::string(causal ? "causal" : "full") + " w=" + std::to_string(w);
      Check(*be, {tag + " left", Mask(causal, w, -1, {}), 1, 230, kCuts3}, seed++);
      if (!causal) {
        Check(*be, {tag + " right", Mask(false, -1, w, {}), 1, 230, kCuts3}, seed++);
        Check(*be, {tag + " both", Mask(false, w, w / 2, {kDocs}), 1, 230, kCuts3}, seed++);
      } else {
        Check(*be, {tag + " docs", Mask(true, w, -1, {kDocs}), 1, 230, kCuts3}, seed++);
      }
    }
  }
}

TEST(CpuMask, PerRowDocumentsGqaAndDtypes) {
  auto be = Cpu(3);
  Case c{"per-row docs", Mask(true, 30, -1, {Offsets({100, 30, 70}), Offsets({1, 199})}), 2, 200,
         {0, 33, 128, 200}};
  c.hq = 8;
  c.hkv = 1;
  c.d = 64;
  Check(*be, c, 40);
  c.name = "per-row docs bf16";
  c.dtype = DType::kBF16;
  c.hkv = 4;
  c.d = 37;
  Check(*be, c, 41);
  c.name = "one entry for every row";
  c.mask = Mask(false, 3, 9, {Offsets({50, 150})});
  c.batch = 3;
  c.dtype = DType::kF16;
  Check(*be, c, 42);
}

TEST(CpuMask, EveryIsaBuild) {
  for (const char* isa : {"default", "avx2", "avx512"}) {
    SCOPED_TRACE(isa);
    setenv("DFA_CPU_ISA", isa, 1);
    auto be = Cpu(2);
    Check(*be, {"isa", Mask(true, 50, -1, {kDocs}), 1, 230, kCuts3}, 60);
  }
  unsetenv("DFA_CPU_ISA");
}

// A unit none of whose rows sees a key (another document, outside the window) writes LSE -inf
// and O = 0, and adds nothing to the gradients.
TEST(CpuMask, UnitWithNoVisiblePairIsEmpty) {
  auto be = Cpu();
  const MaskSpec mask = Mask(true, -1, -1, {Offsets({100, 100})});
  const MaskIntervalArrays arrays = BuildMaskIntervals(mask, 1, 200);
  std::mt19937 rng(3);
  HostTensor q(DType::kF32, 1, 100, 2, 16), k(DType::kF32, 1, 100, 2, 16),
      v(DType::kF32, 1, 100, 2, 16), out(DType::kF32, 1, 100, 2, 16);
  for (HostTensor* t : {&q, &k, &v, &out}) t->Randomize(rng);
  HostStats lse(1, 2, 100, 5.f);
  ForwardArgs a;
  a.scale = 0.25f;
  a.mask = MaskKind::kIntervals;
  a.intervals = IntervalsOf(arrays);
  a.q = q.view();
  a.q_row0 = 100;  // the second document's queries
  a.k = k.view();
  a.v = v.view();
  a.kv_row0 = 0;   // the first document's keys
  a.out = out.view();
  a.lse = lse.view();
  ASSERT_TRUE(be->Forward(a).ok());
  for (float x : lse.v) EXPECT_EQ(x, -INFINITY);
  for (int64_t i = 0; i < out.size(); ++i) ASSERT_EQ(out.get(i), 0.f);
}

// Bad kIntervals arguments: INVALID_ARGUMENT naming the field, outputs untouched.
TEST(CpuMask, BadIntervalArgumentsAreRefused) {
  auto be = Cpu();
  const MaskIntervalArrays arrays = BuildMaskIntervals(Mask(true, -1, -1, {}), 1, 64);
  std::mt19937 rng(9);
  HostTensor q(DType::kF32, 1, 32, 2, 16), k(DType::kF32, 1, 32, 2, 16),
      v(DType::kF32, 1, 32, 2, 16), out(DType::kF32, 1, 32, 2, 16);
  for (HostTensor* t : {&q, &k, &v, &out}) t->Randomize(rng);
  const HostTensor before = out;
  HostStats lse(1, 2, 32);
  ForwardArgs a;
  a.scale = 0.25f;
  a.mask = MaskKind::kIntervals;
  a.q = q.view();
  a.k = k.view();
  a.v = v.view();
  a.out = out.view();
  a.lse = lse.view();
  auto message = [&](const ForwardArgs& f) { return std::string(be->Forward(f).message()); };
  EXPECT_EQ(message(a), "intervals: kIntervals needs q_lo, q_hi, k_lo and k_hi");
  a.intervals = IntervalsOf(arrays);
  a.q_row0 = 40;  // 40 + 32 > 64
  EXPECT_EQ(message(a), "q rows [40, 72) reach past intervals.seq = 64");
  a.q_row0 = 0;
  a.kv_row0 = 33;
  EXPECT_EQ(message(a), "kv rows [33, 65) reach past intervals.seq = 64");
  a.kv_row0 = 0;
  a.mask = static_cast<MaskKind>(7);
  EXPECT_EQ(message(a), "mask: unknown kind 7");
  EXPECT_EQ(out.bytes, before.bytes);
  BackwardArgs b;
  b.scale = 0.25f;
  b.mask = MaskKind::kIntervals;
  b.q = q.view();
  b.k = k.view();
  b.v = v.view();
  b.dout = q.view();
  b.lse = lse.view();
  b.delta = lse.view();
  b.dq = out.view();
  b.dk = out.view();
  b.dv = out.view();
  EXPECT_EQ(std::string(be->Backward(b).message()),
            "intervals: kIntervals needs q_lo, q_hi, k_lo and k_hi");
}

// Cost follows visible pairs: 4096 tokens of 64-token documents (1/64 of the causal pairs)
// take a small fraction of the dense causal forward's time.
TEST(CpuMask, TilesWithoutVisiblePairsCostNothing) {
  auto be = Cpu(2);
  const int64_t seq = 4096;
  std::vector<int64_t> lengths(seq / 64, 64);
  const MaskSpec mask = Mask(true, -1, -1, {Offsets(lengths)});
  const MaskIntervalArrays arrays = BuildMaskIntervals(mask, 1, seq);
  std::mt19937 rng(5);
  HostTensor q(DType::kBF16, 1, seq, 4, 64), k(DType::kBF16, 1, seq, 4, 64),
      v(DType::kBF16, 1, seq, 4, 64), out(DType::kF32, 1, seq, 4, 64);
  for (HostTensor* t : {&q, &k, &v}) t->Randomize(rng);
  HostStats lse(1, 4, seq);
  auto time = [&](MaskKind kind) {
    ForwardArgs a;
    a.scale = 0.125f;
    a.mask = kind;
    a.intervals = IntervalsOf(arrays);
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    a.lse = lse.view();
    double best = 1e9;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      EXPECT_TRUE(be->Forward(a).ok());
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                                .count());
    }
    return best;
  };
  const double dense = time(MaskKind::kCausal);
  const double docs = time(MaskKind::kIntervals);
  // Pairs: 1/32 of causal's (64 blocks on the diagonal, all partial); packing and the
  // write-back stay. 0.25 leaves room for a loaded machine.
  EXPECT_LT(docs, 0.25 * dense) << "documents " << docs << " s, dense causal " << dense << " s";
}

}  // namespace
}  // namespace dfa
