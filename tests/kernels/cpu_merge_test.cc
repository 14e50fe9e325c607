// LSE merging: k partials merged (by Merge, and by Forward's accumulate) equal one full pass;
// empty partials (LSE = -inf) merge without NaN; ComputeDelta and Convert.
#include <cmath>
#include <memory>
#include <random>

#include "gtest/gtest.h"
#include "kernels/attention_backend.h"
#include "tests/kernels/attention_test_util.h"

namespace dfa {
namespace {

using testing::Fp32Tolerance;
using testing::HostStats;
using testing::HostTensor;

std::unique_ptr<AttentionBackend> Cpu() {
  auto b = CreateBackend("cpu", BackendOptions{2, 0});
  EXPECT_TRUE(b.ok()) << b.status();
  return std::move(b).value();
}

struct Problem {
  int hq = 4, hkv = 2, d = 64;
  int64_t m = 90, n = 250, q0 = 160, k0 = 0;
  MaskKind mask = MaskKind::kCausal;
  HostTensor q, k, v;
  float scale = 0.125f;
  explicit Problem(DType t, uint32_t seed)
      : q(t, 2, m, hq, d), k(t, 2, n, hkv, d), v(t, 2, n, hkv, d) {
    std::mt19937 rng(seed);
    q.Randomize(rng);
    k.Randomize(rng);
    v.Randomize(rng);
  }
  // Forward over keys [k_begin, k_end) into out/lse.
  absl::Status Run(AttentionBackend& be, int64_t k_begin, int64_t k_end, HostTensor& out,
                   HostStats& lse, bool accumulate) {
    ForwardArgs a;
    a.scale = scale;
    a.mask = mask;
    a.q = q.view();
    a.k = k.view().Slice(k_begin, k_end - k_begin);
    a.v = v.view().Slice(k_begin, k_end - k_begin);
    a.q_row0 = q0;
    a.kv_row0 = k0 + k_begin;
    a.out = out.view();
    a.lse = lse.view();
    a.accumulate = accumulate;
    return be.Forward(a);
  }
};

void ExpectSame(const HostTensor& a, const HostStats& la, const HostTensor& b, const HostStats& lb,
                double tol) {
  for (int64_t i = 0; i < a.size(); ++i) {
    ASSERT_FALSE(std::isnan(a.get(i)));
    ASSERT_NEAR(a.get(i), b.get(i), tol) << "out element " << i;
  }
  for (size_t i = 0; i < la.v.size(); ++i) {
    if (std::isinf(lb.v[i])) {
      ASSERT_EQ(la.v[i], lb.v[i]) << "lse row " << i;
    } else {
      ASSERT_NEAR(la.v[i], lb.v[i], tol * (1.0 + std::fabs(lb.v[i]))) << "lse row " << i;
    }
  }
}

// Keys split at uneven cuts (some units fully masked for early query rows) and merged in both
// ways give the single pass's result to fp32 accuracy.
TEST(CpuMerge, KPartialsEqualOneFullPass) {
  auto be = Cpu();
  Problem p(DType::kBF16, 1);
  HostTensor full(DType::kF32, 2, p.m, p.hq, p.d);
  HostStats full_lse(2, p.hq, p.m);
  ASSERT_TRUE(p.Run(*be, 0, p.n, full, full_lse, false).ok());

  const int64_t cuts[] = {0, 37, 64, 200, 230, 250};  // 5 partials
  HostTensor merged(DType::kF32, 2, p.m, p.hq, p.d), acc(DType::kF32, 2, p.m, p.hq, p.d);
  HostStats merged_lse(2, p.hq, p.m), acc_lse(2, p.hq, p.m, -INFINITY);
  for (int u = 0; u < 5; ++u) {
    HostTensor part(DType::kF32, 2, p.m, p.hq, p.d);
    HostStats part_lse(2, p.hq, p.m);
    ASSERT_TRUE(p.Run(*be, cuts[u], cuts[u + 1], part, part_lse, false).ok());
    if (u == 0) {
      merged = part;
      merged_lse = part_lse;
    } else {
      ASSERT_TRUE(be->Merge({merged.view(), merged_lse.view(), part.view(), part_lse.view()}).ok());
    }
    ASSERT_TRUE(p.Run(*be, cuts[u], cuts[u + 1], acc, acc_lse, true).ok());
  }
  const double tol = Fp32Tolerance(p.n + p.d, 1.0 + p.scale * p.d);
  ExpectSame(merged, merged_lse, full, full_lse, tol);
  ExpectSame(acc, acc_lse, full, full_lse, tol);
}

// Partials of rows that saw no key: -inf with -inf stays (-inf, 0); -inf with a real partial
// gives the real one exactly; no NaN anywhere, whatever garbage the empty output held.
TEST(CpuMerge, EmptyPartialsNeverGiveNaN) {
  auto be = Cpu();
  const int D = 8;
  HostTensor a(DType::kF32, 1, 3, 1, D), b(DType::kF32, 1, 3, 1, D);
  HostStats la(1, 1, 3), lb(1, 1, 3);
  const float inf = INFINITY;
  la.v = {-inf, -inf, 1.5f};
  lb.v = {-inf, 0.25f, -inf};
  for (int64_t i = 0; i < a.size(); ++i) {
    a.set(i, 1.f + i);
    b.set(i, -2.f - i);
  }
  ASSERT_TRUE(be->Merge({a.view(), la.view(), b.view(), lb.view()}).ok());
  EXPECT_TRUE(std::isinf(la.v[0]) && la.v[0] < 0);
  EXPECT_EQ(la.v[1], 0.25f);
  EXPECT_EQ(la.v[2], 1.5f);
  for (int d = 0; d < D; ++d) {
    EXPECT_EQ(a.get(d), 0.f);
    EXPECT_EQ(a.get(D + d), b.get(D + d));
    EXPECT_EQ(a.get(2 * D + d), 1.f + 2 * D + d);
  }
}

// Large LSE gaps (exp overflow territory) merge to the dominant partial without inf/NaN.
TEST(CpuMerge, LargeLseGapsDoNotOverflow) {
  auto be = Cpu();
  HostTensor a(DType::kF32, 1, 2, 1, 4), b(DType::kF32, 1, 2, 1, 4);
  HostStats la(1, 1, 2), lb(1, 1, 2);
  la.v = {1000.f, -1000.f};
  lb.v = {-1000.f, 1000.f};
  for (int64_t i = 0; i < 8; ++i) a.set(i, 1.f), b.set(i, 3.f);
  ASSERT_TRUE(be->Merge({a.view(), la.view(), b.view(), lb.view()}).ok());
  for (int d = 0; d < 4; ++d) {
    EXPECT_FLOAT_EQ(a.get(d), 1.f);
    EXPECT_FLOAT_EQ(a.get(4 + d), 3.f);
  }
  EXPECT_FLOAT_EQ(la.v[0], 1000.f);
  EXPECT_FLOAT_EQ(la.v[1], 1000.f);
}

TEST(CpuElementwise, ComputeDeltaIsRowwiseDot) {
  auto be = Cpu();
  std::mt19937 rng(4);
  HostTensor dout(DType::kBF16, 2, 33, 3, 37), out(DType::kF32, 2, 33, 3, 37);
  dout.Randomize(rng);
  out.Randomize(rng);
  HostStats delta(2, 3, 33);
  ASSERT_TRUE(be->ComputeDelta(dout.view(), out.view(), delta.view(), nullptr).ok());
  for (int b = 0; b < 2; ++b) {
    for (int h = 0; h < 3; ++h) {
      for (int r = 0; r < 33; ++r) {
        double want = 0.0;
        for (int d = 0; d < 37; ++d) {
          const int64_t i = ((int64_t{b} * 33 + r) * 3 + h) * 37 + d;
          want += double{dout.get(i)} * out.get(i);
        }
        EXPECT_NEAR(delta.v[(b * 3 + h) * 33 + r], want, Fp32Tolerance(37, 37.0));
      }
    }
  }
}

TEST(CpuElementwise, ConvertRoundTripsAndRounds) {
  auto be = Cpu();
  std::mt19937 rng(5);
  HostTensor src(DType::kF32, 1, 10, 2, 9), half(DType::kF16, 1, 10, 2, 9),
      bf(DType::kBF16, 1, 10, 2, 9), back(DType::kF32, 1, 10, 2, 9);
  src.Randomize(rng, 3.f);
  ASSERT_TRUE(be->Convert(src.view(), half.view(), nullptr).ok());
  ASSERT_TRUE(be->Convert(half.view(), bf.view(), nullptr).ok());
  ASSERT_TRUE(be->Convert(bf.view(), back.view(), nullptr).ok());
  for (int64_t i = 0; i < src.size(); ++i) {
    EXPECT_EQ(half.get(i), HalfToFloat(FloatToHalf(src.get(i))));
    EXPECT_EQ(back.get(i), BF16ToFloat(FloatToBF16(half.get(i))));
  }
}

TEST(CpuElementwise, AccumulateAddsStridedRowsAndRejectsNonF32) {
  auto be = Cpu();
  std::mt19937 rng(6);
  HostTensor src(DType::kF32, 2, 5, 3, 7), dst(DType::kF32, 2, 10, 3, 7);
  src.Randomize(rng);
  dst.Randomize(rng);
  const HostTensor before = dst;
  // Every other row of dst: a strided view.
  TensorView view = dst.view();
  view.rows = 5;
  view.row_stride = 2 * 3 * 7;
  view.batch_stride = 10 * 3 * 7;
  ASSERT_TRUE(be->Accumulate(src.view(), view, nullptr).ok());
  for (int b = 0; b < 2; ++b) {
    for (int r = 0; r < 10; ++r) {
      for (int i = 0; i < 21; ++i) {
        const int64_t at = (int64_t{b} * 10 + r) * 21 + i;
        const float add = r % 2 == 0 ? src.get((int64_t{b} * 5 + r / 2) * 21 + i) : 0.f;
        ASSERT_EQ(dst.get(at), before.get(at) + add) << b << " " << r << " " << i;
      }
    }
  }
  HostTensor half(DType::kF16, 2, 5, 3, 7);
  EXPECT_EQ(be->Accumulate(half.view(), src.view(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dfa
