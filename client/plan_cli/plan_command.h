// `dfa plan` and `dfa-plan`: makes a plan, checks it (CheckPlan) and prints its steps and
// cost-model figures. Flags through client/cli/args.h (sizes take K, M, G: --seq 256K; unknown
// flags named with the closest known one); -h/--help lists them, --version prints the version.
//
//   dfa plan --workers P --seq S [--heads H --kv-heads HK --head-dim D --batch B --dtype bf16]
//            [--causal|--full] [--speeds a,b,...]
//            --schedule ring|distflash|zigzag|balanced|heads|auto
//            [--json] [--steps|--no-steps] [--tflops F --bandwidth-gbps G --latency-us L]
//            [--op-overhead-us U] [--memory-gbps M] [--profile cpu|gpu]
//
// --profile (default cpu) picks the cost figures (CpuCostParams / GpuCostParams, cost_model.h)
// and the balanced search's profile (PlanRequest::profile); explicit cost flags override single
// figures. The JSON output starts with "profile". "heads" and "auto" split the given
// --kv-heads (planner.h); their plans print each worker's kv head range (text: "kv_heads [b,e)"
// after its owned rows and a kv_heads column; JSON: "kv_heads":[b,e] per worker).
//
// argv[0] is the subcommand name ("plan"); the rest are its flags (--name value or
// --name=value). Output goes to stdout, errors to stderr. Returns 0 on success, 2 for bad input
// (with a message naming the flag), 1 if a made plan fails its check (a planner bug).
// Thread-compatible (no global state).
#pragma once

#include <string>

namespace dfa {

// As `dfa plan` (help titled "dfa plan", --version "dfa ...").
int RunPlanCommand(int argc, char** argv);
// `name` titles the help and the errors ("dfa-plan"); `program` is what --version names.
int RunPlanCommand(int argc, char** argv, const std::string& name, const std::string& program);

}  // namespace dfa
