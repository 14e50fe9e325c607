// SessionMask (worker/session_mask.h): a dense mask holds nothing; a masked one holds the
// interval arrays of BuildMaskIntervals in the backend's memory, sized as Bytes says, freed
// with the mask.
#include "worker/session_mask.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace dfa {
namespace {

TEST(SessionMaskTest, DenseHoldsNothing) {
  auto backend = CreateBackend("cpu", BackendOptions{1, 0});
  ASSERT_TRUE(backend.ok());
  MaskSpec m;
  m.causal = true;
  m.doc_offsets = {{0, 100}};  // one document: dense
  EXPECT_EQ(SessionMask::Bytes(m, 2, 100), 0);
  auto mask = SessionMask::Create(backend->get(), m, 2, 100);
  ASSERT_TRUE(mask.ok()) << mask.status();
  EXPECT_TRUE((*mask)->dense());
  EXPECT_EQ((*mask)->bytes(), 0);
  EXPECT_EQ((*mask)->intervals().q_lo, nullptr);
}

TEST(SessionMaskTest, MaskedHoldsTheIntervalArrays) {
  auto backend = CreateBackend("cpu", BackendOptions{1, 0});
  ASSERT_TRUE(backend.ok());
  MaskSpec m;
  m.causal = true;
  m.window_left = 7;
  m.doc_offsets = {{0, 1, 40, 100}, {0, 60, 100}};
  ASSERT_TRUE(ValidateMask(m, 2, 100).ok());
  auto mask = SessionMask::Create(backend->get(), m, 2, 100);
  ASSERT_TRUE(mask.ok()) << mask.status();
  EXPECT_FALSE((*mask)->dense());
  EXPECT_EQ((*mask)->bytes(), SessionMask::Bytes(m, 2, 100));
  EXPECT_EQ((*mask)->bytes(), 4 * 2 * 100 * 4);
  const MaskIntervals iv = (*mask)->intervals();
  EXPECT_EQ(iv.seq, 100);
  const MaskIntervalArrays want = BuildMaskIntervals(m, 2, 100);
  for (auto [got, ref] : {std::pair{iv.q_lo, &want.q_lo}, std::pair{iv.q_hi, &want.q_hi},
                          std::pair{iv.k_lo, &want.k_lo}, std::pair{iv.k_hi, &want.k_hi}}) {
    ASSERT_NE(got, nullptr);
    EXPECT_EQ(std::memcmp(got, ref->data(), ref->size() * sizeof(int32_t)), 0);
  }
  EXPECT_EQ((*mask)->spec().window_left, 7);
}

}  // namespace
}  // namespace dfa
