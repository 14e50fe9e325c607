// dfa-plan-sweep: the balanced planner's makespan/ideal ratios over P = 1..64 and speed patterns,
// with communication in the cost model (the table in docs/planner.md).
//
//   dfa-plan-sweep [--seq S | --seq-per-worker N] [--min-workers A] [--max-workers B]
//                  [--mask causal|full|both] [--docs none|pareto [--doc-seed N]] [--window L]
//                  [--patterns equal,alt12,cycle1234,straggler,random] [--op-overhead-us U]
//                  [--target R] [--per-p] [--print-doc-lengths]
//
// Masks: --docs pareto packs documents of ParetoDocumentLengths(S, 1.2, 256, 64K, seed) (the
// planner's masked target, docs/planner.md) into every sequence; --window L gives each query the
// L keys before it (causal: and itself; full: L on either side). --seq-per-worker N sweeps
// S = N * P. --print-doc-lengths prints the document lengths of --seq as `dfa plan
// --doc-lengths` takes them, and exits. --target (default 1.02 dense, 1.03 masked) is the ratio
// above which a P is listed.
//
// Cost model: 32 heads of 128 (K/V too), bf16, batch 1, 400 TFLOP/s at speed 1, 300 GB/s per
// link and direction, 20 us per message, U us per compute op (default 0: the ratio measures the
// plan's balance; the planner's search itself charges kSearchOpOverheadSeconds). Prints, per
// (pattern, mask), the worst forward and backward ratio over the P range, where it happens, the
// P values above 1.02, and the largest number of compute ops of one worker; --per-p prints every
// P (with its head groups: "balanced" splits the kv heads where no sequence plan is within 2%).
// Every plan is checked with CheckPlan at the sweep's shape (exit 1 if one fails). Exit 2 on bad
// flags. Sizes take K, M, G (--seq 256K); -h/--help lists the flags, --version the version.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/cli/command.h"
#include "core/planner/cost_model.h"
#include "core/planner/doc_lengths.h"
#include "core/planner/plan_checker.h"
#include "core/planner/planner.h"

