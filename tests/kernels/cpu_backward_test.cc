// CPU backward unit: against the fp64 reference backward over a grid, split into units with
// the final LSE (the distributed use), against finite differences of the reference forward,
// and with rows that see no key.
#include <cmath>
#include <memory>
#include <random>

#include "gtest/gtest.h"
#include "kernels/attention_backend.h"
#include "kernels/reference/reference_attention.h"
#include "tests/kernels/attention_test_util.h"

namespace dfa {
namespace {

using testing::Fp32Tolerance;
using testing::HostStats;
using testing::HostTensor;

std::unique_ptr<AttentionBackend> Cpu(int threads = 2) {
  auto b = CreateBackend("cpu", BackendOptions{threads, 0});
  EXPECT_TRUE(b.ok()) << b.status();
  return std::move(b).value();
}

struct Case {
  DType dtype;
  int hq, hkv, d;
  int64_t m, n, q0, k0;
  MaskKind mask;
  int units = 1;  // the keys are split into this many backend units
};

struct Inputs {
  HostTensor q, k, v, dout;
  float scale;
};

Inputs MakeInputs(const Case& c, int B, uint32_t seed) {
  std::mt19937 rng(seed);
  Inputs in{HostTensor(c.dtype, B, c.m, c.hq, c.d), HostTensor(c.dtype, B, c.n, c.hkv, c.d),
            HostTensor(c.dtype, B, c.n, c.hkv, c.d), HostTensor(c.dtype, B, c.m, c.hq, c.d),
            1.f / std::sqrt(static_cast<float>(c.d))};
  in.q.Randomize(rng);
  in.k.Randomize(rng);
  in.v.Randomize(rng);
  in.dout.Randomize(rng);
  return in;
}

// Forward over all keys (as `units` accumulated units), ComputeDelta, then one backward per
// unit with the final LSE; returns dq, dk, dv (fp32, dense).
struct Grads {
  std::vector<float> dq, dk, dv;
};
Grads RunBackend(AttentionBackend& be, Inputs& in, const Case& c) {
  const int B = in.q.batch;
  HostTensor out(DType::kF32, B, c.m, c.hq, c.d);
  HostStats lse(B, c.hq, c.m, -INFINITY), delta(B, c.hq, c.m);
  HostTensor dq(DType::kF32, B, c.m, c.hq, c.d), dk(DType::kF32, B, c.n, c.hkv, c.d),
      dv(DType::kF32, B, c.n, c.hkv, c.d);
  std::vector<int64_t> cuts;
  for (int u = 0; u <= c.units; ++u) cuts.push_back(c.n * u / c.units);
  for (int u = 0; u < c.units; ++u) {
    ForwardArgs a;
    a.scale = in.scale;
    a.mask = c.mask;
    a.q = in.q.view();
    a.k = in.k.view().Slice(cuts[u], cuts[u + 1] - cuts[u]);
    a.v = in.v.view().Slice(cuts[u], cuts[u + 1] - cuts[u]);
    a.q_row0 = c.q0;
    a.kv_row0 = c.k0 + cuts[u];
    a.out = out.view();
    a.lse = lse.view();
    a.accumulate = true;
    EXPECT_TRUE(be.Forward(a).ok());
  }
  EXPECT_TRUE(be.ComputeDelta(in.dout.view(), out.view(), delta.view(), nullptr).ok());
  for (int u = 0; u < c.units; ++u) {
    BackwardArgs a;
    a.scale = in.scale;
    a.mask = c.mask;
    a.q = in.q.view();
    a.k = in.k.view().Slice(cuts[u], cuts[u + 1] - cuts[u]);
    a.v = in.v.view().Slice(cuts[u], cuts[u + 1] - cuts[u]);
    a.q_row0 = c.q0;
    a.kv_row0 = c.k0 + cuts[u];
    a.dout = in.dout.view();
    a.lse = lse.view();
    a.delta = delta.view();
    a.dq = dq.view();
    a.dk = dk.view().Slice(cuts[u], cuts[u + 1] - cuts[u]);
    a.dv = dv.view().Slice(cuts[u], cuts[u + 1] - cuts[u]);
    const absl::Status s = be.Backward(a);
    EXPECT_TRUE(s.ok()) << s;
  }
  Grads g;
  for (auto* t : {&dq, &dk, &dv}) {
    std::vector<float>& dst = t == &dq ? g.dq : t == &dk ? g.dk : g.dv;
    for (int64_t i = 0; i < t->size(); ++i) dst.push_back(t->get(i));
  }
  return g;
}

double MagDp(int d, float scale) {
  return 2.0 * d * testing::kMeanAbsProduct * (1.0 + scale * d * testing::kMeanAbsProduct);
}

void ExpectClose(const std::vector<float>& got, const std::vector<double>& want, double tol,
                 const char* what) {
  ASSERT_EQ(got.size(), want.size());
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << what << " NaN at " << i;
    worst = std::max(worst, std::fabs(got[i] - want[i]) / tol);
  }
  EXPECT_LE(worst, 1.0) << what << " error / tolerance (tolerance " << tol << ")";
}

void CheckBackward(AttentionBackend& be, const Case& c, uint32_t seed) {
  SCOPED_TRACE(testing::ShapeName(c.dtype, c.hq, c.hkv, c.d, c.m, c.n, c.q0, c.k0, c.mask) +
               " units=" + std::to_string(c.units));
  Inputs in = MakeInputs(c, 1, seed);
  const Grads g = RunBackend(be, in, c);
  reference::Problem p{in.q.view(), in.k.view(), in.v.view(), c.q0, c.k0, c.mask, in.scale};
  auto ref = reference::Backward(p, in.dout.view());
  ASSERT_TRUE(ref.ok()) << ref.status();
  // dP and D are sums of D products (mean |.| 1/4 each); dS = P (dP - D) carries the scores'
  // error too; dV sums m products, dK and dQ sum m (resp. n) products of dS with scale * q
  // (resp. k).
  const double mag_dp = MagDp(c.d, in.scale);
  const int group = c.hq / c.hkv;
  ExpectClose(g.dq, ref->dq, Fp32Tolerance(c.n + c.d, in.scale * mag_dp), "dq");
  ExpectClose(g.dk, ref->dk, Fp32Tolerance(group * c.m + c.d, in.scale * mag_dp), "dk");
  ExpectClose(g.dv, ref->dv,
              Fp32Tolerance(group * c.m + c.d, 1.0 + in.scale * c.d * testing::kMeanAbsProduct),
              "dv");
}

TEST(CpuBackward, MatchesReferenceOverGrid) {
  auto be = Cpu();
  struct Shape {
    int64_t m, n, q0, k0;
  };
  const Shape shapes[] = {
      {70, 131, 200, 100}, {129, 65, 0, 0}, {33, 97, 50, 0}, {100, 100, 30, 60}};
  uint32_t seed = 100;
  int s = 0;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (MaskKind mask : {MaskKind::kCausal, MaskKind::kFull}) {
      for (int ratio : {1, 4, 8}) {
        for (int d : {64, 128, 37}) {
          const Shape& sh = shapes[s++ % 4];
          CheckBackward(*be, {t, 8, 8 / ratio, d, sh.m, sh.n, sh.q0, sh.k0, mask}, seed++);
        }
      }
    }
  }
}

