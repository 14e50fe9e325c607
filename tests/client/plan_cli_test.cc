#include <cstdio>
#include <string>
#include <vector>

#include "client/plan_cli/plan_command.h"
#include "gtest/gtest.h"

namespace dfa {
namespace {

struct Result {
  int code;
  std::string out, err;
};

Result RunPlan(std::vector<std::string> args) {
  args.insert(args.begin(), "plan");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  const int code = RunPlanCommand(static_cast<int>(argv.size()), argv.data());
  Result r{code, ::testing::internal::GetCapturedStdout(), ::testing::internal::GetCapturedStderr()};
  return r;
}

double JsonNumber(const std::string& json, const std::string& key) {
  const size_t at = json.find("\"" + key + "\":");
  if (at == std::string::npos) return -1;
  return std::stod(json.substr(at + key.size() + 3));
}

// peak_bytes_per_worker (docs/memory.md): one worker, 256K causal, 32 x 128 bf16: the storage
// (Q, K, V, dO bf16, LSE and D fp32, the work region: fp32 dQ over O) and one key chunk of fp32
// dK, dV -- 80.25 KB per token in one chunk, 52.25 KB with --step-tokens 32K; the text output
// names it; a bad --step-tokens is refused naming the flag.
TEST(PlanCommandTest, ReportsPeakBytesPerWorker) {
  const int64_t S = 262144, bf16 = int64_t{32} * 128 * 2, f32 = 2 * bf16;
  const int64_t storage = S * (4 * bf16 + 2 * 32 * 4 + f32);
  Result one = RunPlan({"--workers", "1", "--seq", "256K", "--schedule", "balanced", "--json"});
  ASSERT_EQ(one.code, 0) << one.err;
  EXPECT_EQ(JsonNumber(one.out, "peak_bytes_per_worker"), double(storage + S * 2 * f32));
  EXPECT_EQ(JsonNumber(one.out, "peak_bytes_per_worker") / S, 80.25 * 1024);
  Result chunks = RunPlan({"--workers", "1", "--seq", "256K", "--schedule", "balanced", "--json",
                           "--step-tokens", "32768"});
  ASSERT_EQ(chunks.code, 0) << chunks.err;
  EXPECT_EQ(JsonNumber(chunks.out, "peak_bytes_per_worker") / S, 52.25 * 1024);
  EXPECT_NE(chunks.out.find("\"chunked_backward\":true"), std::string::npos);
  // P = 2: the largest worker's charge, at least its storage with fp32 dK, dV.
  Result two = RunPlan({"--workers", "2", "--seq", "256K", "--schedule", "zigzag", "--json"});
  ASSERT_EQ(two.code, 0) << two.err;
  EXPECT_GT(JsonNumber(two.out, "peak_bytes_per_worker"), S / 2 * (4 * bf16 + 3 * f32));
  Result text = RunPlan({"--workers", "1", "--seq", "4096", "--schedule", "balanced"});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("peak_bytes_per_worker "), std::string::npos) << text.out;
  Result bad = RunPlan({"--workers", "1", "--seq", "4096", "--schedule", "balanced",
                        "--step-tokens", "0"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("step-tokens"), std::string::npos) << bad.err;
}

TEST(PlanCommandTest, JsonReportsTheMakespanRatio) {
  Result r = RunPlan({"--workers", "4", "--seq", "4096", "--schedule", "ring", "--json",
                  "--bandwidth-gbps", "0"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NEAR(JsonNumber(r.out, "makespan_ratio"), 7.0 / 4, 0.01);
  Result b = RunPlan({"--workers=4", "--seq=4096", "--schedule=balanced", "--json",
                  "--bandwidth-gbps=0"});
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_LE(JsonNumber(b.out, "makespan_ratio"), 1.02);
  EXPECT_NE(b.out.find("\"bytes_sent\""), std::string::npos);
  EXPECT_NE(b.out.find("\"bytes_received\""), std::string::npos);
}

// --profile gpu: GPU figures (and the GPU search) at P = 2, 16K: few ops, not slower than zigzag;
// explicit flags override single figures; JSON names the profile.
TEST(PlanCommandTest, GpuProfilePicksFewOpsAndNamesItself) {
  const std::vector<std::string> base = {"--workers", "2", "--seq", "16384", "--causal",
                                         "--json", "--profile", "gpu"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return RunPlan(a);
  };
  Result b = with({"--schedule", "balanced"});
  Result z = with({"--schedule", "zigzag"});
  ASSERT_EQ(b.code, 0) << b.err;
  ASSERT_EQ(z.code, 0) << z.err;
  EXPECT_EQ(b.out.rfind("{\"profile\":\"gpu\"", 0), 0u) << b.out.substr(0, 80);
  const double bt = JsonNumber(b.out, "makespan_seconds");
  const double zt = JsonNumber(z.out, "makespan_seconds");
  EXPECT_GT(bt, 0);
  EXPECT_LE(bt, zt * (1 + 1e-9));  // forward makespan (first in the JSON)
  EXPECT_LE(JsonNumber(b.out, "compute_ops"), 8);
  Result cpu = RunPlan({"--workers", "2", "--seq", "16384", "--schedule", "balanced", "--json"});
  ASSERT_EQ(cpu.code, 0) << cpu.err;
  EXPECT_NE(cpu.out.find("\"profile\":\"cpu\""), std::string::npos);
  EXPECT_GT(JsonNumber(cpu.out, "compute_ops"), 8);  // the CPU rule: many small pieces
  // An explicit figure overrides the profile's: no per-op overhead, no merge -> faster.
  Result free_ops = with({"--schedule", "zigzag", "--op-overhead-us", "0", "--memory-gbps", "0"});
  ASSERT_EQ(free_ops.code, 0) << free_ops.err;
  EXPECT_LT(JsonNumber(free_ops.out, "makespan_seconds"), zt);
}

TEST(PlanCommandTest, TextPrintsStepsBusyIdleAndBytes) {
  Result r = RunPlan({"--workers", "3", "--seq", "300", "--heads", "8", "--kv-heads", "2",
                  "--full", "--speeds", "1,2,1", "--schedule", "balanced"});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* s : {"step 0", "busy_s", "idle_s", "bytes_sent", "makespan/ideal", "full"}) {
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
  }
}

// --schedule heads prints each worker's kv head range (text and JSON); --schedule auto picks
// heads where it is cheaper (GPU profile, 16K, P = 2) and names the schedule it picked.
TEST(PlanCommandTest, HeadsAndAutoPrintTheHeadRanges) {
  Result t = RunPlan({"--workers", "4", "--seq", "1000", "--heads", "8", "--kv-heads", "2",
                      "--schedule", "heads"});
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("schedule heads"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("owns [0,"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("kv_heads [0,1)"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("kv_heads [1,2)"), std::string::npos) << t.out;
  Result j = RunPlan({"--workers", "2", "--seq", "4096", "--schedule", "heads", "--json",
                      "--steps"});
  ASSERT_EQ(j.code, 0) << j.err;
  EXPECT_NE(j.out.find("\"kv_heads\":[0,16]"), std::string::npos) << j.out.substr(0, 400);
  EXPECT_NE(j.out.find("\"kv_heads\":[16,32]"), std::string::npos);
  EXPECT_EQ(JsonNumber(j.out, "bytes_sent"), 0);
  Result a = RunPlan({"--workers", "2", "--seq", "16384", "--schedule", "auto", "--profile",
                      "gpu", "--json"});
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_NE(a.out.find("\"schedule\":\"heads\""), std::string::npos) << a.out.substr(0, 200);
  // Plans of the other schedules print no head ranges.
  Result r = RunPlan({"--workers", "2", "--seq", "4096", "--schedule", "ring", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find("kv_heads"), std::string::npos);
}

// --doc-lengths / --window: the masked plan, checked (exit 0), its mask in the text and JSON,
// balanced on visible pairs; bad mask flags exit 2 naming the flag.
TEST(PlanCommandTest, DocLengthsAndWindowPrintTheMaskedPlan) {
  Result j = RunPlan({"--workers", "3", "--seq", "4K", "--schedule", "balanced", "--json",
                      "--doc-lengths", "100,1000,2900,96", "--window", "512", "--bandwidth-gbps",
                      "0"});
  ASSERT_EQ(j.code, 0) << j.err;
  EXPECT_EQ(JsonNumber(j.out, "documents"), 4);
  EXPECT_EQ(JsonNumber(j.out, "longest_document"), 2900);
  EXPECT_EQ(JsonNumber(j.out, "window_left"), 512);
  EXPECT_GT(JsonNumber(j.out, "visible_pair_fraction"), 0);
  EXPECT_LT(JsonNumber(j.out, "visible_pair_fraction"), 0.2);
  EXPECT_GE(JsonNumber(j.out, "makespan_ratio"), 1);  // (balance: tests/core/planner_mask_test)
  EXPECT_LT(JsonNumber(j.out, "makespan_ratio"), 1.1);
  Result t = RunPlan({"--workers", "2", "--seq", "1024", "--schedule", "zigzag", "--full",
                      "--doc-lengths", "1,1000,23"});
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("full, 3 documents (longest 1000)"), std::string::npos) << t.out;
  Result bad = RunPlan({"--workers", "2", "--seq", "1024", "--schedule", "ring",
                        "--doc-lengths", "1000,23"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--doc-lengths"), std::string::npos) << bad.err;
  Result w = RunPlan({"--workers", "2", "--seq", "1024", "--schedule", "ring", "--window",
                      "-4"});
  EXPECT_EQ(w.code, 2);
  EXPECT_NE(w.err.find("--window"), std::string::npos) << w.err;
}

TEST(PlanCommandTest, BadInputGivesAClearErrorAndNonZeroExit) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--workers", "0", "--seq", "8", "--schedule", "ring"}, "--workers"},
      {{"--workers", "8", "--seq", "4", "--schedule", "ring"}, "seq_len"},
      {{"--workers", "2", "--seq", "8", "--heads", "6", "--kv-heads", "4", "--schedule", "ring"},
       "multiple"},
      {{"--workers", "2", "--seq", "8", "--schedule", "spiral"}, "unknown"},
      {{"--workers", "3", "--seq", "30", "--schedule", "distflash"}, "even"},
      {{"--workers", "x", "--seq", "8", "--schedule", "ring"}, "not an integer"},
      {{"--workers", "2", "--seq", "8"}, "--schedule"},
      {{"--workers", "2", "--seq", "8", "--schedule", "ring", "--bogus"}, "unknown flag"},
      {{"--workers", "2", "--seq", "8", "--schedule", "balanced", "--speeds", "1,0"}, "speeds"},
      {{"--workers", "2", "--seq"}, "needs a value"},
      {{"--workers", "2", "--seq", "8", "--schedule", "ring", "--profile", "tpu"}, "--profile"},
      {{"--workers", "2", "--seq", "8", "--schedule", "head"}, "heads or auto"},
      {{"--workers", "2", "--seq", "8", "--heads", "6", "--kv-heads", "4", "--schedule", "heads"},
       "multiple"},
      {{"--workers", "4", "--seq", "3", "--schedule", "auto"}, "seq_len"},
  };
  for (const auto& [args, want] : cases) {
    Result r = RunPlan(args);
    EXPECT_EQ(r.code, 2) << want;
    EXPECT_NE(r.err.find(want), std::string::npos) << "stderr: " << r.err;
  }
}

}  // namespace
}  // namespace dfa
