// CPU forward unit against the fp64 reference over a grid of shapes, masks, GQA ratios, head
// dims and dtypes; plus rows that see no key, output in the input dtype, and every ISA build.
#include <cmath>
#include <cstdlib>
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

struct Case {
  DType dtype;
  int hq, hkv, d;
  int64_t m, n, q0, k0;
  MaskKind mask;
  float scale_mul = 1.f;  // scale = scale_mul / sqrt(D)
  DType out_dtype = DType::kF32;
};

// Runs one forward case on `backend` and checks it against the reference on the same rounded
// inputs. Returns the worst error / tolerance ratio seen (must be <= 1).
void CheckForward(AttentionBackend& backend, const Case& c, uint32_t seed) {
  SCOPED_TRACE(testing::ShapeName(c.dtype, c.hq, c.hkv, c.d, c.m, c.n, c.q0, c.k0, c.mask));
  std::mt19937 rng(seed);
  const int B = 2;
  HostTensor q(c.dtype, B, c.m, c.hq, c.d), k(c.dtype, B, c.n, c.hkv, c.d),
      v(c.dtype, B, c.n, c.hkv, c.d), out(c.out_dtype, B, c.m, c.hq, c.d);
  q.Randomize(rng);
  k.Randomize(rng);
  v.Randomize(rng);
  HostStats lse(B, c.hq, c.m, 123.f);
  const float scale = c.scale_mul / std::sqrt(static_cast<float>(c.d));

  ForwardArgs a;
  a.scale = scale;
  a.mask = c.mask;
  a.q = q.view();
  a.k = k.view();
  a.v = v.view();
  a.q_row0 = c.q0;
  a.kv_row0 = c.k0;
  a.out = out.view();
  a.lse = lse.view();
  ASSERT_TRUE(backend.Forward(a).ok());

  reference::Problem p{q.view(), k.view(), v.view(), c.q0, c.k0, c.mask, scale};
  auto ref = reference::Forward(p);
  ASSERT_TRUE(ref.ok()) << ref.status();

  const double score_mag = scale * c.d * testing::kMeanAbsProduct;  // ~ sum_d |scale q_d k_d|
  const double out_tol = Fp32Tolerance(c.n + c.d, 1.0 + score_mag, c.out_dtype);
  double worst = 0.0;
  for (int64_t i = 0; i < out.size(); ++i) {
    const double got = out.get(i);
    ASSERT_FALSE(std::isnan(got)) << "NaN in out at " << i;
    worst = std::max(worst, std::fabs(got - ref->out[i]) / out_tol);
  }
  EXPECT_LE(worst, 1.0) << "out error / tolerance; tolerance " << out_tol;
  double worst_lse = 0.0;
  for (size_t i = 0; i < lse.v.size(); ++i) {
    const double want = ref->lse[i];
    if (std::isinf(want)) {
      ASSERT_TRUE(std::isinf(lse.v[i]) && lse.v[i] < 0) << "row " << i << " must have LSE -inf";
      continue;
    }
    const double tol = Fp32Tolerance(c.d, score_mag + std::fabs(want));
    worst_lse = std::max(worst_lse, std::fabs(lse.v[i] - want) / tol);
  }
  EXPECT_LE(worst_lse, 1.0) << "lse error / tolerance";
}

std::unique_ptr<AttentionBackend> Cpu(int threads = 2) {
  auto b = CreateBackend("cpu", BackendOptions{threads, 0});
  EXPECT_TRUE(b.ok()) << b.status();
  return std::move(b).value();
}

// The grid: every dtype x mask x GQA ratio x head dim, with lengths that are not multiples of
// the block size, m != n, and offsets that put the causal diagonal inside, before and after.
std::vector<Case> Grid() {
  struct Shape {
    int64_t m, n, q0, k0;
  };
  const Shape shapes[] = {{70, 131, 200, 100}, {129, 65, 0, 0}, {33, 97, 50, 0},
                          {100, 100, 30, 60},  {1, 77, 76, 0},  {65, 3, 2, 0}};
  std::vector<Case> cases;
  int s = 0;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (MaskKind mask : {MaskKind::kCausal, MaskKind::kFull}) {
      for (int ratio : {1, 4, 8}) {
        for (int d : {64, 128, 37}) {
          const Shape& sh = shapes[s++ % 6];
          cases.push_back({t, 8, 8 / ratio, d, sh.m, sh.n, sh.q0, sh.k0, mask});
        }
      }
    }
  }
  return cases;
}

TEST(CpuForward, MatchesReferenceOverGrid) {
  auto backend = Cpu();
  uint32_t seed = 1;
  for (const Case& c : Grid()) CheckForward(*backend, c, seed++);
}

TEST(CpuForward, SharpSoftmaxAndOutputInInputDtype) {
  auto backend = Cpu();
  CheckForward(*backend, {DType::kF32, 4, 2, 64, 90, 150, 60, 0, MaskKind::kCausal, 8.f}, 7);
  CheckForward(*backend,
               {DType::kBF16, 4, 4, 64, 90, 150, 60, 0, MaskKind::kCausal, 1.f, DType::kBF16}, 8);
  CheckForward(*backend, {DType::kF16, 4, 1, 128, 70, 70, 0, 0, MaskKind::kFull, 1.f, DType::kF16},
               9);
}

TEST(CpuForward, EveryIsaBuildAndThreadCount) {
  for (const char* isa : {"default", "avx2", "avx512"}) {
    SCOPED_TRACE(isa);
    setenv("DFA_CPU_ISA", isa, 1);
    for (int threads : {1, 3}) {
      auto backend = Cpu(threads);
      CheckForward(*backend, {DType::kBF16, 8, 2, 37, 131, 70, 64, 0, MaskKind::kCausal}, 11);
      CheckForward(*backend, {DType::kF32, 4, 4, 128, 65, 129, 0, 0, MaskKind::kFull}, 12);
    }
  }
  unsetenv("DFA_CPU_ISA");
}

// Query rows before the first key (causal) see nothing: LSE -inf, output exactly 0, no NaN.
TEST(CpuForward, RowsSeeingNoKeyGiveMinusInfAndZero) {
  auto backend = Cpu();
  const int D = 64;
  HostTensor q(DType::kF32, 1, 80, 2, D), k(DType::kF32, 1, 50, 1, D), v(DType::kF32, 1, 50, 1, D),
      out(DType::kF32, 1, 80, 2, D);
  std::mt19937 rng(3);
  q.Randomize(rng);
  k.Randomize(rng);
  v.Randomize(rng);
  HostStats lse(1, 2, 80);
  ForwardArgs a;
  a.scale = 0.125f;
  a.mask = MaskKind::kCausal;
  a.q = q.view();
  a.k = k.view();
  a.v = v.view();
  a.q_row0 = 0;
  a.kv_row0 = 40;  // query rows 0..39 see no key
  a.out = out.view();
  a.lse = lse.view();
  ASSERT_TRUE(backend->Forward(a).ok());
  for (int h = 0; h < 2; ++h) {
    for (int r = 0; r < 80; ++r) {
      const float l = lse.v[h * 80 + r];
      if (r < 40) {
        EXPECT_TRUE(std::isinf(l) && l < 0) << "row " << r;
      } else {
        EXPECT_TRUE(std::isfinite(l)) << "row " << r;
      }
      for (int d = 0; d < D; ++d) {
        const float o = out.get((int64_t{r} * 2 + h) * D + d);
        ASSERT_FALSE(std::isnan(o));
        if (r < 40) {
          ASSERT_EQ(o, 0.f);
        }
      }
    }
  }
}

}  // namespace
}  // namespace dfa
