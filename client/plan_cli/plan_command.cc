#include "client/plan_cli/plan_command.h"

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/planner/cost_model.h"
#include "core/planner/plan_checker.h"
#include "core/planner/plan_format.h"
#include "core/planner/planner.h"

namespace dfa {
namespace {

constexpr char kUsage[] =
    "usage: dfa plan --workers P --seq S [--heads H --kv-heads HK --head-dim D --batch B\n"
    "                [--dtype bf16|f16|f32]] [--causal|--full] [--speeds a,b,...]\n"
    "                --schedule ring|distflash|zigzag|balanced|heads|auto [--json]\n"
    "                [--steps|--no-steps]\n"
    "                [--tflops F] [--bandwidth-gbps G (0: free)] [--latency-us L]\n"
    "                [--op-overhead-us U (per compute op; default 0)]\n"
    "                [--memory-gbps M (per-op fp32 merge traffic; default 0: ignored)]\n"
    "                [--profile cpu|gpu (cost figures and balanced search; default cpu)]\n";

struct Args {
  PlanRequest request;
  AttentionShape shape;
  CostParams cost;
  std::string profile = "cpu";
  bool json = false;
  int steps = -1;  // -1: print steps when P <= 8 (text mode)
};

absl::Status ParseInt(const std::string& flag, const std::string& v, int64_t lo, int64_t* out) {
  int64_t x;
  if (!absl::SimpleAtoi(v, &x)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": not an integer: '", v, "'"));
  }
  if (x < lo) return absl::InvalidArgumentError(absl::StrCat(flag, " must be >= ", lo, ", got ", x));
  *out = x;
  return absl::OkStatus();
}

