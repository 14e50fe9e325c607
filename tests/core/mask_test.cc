// core/mask: VisibleKeys, VisibleQueries, BuildMaskIntervals and the MaskSpec VisiblePairs
// against the brute-force definition of the mask (MaskSpec in core/mask.h), over 1-token
// documents, documents crossing any unit boundary, windows 0..S on either side, causal and
// not, and units whose rows see nothing; ValidateMask's messages.
#include "core/mask.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace dfa {
namespace {

// The definition: both in one document, causal, window.
bool Sees(const MaskSpec& m, int b, int64_t seq, int64_t i, int64_t j) {
  const std::vector<int64_t>& off = m.OffsetsOf(b);
  auto doc = [&](int64_t p) {
    int64_t d = 0;
    for (size_t k = 1; k + 1 < off.size(); ++k) d += p >= off[k];
    return d;
  };
  if (!off.empty() && doc(i) != doc(j)) return false;
  if (m.causal && j > i) return false;
  if (m.window_left >= 0 && j < i - m.window_left) return false;
  if (m.window_right >= 0 && j > i + m.window_right) return false;
  (void)seq;
  return true;
}

int64_t BrutePairs(const MaskSpec& m, int b, int64_t seq, int64_t q0, int64_t mq, int64_t k0,
                   int64_t nk) {
  int64_t c = 0;
  for (int64_t i = q0; i < q0 + mq; ++i) {
    for (int64_t j = k0; j < k0 + nk; ++j) c += Sees(m, b, seq, i, j);
  }
  return c;
}

std::vector<int64_t> Offsets(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> off{0};
  for (int64_t l : lengths) off.push_back(off.back() + l);
  return off;
}

// Documents of the given lengths, all mask variants over windows 0..seq.
std::vector<MaskSpec> Variants(const std::vector<std::vector<int64_t>>& docs, int64_t seq) {
  std::vector<MaskSpec> out;
  std::vector<int64_t> windows{-1, 0, 1, 2, 3, 5, seq - 1, seq};
  for (bool causal : {false, true}) {
    for (int64_t l : windows) {
      for (int64_t r : windows) {
        MaskSpec m;
        m.causal = causal;
        m.window_left = l;
        m.window_right = r;
        m.doc_offsets = docs;
        out.push_back(m);
      }
    }
  }
  return out;
}

std::string Describe(const MaskSpec& m) {
  std::string s = m.causal ? "causal" : "full";
  s += " wl=" + std::to_string(m.window_left) + " wr=" + std::to_string(m.window_right) +
       " docs=";
  for (const auto& row : m.doc_offsets) {
    s += "{";
    for (int64_t o : row) s += std::to_string(o) + ",";
    s += "}";
  }
  return s;
}

struct Layout {
  int batch;
  int64_t seq;
  std::vector<std::vector<int64_t>> docs;
};

std::vector<Layout> Layouts() {
  return {
      {1, 13, {}},                                         // one document
      {1, 13, {Offsets({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1})}},  // 1-token documents
      {1, 13, {Offsets({5, 1, 7})}},
      {2, 11, {Offsets({3, 8}), Offsets({1, 4, 4, 2})}},  // per row
      {3, 9, {Offsets({4, 5})}},                           // one entry: every row
  };
}

TEST(MaskTest, IntervalsMatchTheDefinition) {
  for (const Layout& lay : Layouts()) {
    for (const MaskSpec& m : Variants(lay.docs, lay.seq)) {
      ASSERT_TRUE(ValidateMask(m, lay.batch, lay.seq).ok()) << Describe(m);
      const MaskIntervalArrays a = BuildMaskIntervals(m, lay.batch, lay.seq);
      ASSERT_EQ(a.seq, lay.seq);
      ASSERT_EQ(a.q_lo.size(), static_cast<size_t>(lay.batch * lay.seq));
      for (int b = 0; b < lay.batch; ++b) {
        for (int64_t p = 0; p < lay.seq; ++p) {
          // Keys query p sees, and queries that see key p, by brute force: one interval each.
          int64_t klo = -1, khi = -1, qlo = -1, qhi = -1, kcount = 0, qcount = 0;
          for (int64_t x = 0; x < lay.seq; ++x) {
            if (Sees(m, b, lay.seq, p, x)) {
              if (klo < 0) klo = x;
              khi = x + 1;
              ++kcount;
            }
            if (Sees(m, b, lay.seq, x, p)) {
              if (qlo < 0) qlo = x;
              qhi = x + 1;
              ++qcount;
            }
          }
          ASSERT_EQ(kcount, khi - klo) << "keys of " << p << " are not one interval";
          ASSERT_EQ(qcount, qhi - qlo);
          const PositionInterval vk = VisibleKeys(m, b, lay.seq, p);
          const PositionInterval vq = VisibleQueries(m, b, lay.seq, p);
          EXPECT_EQ(vk.lo, klo) << Describe(m) << " b=" << b << " p=" << p;
          EXPECT_EQ(vk.hi, khi) << Describe(m) << " b=" << b << " p=" << p;
          EXPECT_EQ(vq.lo, qlo) << Describe(m) << " b=" << b << " p=" << p;
          EXPECT_EQ(vq.hi, qhi) << Describe(m) << " b=" << b << " p=" << p;
          const size_t at = static_cast<size_t>(b * lay.seq + p);
          EXPECT_EQ(a.q_lo[at], klo);
          EXPECT_EQ(a.q_hi[at], khi);
          EXPECT_EQ(a.k_lo[at], qlo);
          EXPECT_EQ(a.k_hi[at], qhi);
          if (p > 0) {  // non-decreasing, as kernels' tile skipping assumes
            EXPECT_LE(a.q_lo[at - 1], a.q_lo[at]);
            EXPECT_LE(a.q_hi[at - 1], a.q_hi[at]);
            EXPECT_LE(a.k_lo[at - 1], a.k_lo[at]);
            EXPECT_LE(a.k_hi[at - 1], a.k_hi[at]);
          }
        }
      }
    }
  }
}

TEST(MaskTest, VisiblePairsOfEveryUnitMatchBruteForce) {
  int64_t zero_units = 0, checked = 0;
  for (const Layout& lay : Layouts()) {
    for (const MaskSpec& m : Variants(lay.docs, lay.seq)) {
      for (int b = 0; b < lay.batch; ++b) {
        for (int64_t q0 = 0; q0 < lay.seq; ++q0) {
          for (int64_t mq = 1; q0 + mq <= lay.seq; mq += 2) {
            for (int64_t k0 = 0; k0 < lay.seq; k0 += 2) {
              for (int64_t nk = 1; k0 + nk <= lay.seq; nk += 3) {
                const int64_t want = BrutePairs(m, b, lay.seq, q0, mq, k0, nk);
                ASSERT_EQ(VisiblePairs(m, b, lay.seq, q0, mq, k0, nk), want)
                    << Describe(m) << " b=" << b << " q=[" << q0 << "," << q0 + mq << ") k=["
                    << k0 << "," << k0 + nk << ")";
                zero_units += want == 0;
                ++checked;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(zero_units, 0);  // units whose rows see nothing were among them
  EXPECT_GT(checked, 100000);
}

TEST(MaskTest, VisiblePairsOnLongRandomDocuments) {
  std::mt19937_64 rng(7);
  const int64_t seq = 700;
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<int64_t> lengths;
    for (int64_t left = seq; left > 0;) {
      const int64_t l = std::min<int64_t>(left, 1 + static_cast<int64_t>(rng() % 120));
      lengths.push_back(l);
      left -= l;
    }
    MaskSpec m;
    m.causal = trial % 2 == 0;
    m.window_left = trial % 3 == 0 ? -1 : static_cast<int64_t>(rng() % 200);
    m.window_right = trial % 4 == 0 ? -1 : static_cast<int64_t>(rng() % 200);
    m.doc_offsets = {Offsets(lengths)};
    for (int u = 0; u < 30; ++u) {
      const int64_t q0 = static_cast<int64_t>(rng() % seq);
      const int64_t mq = 1 + static_cast<int64_t>(rng() % (seq - q0));
      const int64_t k0 = static_cast<int64_t>(rng() % seq);
      const int64_t nk = 1 + static_cast<int64_t>(rng() % (seq - k0));
      ASSERT_EQ(VisiblePairs(m, 0, seq, q0, mq, k0, nk), BrutePairs(m, 0, seq, q0, mq, k0, nk))
          << Describe(m);
    }
  }
}

TEST(MaskTest, DenseMasksKeepTheirKinds) {
  MaskSpec m;
  EXPECT_TRUE(m.IsDense());
  EXPECT_EQ(m.Kind(), MaskKind::kFull);
  m.causal = true;
  EXPECT_EQ(m.Kind(), MaskKind::kCausal);
  m.window_right = 4;  // causal caps the right side at 0 anyway
  EXPECT_EQ(m.Kind(), MaskKind::kCausal);
  m.doc_offsets = {{0, 16}};  // one document
  EXPECT_EQ(m.Kind(), MaskKind::kCausal);
  m.window_left = 3;
  EXPECT_EQ(m.Kind(), MaskKind::kIntervals);
  m.window_left = -1;
  m.doc_offsets = {{0, 5, 16}};
  EXPECT_EQ(m.Kind(), MaskKind::kIntervals);
  // A dense causal spec counts the pairs the causal VisiblePairs counts.
  MaskSpec c;
  c.causal = true;
  EXPECT_EQ(VisiblePairs(c, 0, 64, 16, 16, 0, 40), VisiblePairs(16, 16, 0, 40, MaskKind::kCausal));
}

TEST(MaskTest, ValidateMaskNamesTheField) {
  auto message = [](const MaskSpec& m, int batch, int64_t seq) {
    return std::string(ValidateMask(m, batch, seq).message());
  };
  MaskSpec m;
  m.doc_offsets = {{0, 4, 8}, {0, 6, 5, 8}};
  EXPECT_EQ(message(m, 2, 8),
            "doc_offsets[1][2]: must be greater than doc_offsets[1][1] = 6, got 5");
  m.doc_offsets = {{0, 4, 8}, {1, 8}};
  EXPECT_EQ(message(m, 2, 8), "doc_offsets[1][0]: must be 0, got 1");
  m.doc_offsets = {{0, 4, 7}};
  EXPECT_EQ(message(m, 2, 8), "doc_offsets[0][2]: must be seq_len = 8, got 7");
  m.doc_offsets = {{0, 4, 9, 12}};  // past the end before the last offset: named where it is
  EXPECT_EQ(message(m, 1, 8), "doc_offsets[0][2]: must be less than seq_len = 8, got 9");
  m.doc_offsets = {{0, 4, 9}};
  EXPECT_EQ(message(m, 1, 8), "doc_offsets[0][2]: must be seq_len = 8, got 9");
  m.doc_offsets = {{0, 8}, {0, 8}};
  EXPECT_EQ(message(m, 3, 8), "doc_offsets: must have 0, 1 or batch (3) entries, got 2");
  m.doc_offsets = {{0}};
  EXPECT_EQ(message(m, 1, 8),
            "doc_offsets[0]: must hold at least 2 offsets {0, ..., seq_len = 8}, got 1");
  m.doc_offsets.clear();
  m.window_left = -2;
  EXPECT_EQ(message(m, 1, 8), "window_left: must be >= 0 (or -1: unbounded), got -2");
  m.window_left = 0;
  m.window_right = -5;
  EXPECT_EQ(message(m, 1, 8), "window_right: must be >= 0 (or -1: unbounded), got -5");
  m.window_right = 0;
  EXPECT_TRUE(ValidateMask(m, 1, 8).ok());
}

}  // namespace
}  // namespace dfa
