// The mask flags of dfa demo / submit / bench / plan (client/cli/mask_flags.h): --doc-lengths
// with size units into offsets, --window LEFT[,RIGHT], and the refusals naming the flag.
#include "client/cli/mask_flags.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace dfa::cli {
namespace {

absl::StatusOr<MaskSpec> Parse(const std::vector<std::string>& words, int64_t seq,
                               bool causal = true) {
  auto args = Args::Parse(words);
  if (!args.ok()) return args.status();
  return ParseMaskFlags(*args, seq, causal);
}

TEST(MaskFlagsTest, DocumentLengthsBecomeOffsetsForEveryRow) {
  auto m = Parse({"--doc-lengths", "1K,1,3071"}, 4096);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->doc_offsets.size(), 1u);
  EXPECT_EQ(m->doc_offsets[0], (std::vector<int64_t>{0, 1024, 1025, 4096}));
  EXPECT_TRUE(m->causal);
  EXPECT_EQ(m->window_left, -1);
  EXPECT_EQ(m->Kind(), MaskKind::kIntervals);
  EXPECT_TRUE(ValidateMask(*m, 4, 4096).ok());
}

TEST(MaskFlagsTest, WindowSides) {
  auto m = Parse({"--window=4K"}, 8192, false);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(m->causal);
  EXPECT_EQ(m->window_left, 4096);
  EXPECT_EQ(m->window_right, 0);  // RIGHT defaults to 0
  m = Parse({"--window", "-1,64"}, 8192, false);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->window_left, -1);
  EXPECT_EQ(m->window_right, 64);
  m = Parse({}, 8192);
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->IsDense());
  EXPECT_EQ(DescribeMask(*m), "");
  m = Parse({"--doc-lengths", "100,28", "--window", "16"}, 128);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(DescribeMask(*m), " docs=2 window=16,0");
}

TEST(MaskFlagsTest, RefusalsNameTheFlag) {
  auto message = [](const std::vector<std::string>& words, int64_t seq) {
    auto m = Parse(words, seq);
    EXPECT_FALSE(m.ok());
    return std::string(m.status().message());
  };
  EXPECT_EQ(message({"--doc-lengths", "50,40"}, 100),
            "--doc-lengths: the lengths sum to 90, --seq is 100");
  EXPECT_EQ(message({"--doc-lengths", "50,60"}, 100),
            "--doc-lengths: the lengths up to length 1 sum past --seq = 100");
  EXPECT_EQ(message({"--doc-lengths", "50,0,50"}, 100),
            "--doc-lengths: length 1 ('0') is not a count >= 1 (lengths L1,L2,... summing to "
            "--seq, K/M units)");
  EXPECT_EQ(message({"--doc-lengths=,100"}, 100),
            "--doc-lengths: length 0 ('') is not a count >= 1 (lengths L1,L2,... summing to "
            "--seq, K/M units)");
  EXPECT_EQ(message({"--doc-lengths"}, 100), "--doc-lengths needs a value");
  EXPECT_EQ(message({"--window", "1,2,3"}, 100), "--window: '1,2,3' is not LEFT or LEFT,RIGHT");
  EXPECT_EQ(message({"--window", "-2"}, 100),
            "--window: LEFT = '-2' is not a count >= 0 or -1 (unbounded)");
  EXPECT_EQ(message({"--window", "5,x"}, 100),
            "--window: RIGHT = 'x' is not a count >= 0 or -1 (unbounded)");
}

}  // namespace
}  // namespace dfa::cli
