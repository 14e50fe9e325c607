// CancellableBackend: cutting units into pieces (forward: query rows; backward: tiles of query
// rows x keys, tiles that see nothing skipped) gives the same forward and backward results as
// the whole unit, under a causal and an interval mask, and a cancel set while a unit runs stops
// it at the next piece.
#include "worker/cancellable_backend.h"

#include <cmath>
#include <random>
#include <vector>

#include "core/mask.h"
#include "gtest/gtest.h"

namespace dfa {
namespace {

constexpr int kB = 1, kHq = 4, kHkv = 2, kD = 32;

struct Tensors {
  int64_t m, n;
  std::vector<float> q, k, v, dout, out, lse, delta, dq, dk, dv;
  TensorView View(std::vector<float>& x, int64_t rows, int heads) {
    TensorView t;
    t.data = x.data();
    t.dtype = DType::kF32;
    t.batch = kB;
    t.rows = rows;
    t.heads = heads;
    t.head_dim = kD;
    return t;
  }
  RowStatView Stats(std::vector<float>& x, int64_t rows) {
    RowStatView s;
    s.data = x.data();
    s.batch = kB;
    s.heads = kHq;
    s.rows = rows;
    return s;
  }
};

Tensors MakeTensors(int64_t m, int64_t n, uint32_t seed) {
  Tensors t;
  t.m = m;
  t.n = n;
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  auto fill = [&](std::vector<float>& x, int64_t count) {
    x.resize(static_cast<size_t>(count));
    for (float& e : x) e = g(rng);
  };
  fill(t.q, kB * m * kHq * kD);
  fill(t.k, kB * n * kHkv * kD);
  fill(t.v, kB * n * kHkv * kD);
  fill(t.dout, kB * m * kHq * kD);
  t.out.assign(t.q.size(), 0.f);
  t.lse.assign(static_cast<size_t>(kB * kHq * m), 0.f);
  t.delta.assign(t.lse.size(), 0.f);
  t.dq.assign(t.q.size(), 0.f);
  t.dk.assign(t.k.size(), 0.f);
  t.dv.assign(t.v.size(), 0.f);
  return t;
}

// Forward, delta and backward of one causal unit whose query rows start at q_row0 = n - m
// (the diagonal-and-below case, so pieces see different numbers of keys).
absl::Status RunUnit(AttentionBackend* be, Tensors* t, const MaskIntervalArrays* iv = nullptr) {
  ForwardArgs f;
  f.scale = 1.f / std::sqrt(float{kD});
  f.mask = MaskKind::kCausal;
  if (iv != nullptr) {
    f.mask = MaskKind::kIntervals;
    f.intervals = {iv->q_lo.data(), iv->q_hi.data(), iv->k_lo.data(), iv->k_hi.data(), iv->seq};
  }
  f.q = t->View(t->q, t->m, kHq);
  f.q_row0 = t->n - t->m;
  f.k = t->View(t->k, t->n, kHkv);
  f.v = t->View(t->v, t->n, kHkv);
  f.out = t->View(t->out, t->m, kHq);
  f.lse = t->Stats(t->lse, t->m);
  RETURN_IF_ERROR(be->Forward(f));
  RETURN_IF_ERROR(
      be->ComputeDelta(t->View(t->dout, t->m, kHq), f.out, t->Stats(t->delta, t->m), nullptr));
  BackwardArgs b;
  b.scale = f.scale;
  b.mask = f.mask;
  b.intervals = f.intervals;
  b.q = f.q;
  b.q_row0 = f.q_row0;
  b.k = f.k;
  b.v = f.v;
  b.dout = t->View(t->dout, t->m, kHq);
  b.lse = f.lse;
  b.delta = t->Stats(t->delta, t->m);
  b.dq = t->View(t->dq, t->m, kHq);
  b.dk = t->View(t->dk, t->n, kHkv);
  b.dv = t->View(t->dv, t->n, kHkv);
  return be->Backward(b);
}

void ExpectNear(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(double{a[i]} - b[i]));
    scale = std::max(scale, std::abs(double{b[i]}));
  }
  EXPECT_LE(worst, 1e-5 * std::max(1.0, scale)) << what;
}

std::unique_ptr<AttentionBackend> Cpu() {
  BackendOptions o;
  o.num_threads = 2;
  auto be = CreateBackend("cpu", o);
  EXPECT_TRUE(be.ok()) << be.status();
  return be.ok() ? *std::move(be) : nullptr;
}

TEST(CancellableBackendTest, PiecesGiveTheSameResultsAsWholeUnits) {
  constexpr int64_t m = 448, n = 640;  // 7 query blocks, causal with an offset
  Tensors whole = MakeTensors(m, n, 7), cut = MakeTensors(m, n, 7);
  auto plain = Cpu();
  ASSERT_NE(plain, nullptr);
  ASSERT_TRUE(RunUnit(plain.get(), &whole).ok());
  std::atomic<bool> cancel{false};
  // ~2 blocks of 64 rows per piece: several pieces of unequal row counts.
  const double per_piece = 4.0 * kB * kHq * kD * 64 * n * 2;
  CancellableBackend be(Cpu(), &cancel, per_piece);
  ASSERT_TRUE(RunUnit(&be, &cut).ok());
  ExpectNear(cut.out, whole.out, "out");
  ExpectNear(cut.lse, whole.lse, "lse");
  ExpectNear(cut.dq, whole.dq, "dq");
  ExpectNear(cut.dk, whole.dk, "dk");
  ExpectNear(cut.dv, whole.dv, "dv");
}