// The distributed use: keys split into units, each backward given the final LSE and D.
TEST(CpuBackward, UnitsWithFinalLseSumToFullBackward) {
  auto be = Cpu(3);
  CheckBackward(*be, {DType::kBF16, 8, 2, 64, 150, 200, 100, 0, MaskKind::kCausal, 3}, 7);
  CheckBackward(*be, {DType::kF32, 4, 1, 37, 70, 130, 0, 0, MaskKind::kFull, 2}, 8);
  // One kv head and one thread-heavy split: exercises the per-chunk dQ copies.
  auto be8 = Cpu(8);
  CheckBackward(*be8, {DType::kF16, 4, 1, 128, 130, 300, 170, 0, MaskKind::kCausal, 1}, 9);
}

TEST(CpuBackward, EveryIsaBuild) {
  for (const char* isa : {"default", "avx2", "avx512"}) {
    SCOPED_TRACE(isa);
    setenv("DFA_CPU_ISA", isa, 1);
    auto be = Cpu(2);
    CheckBackward(*be, {DType::kBF16, 4, 2, 37, 90, 70, 40, 0, MaskKind::kCausal}, 21);
  }
  unsetenv("DFA_CPU_ISA");
}

// Backend gradients against central differences of the fp64 reference forward's loss
// sum(dO * O). Inputs are multiples of 2^-12 so x +- h (h = 2^-10) is exact in fp32.
TEST(CpuBackward, MatchesFiniteDifferencesOfReference) {
  auto be = Cpu();
  const Case c{DType::kF32, 4, 2, 5, 7, 9, 3, 0, MaskKind::kCausal};
  Inputs in = MakeInputs(c, 1, 5);
  for (HostTensor* t : {&in.q, &in.k, &in.v}) {
    for (int64_t i = 0; i < t->size(); ++i) t->set(i, std::round(t->get(i) * 4096.f) / 4096.f);
  }
  const Grads g = RunBackend(*be, in, c);
  auto loss = [&]() {
    reference::Problem p{in.q.view(), in.k.view(), in.v.view(), c.q0, c.k0, c.mask, in.scale};
    auto f = reference::Forward(p);
    EXPECT_TRUE(f.ok());
    double l = 0.0;
    for (int64_t i = 0; i < in.dout.size(); ++i) l += in.dout.get(i) * f->out[i];
    return l;
  };
  const float h = 1.f / 1024.f;
  int checked = 0;
  for (HostTensor* t : {&in.q, &in.k, &in.v}) {
    const std::vector<float>& grad = t == &in.q ? g.dq : t == &in.k ? g.dk : g.dv;
    for (int64_t i = 0; i < t->size(); ++i) {
      const float x = t->get(i);
      t->set(i, x + h);
      const double up = loss();
      t->set(i, x - h);
      const double down = loss();
      t->set(i, x);
      const double fd = (up - down) / (2.0 * h);
      EXPECT_NEAR(grad[i], fd, 2e-4 + 1e-3 * std::fabs(fd)) << "element " << i;
      ++checked;
    }
  }
  EXPECT_EQ(checked, in.q.size() + in.k.size() + in.v.size());
}

