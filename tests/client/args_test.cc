// The `dfa` argument parser and the shared spec flags; the command harness (help, version,
// "did you mean", exit statuses); the host-memory refusal; the JSON writer.
#include "client/cli/args.h"

#include <gtest/gtest.h>

#include <cmath>
#include <new>

#include "client/cli/commands.h"
#include "client/cli/host_memory.h"
#include "client/cli/job_flags.h"
#include "client/cli/json_writer.h"
#include "core/version.h"

namespace dfa::cli {
namespace {

TEST(ArgsTest, ParsesValuesBooleansAndBothSpellings) {
  auto a =
      Args::Parse({"--workers", "3", "--seq=16K", "--kv_heads", "2", "--full", "--dtype", "f16"});
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

TEST(ArgsTest, SizeUnitsOnEveryIntegerFlag) {
  EXPECT_EQ(*ParseCount("seq", "16K"), 16384);
  EXPECT_EQ(*ParseCount("seq", "256k"), 262144);
  EXPECT_EQ(*ParseCount("seq", "64M"), int64_t{64} << 20);
  EXPECT_EQ(*ParseCount("memory-limit", "8G"), int64_t{8} << 30);
  EXPECT_EQ(*ParseCount("x", "2T"), int64_t{2} << 40);
  EXPECT_EQ(*ParseCount("x", "123"), 123);
  EXPECT_EQ(*ParseInteger("x", "-2K"), -2048);
  for (const char* bad : {"", "K", "1.5K", "abc", "16KB", "-1", "1e3", " 1"}) {
    auto r = ParseCount("seq", bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("--seq"), std::string::npos) << r.status();
  }
  EXPECT_NE(ParseCount("seq", "").status().message().find("needs a value"), std::string::npos);
  auto huge = ParseCount("seq", "9000000T");
  EXPECT_NE(huge.status().message().find("too large"), std::string::npos) << huge.status();
  auto a = Args::Parse({"--batch", "1K", "--heads=2k", "--workers", "1K"});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a->GetInt("batch", 1, 1, 1 << 20), 1024);
  EXPECT_EQ(*a->GetInt("heads", 1, 1, 1 << 20), 2048);
  auto w = a->GetInt("workers", 1, 1, 64);
  EXPECT_NE(w.status().message().find("--workers must be in [1, 64], got 1024"), std::string::npos)
      << w.status();
}

TEST(ArgsTest, HelpDashDashAndRest) {
  auto a = Args::Parse({"-h", "--workers", "2", "--", "--threads=1", "x"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->Has("help"));
  EXPECT_EQ(*a->GetInt("workers", 1, 1, 8), 2);
  EXPECT_EQ(a->rest(), (std::vector<std::string>{"--threads=1", "x"}));
  EXPECT_TRUE(Args::Parse({"--full", "--", "--seq"})->rest().size() == 1);
}

TEST(ArgsTest, DidYouMean) {
  EXPECT_EQ(EditDistance("coordinatr", "coordinator"), 1);
  EXPECT_EQ(EditDistance("sumbit", "submit"), 1);  // a transposition is one edit
  EXPECT_EQ(EditDistance("", "abc"), 3);
  const std::vector<std::string> flags = {"coordinator", "seq", "heads", "head-dim", "json"};
  EXPECT_EQ(ClosestMatch("coordinatr", flags), "coordinator");
  EXPECT_EQ(ClosestMatch("coord", flags), "coordinator");  // a unique prefix
  EXPECT_EQ(ClosestMatch("sq", flags), "seq");
  EXPECT_EQ(ClosestMatch("bogus", flags), "");
  EXPECT_EQ(ClosestMatch("he", flags), "");  // prefix of two

  auto a = Args::Parse({"--coordinatr", "127.0.0.1:1", "--seq", "1K"});
  ASSERT_TRUE(a.ok());
  absl::Status s = a->CheckKnown({"coordinator", "seq", "kv-heads"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "unknown flag --coordinatr (did you mean --coordinator?)");
  auto b = Args::Parse({"--kv_haeds", "2", "--tpyo"});
  EXPECT_EQ(b->CheckKnown({"kv-heads", "seq"}).message(),
            "unknown flag --kv_haeds (did you mean --kv-heads?); unknown flag --tpyo");
  EXPECT_TRUE(Args::Parse({"--kv_heads", "2"})->CheckKnown({"kv-heads"}).ok());
}

struct Outcome {
  int code;
  std::string out, err;
};

Outcome RunCapture(const CommandInfo& info, std::vector<std::string> words,
                   const std::function<absl::Status(Args&)>& fn) {
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  const int code = RunCommand(info, words, fn);
  Outcome r{code, ::testing::internal::GetCapturedStdout(),
            ::testing::internal::GetCapturedStderr()};
  return r;
}

TEST(CommandTest, HelpVersionUnknownFlagsAndExitStatuses) {
  const CommandInfo info{
      "dfa",
      "dfa test",
      "[flags]",
      "A command.",
      {{"Group", {{"coordinator", "HOST:PORT", "where"}, {"json", "", "as JSON"}}}},
      "An example."};
  int calls = 0;
  auto ok = [&calls](Args& args) {
    ++calls;
    return args.GetString("coordinator", "").status();
  };
  for (const char* h : {"--help", "-h"}) {
    Outcome r = RunCapture(info, {h, "--bogus"}, ok);
    EXPECT_EQ(r.code, 0);
    for (const char* want : {"usage: dfa test [flags]", "A command.", "--coordinator HOST:PORT",
                             "--json", "-h, --help", "--version", "An example."}) {
      EXPECT_NE(r.out.find(want), std::string::npos) << want << " in\n" << r.out;
    }
  }
  Outcome v = RunCapture(info, {"--version"}, ok);
  EXPECT_EQ(v.code, 0);
  EXPECT_EQ(v.out, VersionString("dfa") + "\n");
  EXPECT_EQ(calls, 0);

  Outcome typo = RunCapture(info, {"--coordinatr", "x"}, ok);
  EXPECT_EQ(typo.code, kExitUsage);
  EXPECT_NE(typo.err.find("dfa test: unknown flag --coordinatr (did you mean --coordinator?)"),
            std::string::npos)
      << typo.err;
  EXPECT_EQ(calls, 0);  // refused before the command runs
  EXPECT_EQ(RunCapture(info, {"--coordinator", "x"}, ok).code, 0);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(RunCapture(info, {}, [](Args&) { return absl::InvalidArgumentError("--x bad"); }).code,
            kExitUsage);
  Outcome failed = RunCapture(info, {}, [](Args&) { return absl::UnavailableError("gone"); });
  EXPECT_EQ(failed.code, kExitFailure);
  EXPECT_NE(failed.err.find("dfa test: UNAVAILABLE: gone"), std::string::npos) << failed.err;
  Outcome oom = RunCapture(info, {}, [](Args&) -> absl::Status { throw std::bad_alloc(); });
  EXPECT_EQ(oom.code, kExitFailure);
  EXPECT_NE(oom.err.find("out of memory"), std::string::npos) << oom.err;
}

// Every command's --help lists every flag of its table (the table is also what unknown flags
// are checked against), and the shared groups are there.
TEST(CommandTest, EveryCommandsHelpListsItsFlags) {
  for (const CommandInfo& info : {DemoCommandInfo(), SubmitCommandInfo(), StatusCommandInfo(),
                                  WorkersCommandInfo(), BenchCommandInfo(), ClusterCommandInfo()}) {
    const std::string help = FormatHelp(info);
    EXPECT_EQ(help.rfind("usage: " + info.name, 0), 0u) << help;
    for (const std::string& name : FlagNames(info)) {
      EXPECT_NE(help.find("--" + name), std::string::npos) << info.name << " --" << name;
    }
    EXPECT_NE(help.find("--auth-token"), std::string::npos) << info.name;
  }
  const std::string submit = FormatHelp(SubmitCommandInfo());
  for (const char* f : {"--coordinator", "--seq", "--kv-heads", "--verify", "--forward-only"}) {
    EXPECT_NE(submit.find(f), std::string::npos) << f;
  }
  EXPECT_NE(FormatHelp(StatusCommandInfo()).find("--json"), std::string::npos);
  EXPECT_NE(FormatHelp(WorkersCommandInfo()).find("--json"), std::string::npos);
  EXPECT_NE(FormatHelp(DemoCommandInfo()).find("--coordinator"), std::string::npos);
}

TEST(HostMemoryTest, CountsTheClientsTensorsAndRefusesWhatCannotFit) {
  v1::AttentionSpec spec;
  spec.set_batch(1);
  spec.set_seq_len(1024);
  spec.set_q_heads(8);
  spec.set_kv_heads(2);
  spec.set_head_dim(64);
  spec.set_dtype(v1::DTYPE_BF16);
  const double q = 1024.0 * 8 * 64 * 2, kv = 1024.0 * 2 * 64 * 2, lse = 1024.0 * 8 * 4;
  EXPECT_DOUBLE_EQ(TrainingRunBytes(spec, false, false), q + 2 * kv + q + lse);
  EXPECT_DOUBLE_EQ(TrainingRunBytes(spec, true, false), (q + 2 * kv + q + lse) + q + q + 2 * kv);
  EXPECT_GT(TrainingRunBytes(spec, true, true), TrainingRunBytes(spec, true, false));
  EXPECT_TRUE(CheckTrainingRunMemory(spec, true, true).ok());
  // dfa submit --seq 64M --heads 64 --head-dim 128: terabytes, refused before any allocation.
  spec.set_seq_len(int64_t{64} << 20);
  spec.set_q_heads(64);
  spec.set_kv_heads(64);
  spec.set_head_dim(128);
  ASSERT_GT(AvailableHostBytes(), 0);
  absl::Status s = CheckTrainingRunMemory(spec, true, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  for (const char* want :
       {"--seq 67108864", "--heads 64", "--head-dim 128", "8.02 TiB", "host memory", "available"}) {
    EXPECT_NE(s.message().find(want), std::string::npos) << want << " in " << s.message();
  }
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(12), "12 B");
}

TEST(JsonWriterTest, EscapesAndKeepsOrder) {
  EXPECT_EQ(JsonQuote("a\"b\\c\n\x01"), "\"a\\\"b\\\\c\\n\\u0001\"");
  EXPECT_EQ(JsonObject().Str("s", "x").Int("i", -3).Num("d", 0.5).Bool("b", true).str(),
            "{\"s\":\"x\",\"i\":-3,\"d\":0.5,\"b\":true}");
  EXPECT_EQ(JsonObject().Num("nan", std::nan("")).Raw("a", JsonArray({"1", "2"})).str(),
            "{\"nan\":null,\"a\":[1,2]}");
}

}  // namespace
}  // namespace dfa::cli