// Documents and a sliding window over the unit's 640 positions: many backward tiles see no key
// of theirs (skipped), and pieces end where the window has passed.
TEST(CancellableBackendTest, TilesUnderAnIntervalMaskGiveTheSameResults) {
  constexpr int64_t m = 448, n = 640;
  MaskSpec mask;
  mask.causal = true;
  mask.window_left = 150;
  mask.doc_offsets = {{0, 100, 130, 400, 401, n}};
  ASSERT_TRUE(ValidateMask(mask, kB, n).ok());
  const MaskIntervalArrays iv = BuildMaskIntervals(mask, kB, n);
  Tensors whole = MakeTensors(m, n, 11), cut = MakeTensors(m, n, 11);
  auto plain = Cpu();
  ASSERT_NE(plain, nullptr);
  ASSERT_TRUE(RunUnit(plain.get(), &whole, &iv).ok());
  std::atomic<bool> cancel{false};
  CancellableBackend be(Cpu(), &cancel, 4.0 * kB * kHq * kD * 64 * 64);
  ASSERT_TRUE(RunUnit(&be, &cut, &iv).ok());
  ExpectNear(cut.out, whole.out, "out");
  ExpectNear(cut.lse, whole.lse, "lse");
  ExpectNear(cut.dq, whole.dq, "dq");
  ExpectNear(cut.dk, whole.dk, "dk");
  ExpectNear(cut.dv, whole.dv, "dv");
}

// Counts Forward/Backward calls and sets the cancel flag during the first one.
class CancelDuringFirstCall final : public AttentionBackend {
 public:
  CancelDuringFirstCall(std::unique_ptr<AttentionBackend> inner, std::atomic<bool>* cancel)
      : inner_(std::move(inner)), cancel_(cancel) {}
  int calls = 0;
  std::string_view Name() const override { return "cpu"; }
  absl::Status Forward(const ForwardArgs& a) override {
    ++calls;
    cancel_->store(true);
    return inner_->Forward(a);
  }
  absl::Status Backward(const BackwardArgs& a) override {
    ++calls;
    cancel_->store(true);
    return inner_->Backward(a);
  }
  absl::Status Merge(const MergeArgs& a) override { return inner_->Merge(a); }
  absl::Status ComputeDelta(const TensorView& d, const TensorView& o, const RowStatView& s,
                            void* st) override {
    return inner_->ComputeDelta(d, o, s, st);
  }
  absl::Status Convert(const TensorView& s, const TensorView& d, void* st) override {
    return inner_->Convert(s, d, st);
  }
  absl::StatusOr<void*> Alloc(size_t b) override { return inner_->Alloc(b); }
  void Free(void* p) override { inner_->Free(p); }
  absl::Status Copy(void* d, const void* s, size_t b, CopyKind k, void* st) override {
    return inner_->Copy(d, s, b, k, st);
  }
  absl::Status Memset(void* d, int v, size_t b, void* st) override {
    return inner_->Memset(d, v, b, st);
  }
  absl::Status Synchronize(void* st) override { return inner_->Synchronize(st); }

 private:
  std::unique_ptr<AttentionBackend> inner_;
  std::atomic<bool>* cancel_;
};

TEST(CancellableBackendTest, CancelDuringAUnitStopsAtTheNextPiece) {
  constexpr int64_t m = 512, n = 512;
  Tensors t = MakeTensors(m, n, 3);
  std::atomic<bool> cancel{false};
  auto counting = std::make_unique<CancelDuringFirstCall>(Cpu(), &cancel);
  CancelDuringFirstCall* inner = counting.get();
  CancellableBackend be(std::move(counting), &cancel, 4.0 * kB * kHq * kD * 64 * n);
  const absl::Status st = RunUnit(&be, &t);
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
  EXPECT_EQ(inner->calls, 1);  // of 8 pieces, only the first ran

  // Reset: the same backend runs whole jobs again; and a flag already set refuses at once.
  cancel = false;
  inner->calls = 0;
  EXPECT_EQ(RunUnit(&be, &t).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(inner->calls, 1);
}

TEST(CancellableBackendTest, SmallUnitsAreNotCutAndAlreadyCancelledRefuses) {
  Tensors t = MakeTensors(64, 128, 5);
  std::atomic<bool> cancel{true};
  CancellableBackend be(Cpu(), &cancel, 1.0);  // tiny budget, but a 64-row unit is one piece
  EXPECT_EQ(RunUnit(&be, &t).code(), absl::StatusCode::kCancelled);
  cancel = false;
  EXPECT_TRUE(RunUnit(&be, &t).ok());
  EXPECT_EQ(be.Name(), "cpu");
}

}  // namespace
}  // namespace dfa
