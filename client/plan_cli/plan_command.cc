#include "client/plan_cli/plan_command.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/cli/command.h"
#include "client/cli/mask_flags.h"
#include "core/planner/cost_model.h"
#include "core/planner/plan_checker.h"
#include "core/planner/plan_coalescing.h"
#include "core/planner/plan_format.h"
#include "core/planner/planner.h"
#include "core/planner/worker_memory.h"

namespace dfa {
namespace {

using cli::Args;

cli::CommandInfo PlanInfo(const std::string& name, const std::string& program) {
  cli::CommandInfo info = {program,
          name,
          "--workers P --seq S --schedule NAME [flags]",
          "Makes a plan, checks it (every visible pair computed exactly once, sends and receives\n"
          "matched, data present when used) and prints its steps and the cost model's figures:\n"
          "makespan, busy and idle per worker, bytes moved, makespan/ideal. Exit 1 if a made plan\n"
          "fails its check (a planner bug), 2 for bad input.",
          {{"Plan",
            {{"workers", "P", "workers (required)"},
             {"seq", "S", "sequence length, e.g. 256K (required)"},
             {"schedule", "NAME", "ring, distflash, zigzag, balanced, heads or auto (required)"},
             {"causal", "", "causal mask (the default)"},
             {"full", "", "no mask"},
             {"speeds", "a,b,...", "relative worker speeds (default all 1)"},
             {"heads", "H", "query heads (default 32)"},
             {"kv-heads", "HK", "key/value heads; H must be a multiple (default H)"},
             {"head-dim", "D", "head dimension (default 128)"},
             {"batch", "B", "batch size (default 1)"},
             {"dtype", "bf16|f16|f32", "element type (default bf16)"},
             {"step-tokens", "N",
              "key rows per chunk of a chunked backward, as dfa-worker --step_tokens (default "
              "256K): the session memory figures (docs/memory.md)"}}},
           {"Output",
            {{"json", "", "one JSON document on stdout (keys: docs/client.md, docs/planner.md)"},
             {"steps", "", "print the forward and backward steps"},
             {"no-steps", "", "print no steps (default: the forward steps when P <= 8)"}}},
           {"Cost model",
            {{"profile", "cpu|gpu", "cost figures and the balanced search's profile (default cpu)"},
             {"tflops", "F", "compute rate at speed 1, TFLOP/s (default: the profile's)"},
             {"bandwidth-gbps", "G", "per link and direction, GB/s (0: free)"},
             {"latency-us", "L", "per message, microseconds"},
             {"op-overhead-us", "U", "per compute op, microseconds (default 0)"},
             {"memory-gbps", "M", "per-op fp32 merge traffic, GB/s (default 0: ignored)"}}}},
          "Sizes take K, M, G: dfa plan --workers 8 --seq 256K --schedule balanced --json"};
  // --doc-lengths, --window: the mask the plan balances (visible pairs only).
  for (cli::FlagInfo& f : cli::MaskFlagInfos()) info.groups[0].flags.push_back(std::move(f));
  return info;
}

struct Parsed {
  PlanRequest request;
  AttentionShape shape;
  CostParams cost;
  std::string profile = "cpu";
  bool json = false;
  int64_t step_tokens = kDefaultStepTokens;
  int steps = -1;  // -1: print steps when P <= 8 (text mode)
};

absl::StatusOr<Parsed> Parse(Args& args) {
  Parsed a;
  a.request.schedule.clear();
  if (!args.Has("workers")) return absl::InvalidArgumentError("--workers is required");
  if (!args.Has("seq")) return absl::InvalidArgumentError("--seq is required");
  ASSIGN_OR_RETURN(int64_t workers, args.GetInt("workers", 0, 1, 4096));
  ASSIGN_OR_RETURN(a.request.seq_len, args.GetInt("seq", 0, 1, int64_t{1} << 40));
  ASSIGN_OR_RETURN(a.request.schedule, args.GetString("schedule", ""));
  if (a.request.schedule.empty()) return absl::InvalidArgumentError("--schedule is required");
  a.request.workers = static_cast<int>(workers);
  ASSIGN_OR_RETURN(int64_t heads, args.GetInt("heads", 32, 1, 4096));
  ASSIGN_OR_RETURN(int64_t kv_heads, args.GetInt("kv-heads", heads, 1, 4096));
  ASSIGN_OR_RETURN(int64_t head_dim, args.GetInt("head-dim", 128, 1, 512));
  ASSIGN_OR_RETURN(int64_t batch, args.GetInt("batch", 1, 1, 65536));
  ASSIGN_OR_RETURN(std::string dtype, args.GetString("dtype", "bf16"));
  if (dtype == "bf16")
    a.shape.dtype = DType::kBF16;
  else if (dtype == "f16")
    a.shape.dtype = DType::kF16;
  else if (dtype == "f32")
    a.shape.dtype = DType::kF32;
  else
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype: unknown '", dtype, "' (bf16, f16 or f32)"));
  ASSIGN_OR_RETURN(bool causal, args.GetBool("causal", true));
  ASSIGN_OR_RETURN(bool full, args.GetBool("full", false));
  if (args.Has("causal") && causal && full) {
    return absl::InvalidArgumentError("--causal and --full exclude each other");
  }
  a.request.causal = !full;
  ASSIGN_OR_RETURN(a.request.mask_spec, cli::ParseMaskFlags(args, a.request.seq_len, !full));
  ASSIGN_OR_RETURN(std::string speeds, args.GetString("speeds", ""));
  if (args.Has("speeds")) {
    for (absl::string_view part : absl::StrSplit(speeds, ',')) {
      double x;
      if (!absl::SimpleAtod(part, &x) || !(x > 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--speeds: '", std::string(part), "' is not a positive number"));
      }
      a.request.speeds.push_back(x);
    }
  }
  ASSIGN_OR_RETURN(a.profile, args.GetString("profile", "cpu"));
  if (a.profile != "cpu" && a.profile != "gpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("--profile: unknown '", a.profile, "' (cpu or gpu)"));
  }
  ASSIGN_OR_RETURN(a.json, args.GetBool("json", false));
  ASSIGN_OR_RETURN(a.step_tokens,
                   args.GetInt("step-tokens", kDefaultStepTokens, 1, int64_t{1} << 40));
  ASSIGN_OR_RETURN(bool steps, args.GetBool("steps", false));
  ASSIGN_OR_RETURN(bool no_steps, args.GetBool("no-steps", false));
  if (steps && no_steps)
    return absl::InvalidArgumentError("--steps and --no-steps exclude each other");
  a.steps = steps ? 1 : no_steps ? 0 : -1;
  // Explicit cost flags override the profile's figures (negative: not given).
  constexpr double kMax = 1e12;
  ASSIGN_OR_RETURN(double tflops, args.GetDouble("tflops", -1, 0, kMax));
  if (args.Has("tflops") && !(tflops > 0))
    return absl::InvalidArgumentError("--tflops must be > 0");
  ASSIGN_OR_RETURN(double gbps, args.GetDouble("bandwidth-gbps", -1, 0, kMax));
  ASSIGN_OR_RETURN(double latency_us, args.GetDouble("latency-us", -1, 0, kMax));
  ASSIGN_OR_RETURN(double overhead_us, args.GetDouble("op-overhead-us", -1, 0, kMax));
  ASSIGN_OR_RETURN(double memory_gbps, args.GetDouble("memory-gbps", -1, 0, kMax));
  RETURN_IF_ERROR(args.CheckNoUnknown());
  if (heads % kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--heads (", heads, ") must be a multiple of --kv-heads (", kv_heads, ")"));
  }
  a.shape.batch = static_cast<int>(batch);
  a.shape.q_heads = static_cast<int>(heads);
  a.shape.kv_heads = static_cast<int>(kv_heads);
  a.shape.head_dim = static_cast<int>(head_dim);
  a.request.profile = a.profile;
  // The gpu profile's search costs the given shape; the cpu one keeps its reference shape,
  // except for "heads" and "auto", whose head split needs the real head counts.
  if (a.profile == "gpu" || a.request.schedule == "heads" || a.request.schedule == "auto") {
    a.request.shape = a.shape;
  }
  // "balanced" (cpu) may split the real kv heads into head groups when no sequence plan is
  // within 2% (PlanRequest::session_shape); the plan is checked and costed at a.shape below.
  a.request.session_shape = a.shape;
  RETURN_IF_ERROR(ValidatePlanRequest(a.request));
  ASSIGN_OR_RETURN(a.cost, CostParamsForProfile(a.profile, a.shape, a.request.speeds));
  if (tflops >= 0) a.cost.flops_per_second = tflops * 1e12;
  if (gbps >= 0) a.cost.bandwidth_bytes_per_second = gbps * 1e9;
  if (latency_us >= 0) a.cost.latency_seconds = latency_us * 1e-6;
  if (overhead_us >= 0) a.cost.op_overhead_seconds = overhead_us * 1e-6;
  if (memory_gbps >= 0) a.cost.memory_bandwidth_bytes_per_second = memory_gbps * 1e9;
  return a;
}

// Session memory per worker (core/planner/worker_memory.h; docs/memory.md), of the plan as the
// coordinator runs it (adjacent transfers coalesced): what admission charges.
absl::StatusOr<std::vector<WorkerMemory>> SessionMemory(const dfa::Plan& plan, const Parsed& a) {
  const dfa::Plan run = CoalesceTransfers(plan, a.shape);
  CheckOptions check_options;
  check_options.shape = a.shape;
  absl::StatusOr<CheckReport> check = CheckPlan(run, check_options);
  if (!check.ok()) {
    return absl::InternalError(absl::StrCat("the coalesced ", plan.schedule,
                                            " plan fails its check: ", check.status().message()));
  }
  std::vector<WorkerMemory> out;
  for (int w = 0; w < run.num_workers(); ++w) {
    ASSIGN_OR_RETURN(WorkerMemory m, PlanWorkerMemory(run, w, LocalShape(a.shape, run.workers[w]),
                                                      *check, a.step_tokens));
    out.push_back(m);
  }
  return out;
}

// "peak_bytes_per_worker" (the largest worker's) and "memory": per worker its peak, storage,
// work region, key chunk and pass buffers.
std::string MemoryJson(const std::vector<WorkerMemory>& memory, const Parsed& a) {
  int64_t most = 0;
  std::string workers;
  for (size_t w = 0; w < memory.size(); ++w) {
    const WorkerMemory& m = memory[w];
    most = std::max(most, m.peak());
    absl::StrAppend(&workers, w ? "," : "", "{\"worker\":", w, ",\"peak_bytes\":", m.peak(),
                    ",\"storage_bytes\":", m.storage.total, ",\"work_region_bytes\":",
                    m.storage.work, ",\"key_chunk_bytes\":", m.key_chunk,
                    ",\"forward_buffer_bytes\":", m.forward_buffers,
                    ",\"backward_buffer_bytes\":", m.backward_buffers,
                    ",\"chunked_backward\":", m.layout.kv_accumulators ? "false" : "true",
                    ",\"forward_accumulator\":", m.layout.forward_accumulator ? "true" : "false",
                    "}");
  }
  return absl::StrCat("\"peak_bytes_per_worker\":", most, ",\"step_tokens\":", a.step_tokens,
                      ",\"memory\":[", workers, "]");
}

std::string MemoryText(const std::vector<WorkerMemory>& memory, const Parsed& a) {
  std::string out = absl::StrCat("session memory per worker (step_tokens ", a.step_tokens,
                                 "; docs/memory.md):\n  worker     peak_MiB  storage_MiB"
                                 "   chunk_MiB  fwd_buf_MiB  bwd_buf_MiB\n");
  int64_t most = 0;
  for (size_t w = 0; w < memory.size(); ++w) {
    const WorkerMemory& m = memory[w];
    most = std::max(most, m.peak());
    absl::StrAppend(&out, absl::StrFormat("  %6d %12.1f %12.1f %11.1f %12.1f %12.1f\n",
                                          static_cast<int>(w), m.peak() / 1048576.0,
                                          m.storage.total / 1048576.0, m.key_chunk / 1048576.0,
                                          m.forward_buffers / 1048576.0,
                                          m.backward_buffers / 1048576.0));
  }
  absl::StrAppend(&out, "peak_bytes_per_worker ", most, "\n");
  return out;
}

// Makes, checks, costs and prints the plan. A plan that cannot be made for these flags is
// INVALID_ARGUMENT (exit 2); one that fails its check is INTERNAL (exit 1: a planner bug).
absl::Status MakeAndPrint(Args& args) {
  ASSIGN_OR_RETURN(Parsed a, Parse(args));
  absl::StatusOr<dfa::Plan> plan = MakePlan(a.request);
  if (!plan.ok()) return absl::InvalidArgumentError(plan.status().message());
  CheckOptions check_options;
  check_options.shape = a.shape;
  absl::StatusOr<CheckReport> check = CheckPlan(*plan, check_options);
  if (!check.ok()) {
    return absl::InternalError(
        absl::StrCat("the ", plan->schedule, " plan fails its check: ", check.status().message()));
  }
  absl::StatusOr<PlanCost> cost = EstimateCost(*plan, a.cost);
  if (!cost.ok()) return absl::InvalidArgumentError(cost.status().message());
  ASSIGN_OR_RETURN(const std::vector<WorkerMemory> memory, SessionMemory(*plan, a));
  if (a.json) {
    std::string doc = FormatJson(*plan, *cost, *check, a.steps == 1, a.profile);
    // The memory keys close the document (its own keys keep their order).
    if (const size_t end = doc.rfind('}'); end != std::string::npos) {
      doc.insert(end, "," + MemoryJson(memory, a));
    }
    std::printf("%s\n", doc.c_str());
    return absl::OkStatus();
  }
  if (a.steps == 1 || (a.steps == -1 && plan->num_workers() <= 8)) {
    std::printf("forward steps:\n%s", FormatSteps(*plan, false).c_str());
    if (a.steps == 1) std::printf("backward steps:\n%s", FormatSteps(*plan, true).c_str());
  }
  std::printf("profile: %s\n%s", a.profile.c_str(), FormatCost(*plan, *cost, *check).c_str());
  std::printf("%s", MemoryText(memory, a).c_str());
  return absl::OkStatus();
}

}  // namespace

int RunPlanCommand(int argc, char** argv, const std::string& name, const std::string& program) {
  return cli::RunCommand(PlanInfo(name, program), argc, argv, 1, MakeAndPrint);
}

int RunPlanCommand(int argc, char** argv) { return RunPlanCommand(argc, argv, "dfa plan", "dfa"); }

}  // namespace dfa