namespace {

// The speed patterns of the sweep (relative speeds of P workers).
bool Speeds(const std::string& pattern, int P, std::vector<double>* out) {
  out->clear();
  uint32_t x = 12345u + static_cast<uint32_t>(P);
  for (int w = 0; w < P; ++w) {
    if (pattern == "equal") {
      out->push_back(1.0);
    } else if (pattern == "alt12") {
      out->push_back(1.0 + w % 2);
    } else if (pattern == "cycle1234") {
      out->push_back(1.0 + w % 4);
    } else if (pattern == "straggler") {
      out->push_back(w == P / 2 ? 0.5 : 1.0);
    } else if (pattern == "random") {  // the LCG of planner_test's SpeedSet(2, P): [0.5, 2)
      x = x * 1664525u + 1013904223u;
      out->push_back(0.5 + 1.5 * (x >> 8) / double(1 << 24));
    } else {
      return false;
    }
  }
  return true;
}

int MaxOps(const dfa::Plan& plan, bool forward) {
  int most = 0;
  for (const dfa::WorkerPlan& w : plan.workers) {
    int n = 0;
    for (const dfa::PlanStep& s : forward ? w.forward : w.backward) {
      n += static_cast<int>(s.computes.size());
    }
    most = std::max(most, n);
  }
  return most;
}

// Head groups of a plan (distinct kv head ranges; 1: every worker holds every head).
int HeadGroupCount(const dfa::Plan& plan) {
  std::vector<std::pair<int, int>> ranges;
  for (const dfa::WorkerPlan& w : plan.workers)
    ranges.emplace_back(w.kv_heads.begin, w.kv_heads.end);
  std::sort(ranges.begin(), ranges.end());
  return static_cast<int>(std::unique(ranges.begin(), ranges.end()) - ranges.begin());
}

dfa::cli::CommandInfo SweepInfo() {
  return {"dfa-plan-sweep",
          "dfa-plan-sweep",
          "[--seq S] [--min-workers A] [--max-workers B] [flags]",
          "The balanced planner's makespan/ideal ratios over P = A..B and speed patterns, with\n"
          "communication in the cost model (32 heads of 128, bf16, 400 TFLOP/s, 300 GB/s, 20 us\n"
          "per message). Prints, per (pattern, mask), the worst forward and backward ratio, where\n"
          "it happens, the P values above 1.02 and the most compute ops of one worker. Every plan\n"
          "is checked (exit 1 if one fails); exit 2 on bad flags.",
          {{"Sweep",
            {{"seq", "S", "sequence length, e.g. 256K (default 256K)"},
             {"min-workers", "A", "smallest P (default 1)"},
             {"max-workers", "B", "largest P, at most 4096 (default 64)"},
             {"mask", "causal|full|both", "masks to sweep (default both)"},
             {"patterns", "p,q,...",
              "speed patterns: equal, alt12, cycle1234, straggler, random (default all)"},
             {"op-overhead-us", "U", "per compute op, microseconds (default 0)"},
             {"per-p", "", "print every P (with its head groups)"}}},
           {"Masks",
            {{"seq-per-worker", "N", "sweep S = N * P instead of --seq"},
             {"docs", "none|pareto", "packed documents: Pareto(1.2, 256) lengths capped at 64K"},
             {"doc-seed", "N", "seed of the document lengths (default 1)"},
             {"window", "L", "sliding window of L keys (default none)"},
             {"target", "R", "list the P above this ratio (default 1.02 dense, 1.03 masked)"},
             {"print-doc-lengths", "", "print the document lengths of --seq and exit"}}}},
          ""};
}

// The sweep itself, on parsed flags.
absl::Status Sweep(dfa::cli::Args& args) {
  ASSIGN_OR_RETURN(int64_t seq, args.GetInt("seq", 262144, 1, int64_t{1} << 40));
  ASSIGN_OR_RETURN(int64_t lo, args.GetInt("min-workers", 1, 1, 4096));
  ASSIGN_OR_RETURN(int64_t hi, args.GetInt("max-workers", 64, 1, 4096));
  ASSIGN_OR_RETURN(double overhead_us, args.GetDouble("op-overhead-us", 0, 0, 1e9));
  ASSIGN_OR_RETURN(std::string mask, args.GetString("mask", "both"));
  if (mask != "causal" && mask != "full" && mask != "both") {
    return absl::InvalidArgumentError(
        absl::StrCat("--mask: unknown '", mask, "' (causal, full or both)"));
  }
  ASSIGN_OR_RETURN(std::string pattern_list,
                   args.GetString("patterns", "equal,alt12,cycle1234,straggler,random"));
  const std::vector<std::string> patterns = absl::StrSplit(pattern_list, ',');
  ASSIGN_OR_RETURN(bool per_p, args.GetBool("per-p", false));
  ASSIGN_OR_RETURN(int64_t per_worker, args.GetInt("seq-per-worker", 0, 0, int64_t{1} << 30));
  ASSIGN_OR_RETURN(std::string docs, args.GetString("docs", "none"));
  if (docs != "none" && docs != "pareto") {
    return absl::InvalidArgumentError(
        absl::StrCat("--docs: unknown '", docs, "' (none or pareto)"));
  }
  ASSIGN_OR_RETURN(int64_t doc_seed, args.GetInt("doc-seed", 1, 0, int64_t{1} << 40));
  ASSIGN_OR_RETURN(int64_t window, args.GetInt("window", -1, 0, int64_t{1} << 40));
  ASSIGN_OR_RETURN(bool print_docs, args.GetBool("print-doc-lengths", false));
  const bool masked = docs != "none" || window >= 0;
  ASSIGN_OR_RETURN(double target, args.GetDouble("target", masked ? 1.03 : 1.02, 1, 100));
  RETURN_IF_ERROR(args.CheckNoUnknown());
  auto lengths_of = [&](int64_t s) {
    return dfa::ParetoDocumentLengths(s, 1.2, 256, 65536, static_cast<uint64_t>(doc_seed));
  };
  if (print_docs) {
    std::printf("%s\n", absl::StrJoin(lengths_of(seq), ",").c_str());
    return absl::OkStatus();
  }
  std::vector<double> probe;
  for (const std::string& p : patterns) {
    if (!Speeds(p, 1, &probe)) {
      return absl::InvalidArgumentError(absl::StrCat("--patterns: unknown '", p, "'"));
    }
  }
  std::printf(
      "seq %s, P %lld..%lld, 32x128 heads bf16, 400 TFLOP/s, 300 GB/s, 20 us, "
      "%.1f us/op%s%s\n",
      per_worker > 0 ? absl::StrCat(per_worker, " * P").c_str() : absl::StrCat(seq).c_str(),
      static_cast<long long>(lo), static_cast<long long>(hi), overhead_us,
      docs == "pareto" ? absl::StrCat(", Pareto documents (seed ", doc_seed, ")").c_str() : "",
      window >= 0 ? absl::StrCat(", window ", window).c_str() : "");
  std::printf("%-10s %-6s %-18s %-18s %-8s %-7s %s\n", "speeds", "mask", "worst fwd (P)",
              "worst bwd (P)", "ops/wkr", "secs",
              absl::StrFormat("P over %.2f (fwd/bwd)", target).c_str());
  int failures = 0;
  for (const std::string& pattern : patterns) {
    for (bool causal : {true, false}) {
      if ((mask == "causal" && !causal) || (mask == "full" && causal)) continue;
      double worst_f = 0, worst_b = 0;
      int at_f = 0, at_b = 0, ops = 0;
      std::vector<std::string> over;
      const auto t0 = std::chrono::steady_clock::now();
      for (int P = static_cast<int>(lo); P <= hi; ++P) {
        const int64_t S = per_worker > 0 ? per_worker * P : seq;
        if (S < P) break;
        dfa::CostParams cost;
        cost.shape = dfa::AttentionShape{1, 32, 32, 128, dfa::DType::kBF16};
        cost.op_overhead_seconds = overhead_us * 1e-6;
        Speeds(pattern, P, &cost.speeds);
        dfa::PlanRequest request{"balanced", P, S, causal, cost.speeds};
        request.session_shape = cost.shape;  // head groups where no sequence plan is within 2%
        request.mask_spec.causal = causal;
        if (docs == "pareto") request.mask_spec.doc_offsets = {dfa::DocOffsetsOf(lengths_of(S))};
        if (window >= 0) {
          request.mask_spec.window_left = window;
          request.mask_spec.window_right = causal ? 0 : window;
        }
        absl::StatusOr<dfa::Plan> plan = dfa::MakePlan(request);
        if (!plan.ok()) return absl::InvalidArgumentError(plan.status().message());
        dfa::CheckOptions check;
        check.shape = cost.shape;
        if (absl::Status s = dfa::CheckPlan(*plan, check).status(); !s.ok()) {
          std::fprintf(stderr, "P=%d %s %s: CheckPlan: %s\n", P, pattern.c_str(),
                       causal ? "causal" : "full", std::string(s.message()).c_str());
          ++failures;
          continue;
        }
        absl::StatusOr<dfa::PlanCost> c = dfa::EstimateCost(*plan, cost);
        if (!c.ok()) return absl::InvalidArgumentError(c.status().message());
        const double f = c->forward.makespan_ratio, b = c->backward.makespan_ratio;
        int n = std::max(MaxOps(*plan, true), MaxOps(*plan, false));
        if (!plan->rank_workers.empty()) {  // per worker: its ranks' ops (plan.h "Virtual ranks")
          n = 0;
          for (const dfa::PassCost* pass : {&c->forward, &c->backward}) {
            for (const dfa::WorkerCost& w : pass->workers) n = std::max(n, w.compute_ops);
          }
        }
        if (per_p) {
          int64_t recv = 0;
          for (const dfa::WorkerCost& w : c->forward.workers) {
            recv = std::max(recv, w.bytes_received);
          }
          std::printf(
              "  %-10s %-6s P=%-3d S=%-7lld fwd %.4f bwd %.4f ops/worker %d steps %d/%d groups %d "
              "max recv fwd %.1f MiB%s\n",
              pattern.c_str(), causal ? "causal" : "full", P, static_cast<long long>(S), f, b, n,
              c->forward.steps, c->backward.steps, HeadGroupCount(*plan), recv / 1048576.0,
              plan->rank_workers.empty()
                  ? ""
                  : absl::StrCat(" ranks ", plan->num_workers(), " (shared heads)").c_str());
          std::fflush(stdout);
        }
        if (f > worst_f) worst_f = f, at_f = P;
        if (b > worst_b) worst_b = b, at_b = P;
        ops = std::max(ops, n);
        if (f > target || b > target) over.push_back(absl::StrFormat("%d (%.3f/%.3f)", P, f, b));
      }
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("%-10s %-6s %.4f (%-3d)       %.4f (%-3d)       %-8d %-7.1f %s\n",
                  pattern.c_str(), causal ? "causal" : "full", worst_f, at_f, worst_b, at_b, ops,
                  secs, over.empty() ? "none" : absl::StrJoin(over, ", ").c_str());
      std::fflush(stdout);
    }
  }
  if (failures > 0) return absl::InternalError(absl::StrCat(failures, " plan(s) failed CheckPlan"));
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) { return dfa::cli::RunCommand(SweepInfo(), argc, argv, 1, Sweep); }
