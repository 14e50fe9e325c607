// The `dfa` argument parser and the shared spec flags.
#include "client/cli/args.h"

#include <gtest/gtest.h>

#include "client/cli/job_flags.h"

namespace dfa::cli {
namespace {

TEST(ArgsTest, ParsesValuesBooleansAndBothSpellings) {
  auto a = Args::Parse({"--workers", "3", "--seq=16K", "--kv_heads", "2", "--full", "--dtype", "f16"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a->GetInt("workers", 2, 1, 64), 3);
  EXPECT_EQ(*a->GetInt("seq", 0, 1, 1 << 30), 16384);
  EXPECT_EQ(*a->GetInt("kv-heads", 8, 1, 64), 2);
  EXPECT_TRUE(*a->GetBool("full", false));
  EXPECT_EQ(*a->GetString("dtype", "bf16"), "f16");
  EXPECT_EQ(*a->GetInt("heads", 8, 1, 64), 8);  // default
  EXPECT_TRUE(a->CheckNoUnknown().ok());
}

TEST(ArgsTest, ErrorsNameTheFlag) {
  auto a = Args::Parse({"--workers", "0", "--seq", "abc", "--tpyo", "1"});
  ASSERT_TRUE(a.ok());
  auto w = a->GetInt("workers", 2, 1, 64);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find("--workers"), std::string::npos);
  EXPECT_NE(a->GetInt("seq", 1, 1, 10).status().message().find("--seq"), std::string::npos);
  auto unknown = a->CheckNoUnknown();
  EXPECT_NE(unknown.message().find("--tpyo"), std::string::npos) << unknown;
  EXPECT_FALSE(Args::Parse({"positional"}).ok());
  EXPECT_FALSE(Args::Parse({"--seq", "1", "--seq", "2"}).ok());
}

TEST(JobFlagsTest, BuildsTheSpec) {
  auto a = Args::Parse({"--seq", "4096", "--heads", "8", "--kv-heads", "2", "--head-dim", "128",
                        "--full", "--workers", "3", "--schedule", "zigzag"});
  ASSERT_TRUE(a.ok());
  auto f = ParseJobFlags(*a, 2048, 2);
  ASSERT_TRUE(f.ok()) << f.status();
  const auto& s = f->session.spec;
  EXPECT_EQ(s.seq_len(), 4096);
  EXPECT_EQ(s.q_heads(), 8);
  EXPECT_EQ(s.kv_heads(), 2);
  EXPECT_EQ(s.head_dim(), 128);
  EXPECT_FALSE(s.causal());
  EXPECT_EQ(s.dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(f->session.num_workers, 3);
  EXPECT_EQ(f->session.schedule, "zigzag");
  EXPECT_TRUE(a->CheckNoUnknown().ok());

  auto bad = Args::Parse({"--heads", "6", "--kv-heads", "4"});
  auto fb = ParseJobFlags(*bad, 2048, 2);
  EXPECT_EQ(fb.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(fb.status().message().find("--kv-heads"), std::string::npos);
  auto dt = Args::Parse({"--dtype", "int8"});
  EXPECT_NE(ParseJobFlags(*dt, 2048, 2).status().message().find("--dtype"), std::string::npos);
}

}  // namespace
}  // namespace dfa::cli