absl::Status ParseDouble(const std::string& flag, const std::string& v, double* out) {
  if (!absl::SimpleAtod(v, out) || !(*out >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": not a non-negative number: '", v, "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Args> Parse(int argc, char** argv) {
  Args a;
  a.request.schedule.clear();
  a.request.seq_len = -1;
  a.request.workers = 0;
  bool have_workers = false, have_seq = false, have_kv = false;
  int64_t heads = 32, kv_heads = 32, head_dim = 128, batch = 1;
  // Explicit cost flags override the profile's figures (negative: not given).
  double tflops = -1, gbps = -1, latency_us = -1, overhead_us = -1, memory_gbps = -1;
  const std::vector<std::string> value_flags = {
      "--workers", "--seq", "--heads", "--kv-heads", "--head-dim", "--batch", "--dtype",
      "--speeds", "--schedule", "--tflops", "--bandwidth-gbps", "--latency-us",
      "--op-overhead-us", "--memory-gbps", "--profile"};
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value;
    const size_t eq = flag.find('=');
    if (eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    const bool takes_value =
        std::find(value_flags.begin(), value_flags.end(), flag) != value_flags.end();
    if (takes_value && eq == std::string::npos) {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(flag, " needs a value"));
      value = argv[++i];
    }
    int64_t n = 0;
    if (flag == "--workers") {
      if (!absl::SimpleAtoi(value, &n)) return absl::InvalidArgumentError(absl::StrCat("--workers: not an integer: '", value, "'"));
      if (n < 1 || n > 4096) return absl::InvalidArgumentError(absl::StrCat("--workers must be in [1, 4096], got ", n));
      a.request.workers = static_cast<int>(n);
      have_workers = true;
    } else if (flag == "--seq") {
      RETURN_IF_ERROR(ParseInt(flag, value, 1, &a.request.seq_len));
      have_seq = true;
    } else if (flag == "--heads") {
      RETURN_IF_ERROR(ParseInt(flag, value, 1, &heads));
    } else if (flag == "--kv-heads") {
      RETURN_IF_ERROR(ParseInt(flag, value, 1, &kv_heads));
      have_kv = true;
    } else if (flag == "--head-dim") {
      RETURN_IF_ERROR(ParseInt(flag, value, 1, &head_dim));
    } else if (flag == "--batch") {
      RETURN_IF_ERROR(ParseInt(flag, value, 1, &batch));
    } else if (flag == "--dtype") {
      if (value == "bf16") a.shape.dtype = DType::kBF16;
      else if (value == "f16") a.shape.dtype = DType::kF16;
      else if (value == "f32") a.shape.dtype = DType::kF32;
      else return absl::InvalidArgumentError(absl::StrCat("--dtype: unknown '", value, "' (bf16, f16 or f32)"));
    } else if (flag == "--speeds") {
      for (absl::string_view part : absl::StrSplit(value, ',')) {
        double s;
        if (!absl::SimpleAtod(part, &s) || !(s > 0)) {
          return absl::InvalidArgumentError(absl::StrCat("--speeds: '", std::string(part),
                                                         "' is not a positive number"));
        }
        a.request.speeds.push_back(s);
      }
    } else if (flag == "--schedule") {
      a.request.schedule = value;
    } else if (flag == "--tflops") {
      RETURN_IF_ERROR(ParseDouble(flag, value, &tflops));
      if (!(tflops > 0)) return absl::InvalidArgumentError("--tflops must be > 0");
    } else if (flag == "--bandwidth-gbps") {
      RETURN_IF_ERROR(ParseDouble(flag, value, &gbps));
    } else if (flag == "--latency-us") {
      RETURN_IF_ERROR(ParseDouble(flag, value, &latency_us));
    } else if (flag == "--op-overhead-us") {
      RETURN_IF_ERROR(ParseDouble(flag, value, &overhead_us));
    } else if (flag == "--memory-gbps") {
      RETURN_IF_ERROR(ParseDouble(flag, value, &memory_gbps));
    } else if (flag == "--profile") {
      if (value != "cpu" && value != "gpu") {
        return absl::InvalidArgumentError(
            absl::StrCat("--profile: unknown '", value, "' (cpu or gpu)"));
      }
      a.profile = value;
    } else if (flag == "--causal") {
      a.request.causal = true;
    } else if (flag == "--full") {
      a.request.causal = false;
    } else if (flag == "--json") {
      a.json = true;
    } else if (flag == "--steps") {
      a.steps = 1;
    } else if (flag == "--no-steps") {
      a.steps = 0;
    } else if (flag == "--help" || flag == "-h") {
      return absl::CancelledError("help");
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag '", flag, "'"));
    }
  }
  if (!have_workers) return absl::InvalidArgumentError("--workers is required");
  if (!have_seq) return absl::InvalidArgumentError("--seq is required");
  if (a.request.schedule.empty()) return absl::InvalidArgumentError("--schedule is required");
  if (!have_kv) kv_heads = heads;
  if (heads % kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--heads (", heads, ") must be a multiple of --kv-heads (", kv_heads, ")"));
  }
  if (head_dim > 512 || heads > 4096 || batch > 65536) {
    return absl::InvalidArgumentError("--head-dim must be <= 512, --heads <= 4096, --batch <= 65536");
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

}  // namespace

int RunPlanCommand(int argc, char** argv) {
  absl::StatusOr<Args> args = Parse(argc, argv);
  if (!args.ok()) {
    if (absl::IsCancelled(args.status())) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    std::fprintf(stderr, "dfa plan: %s\n%s", std::string(args.status().message()).c_str(), kUsage);
    return 2;
  }
  absl::StatusOr<Plan> plan = MakePlan(args->request);
  if (!plan.ok()) {
    std::fprintf(stderr, "dfa plan: %s\n", std::string(plan.status().message()).c_str());
    return 2;
  }
  CheckOptions check_options;
  check_options.shape = args->shape;
  absl::StatusOr<CheckReport> check = CheckPlan(*plan, check_options);
  if (!check.ok()) {
    std::fprintf(stderr, "dfa plan: the %s plan fails its check: %s\n", plan->schedule.c_str(),
                 std::string(check.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<PlanCost> cost = EstimateCost(*plan, args->cost);
  if (!cost.ok()) {
    std::fprintf(stderr, "dfa plan: %s\n", std::string(cost.status().message()).c_str());
    return 2;
  }
  if (args->json) {
    std::printf("%s\n", FormatJson(*plan, *cost, *check, args->steps == 1, args->profile).c_str());
    return 0;
  }
  if (args->steps == 1 || (args->steps == -1 && plan->num_workers() <= 8)) {
    std::printf("forward steps:\n%s", FormatSteps(*plan, false).c_str());
    if (args->steps == 1) std::printf("backward steps:\n%s", FormatSteps(*plan, true).c_str());
  }
  std::printf("profile: %s\n%s", args->profile.c_str(), FormatCost(*plan, *cost, *check).c_str());
  return 0;
}

}  // namespace dfa