// Rows that see no key (LSE = -inf) get zero dQ, and add nothing to dK/dV: never NaN.
TEST(CpuBackward, RowsSeeingNoKeyGiveZeroGradients) {
  auto be = Cpu();
  const Case c{DType::kF32, 2, 1, 64, 80, 50, 0, 40, MaskKind::kCausal};
  Inputs in = MakeInputs(c, 1, 6);
  const Grads g = RunBackend(*be, in, c);
  reference::Problem p{in.q.view(), in.k.view(), in.v.view(), c.q0, c.k0, c.mask, in.scale};
  auto ref = reference::Backward(p, in.dout.view());
  ASSERT_TRUE(ref.ok());
  for (int r = 0; r < 40; ++r) {
    for (int i = 0; i < 2 * 64; ++i) ASSERT_EQ(g.dq[r * 128 + i], 0.f) << "row " << r;
  }
  const double mag_dp = MagDp(c.d, in.scale);
  ExpectClose(g.dq, ref->dq, Fp32Tolerance(c.n + c.d, in.scale * mag_dp), "dq");
  ExpectClose(g.dk, ref->dk, Fp32Tolerance(2 * c.m + c.d, in.scale * mag_dp), "dk");
  ExpectClose(g.dv, ref->dv,
              Fp32Tolerance(2 * c.m + c.d, 1.0 + in.scale * c.d * testing::kMeanAbsProduct), "dv");
}

}  // namespace
}  // namespace dfa
