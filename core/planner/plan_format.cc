#include "core/planner/plan_format.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace dfa {
namespace {

std::string R(const RowRange& r) { return absl::StrCat("[", r.begin, ",", r.end, ")"); }

std::string TransferText(const Transfer& x, bool send) {
  return absl::StrCat(send ? "send " : "recv ", PlanTensorName(x.tensor), R(x.rows),
                      send ? " ->" : " <-", x.peer);
}

bool HasHeadRanges(const Plan& plan) {
  for (const WorkerPlan& w : plan.workers) {
    if (!w.kv_heads.empty()) return true;
  }
  return false;
}

// Text and JSON of a worker's kv head range (plans with head ranges only).
std::string HeadsText(const WorkerPlan& w) {
  return absl::StrCat(" kv_heads [", w.kv_heads.begin, ",", w.kv_heads.end, ")");
}
std::string HeadsJson(const WorkerPlan& w) {
  return absl::StrCat(",\"kv_heads\":[", w.kv_heads.begin, ",", w.kv_heads.end, "]");
}

// The kv head ranges of the ranks worker `w` runs (plan.h "Virtual ranks"), as text
// ("[0,5) [30,32)") and as JSON ("kv_heads_of_ranks":[[0,5],[30,32]]).
std::vector<const WorkerPlan*> RanksOf(const Plan& plan, size_t w) {
  std::vector<const WorkerPlan*> out;
  for (int r = 0; r < plan.num_workers(); ++r) {
    if (plan.WorkerOfRank(r) == static_cast<int>(w)) out.push_back(&plan.workers[r]);
  }
  return out;
}
std::string WorkerHeadsText(const Plan& plan, size_t w) {
  std::vector<std::string> parts;
  for (const WorkerPlan* r : RanksOf(plan, w)) {
    parts.push_back(absl::StrCat("[", r->kv_heads.begin, ",", r->kv_heads.end, ")"));
  }
  return absl::StrCat("  ", absl::StrJoin(parts, " "));
}
std::string WorkerHeadsJson(const Plan& plan, size_t w) {
  if (plan.rank_workers.empty()) {
    return w < plan.workers.size() ? HeadsJson(plan.workers[w]) : std::string();
  }
  std::vector<std::string> parts;
  for (const WorkerPlan* r : RanksOf(plan, w)) {
    parts.push_back(absl::StrCat("[", r->kv_heads.begin, ",", r->kv_heads.end, "]"));
  }
  return absl::StrCat(",\"kv_heads_of_ranks\":[", absl::StrJoin(parts, ","), "]");
}

// Peak buffer bytes of worker w: CheckReport's figure of its rank, or the sum over its ranks.
int64_t WorkerPeak(const Plan& plan, const std::vector<int64_t>& peak, size_t w) {
  if (plan.rank_workers.empty()) return w < peak.size() ? peak[w] : 0;
  int64_t sum = 0;
  for (int r = 0; r < plan.num_workers() && static_cast<size_t>(r) < peak.size(); ++r) {
    if (plan.WorkerOfRank(r) == static_cast<int>(w)) sum += peak[r];
  }
  return sum;
}

std::string PassTable(const char* name, const PassCost& c, const std::vector<int64_t>& peak,
                      const Plan& plan) {
  const bool heads = HasHeadRanges(plan);
  std::string out = absl::StrFormat(
      "%s: %d steps, makespan %.4g s, ideal %.4g s, makespan/ideal %.4f (compute only %.4f)\n",
      name, c.steps, c.makespan_seconds, c.ideal_seconds, c.makespan_ratio,
      c.compute_makespan_ratio);
  absl::StrAppend(&out, absl::StrFormat("  %6s %10s %10s %8s %6s %8s %14s %14s %12s%s\n",
                                        "worker", "busy_s", "idle_s", "units", "ops", "idle%",
                                        "bytes_sent", "bytes_recv", "peak_buf",
                                        heads ? "  kv_heads" : ""));
  for (size_t w = 0; w < c.workers.size(); ++w) {
    const WorkerCost& wc = c.workers[w];
    const double total = wc.busy_seconds + wc.idle_seconds;
    const std::string head_range = heads ? WorkerHeadsText(plan, w) : std::string();
    absl::StrAppend(&out, absl::StrFormat("  %6d %10.4g %10.4g %8.3f %6d %7.2f%% %14d %14d %12d%s\n",
                                          static_cast<int>(w), wc.busy_seconds, wc.idle_seconds,
                                          wc.work_units, wc.compute_ops,
                                          total > 0 ? 100 * wc.idle_seconds / total : 0.0,
                                          wc.bytes_sent, wc.bytes_received,
                                          WorkerPeak(plan, peak, w), head_range));
  }
  return out;
}

std::string PassJson(const PassCost& c, const std::vector<int64_t>& peak, const Plan& plan) {
  const bool heads = HasHeadRanges(plan);
  std::vector<std::string> ws;
  for (size_t w = 0; w < c.workers.size(); ++w) {
    const WorkerCost& wc = c.workers[w];
    ws.push_back(absl::StrFormat(
        "{\"worker\":%d,\"busy_seconds\":%.9g,\"idle_seconds\":%.9g,\"busy_units\":%.6g,"
        "\"compute_ops\":%d,\"bytes_sent\":%d,\"bytes_received\":%d,\"peak_buffer_bytes\":%d%s}",
        static_cast<int>(w), wc.busy_seconds, wc.idle_seconds, wc.work_units, wc.compute_ops,
        wc.bytes_sent,
        wc.bytes_received, WorkerPeak(plan, peak, w),
        heads ? WorkerHeadsJson(plan, w) : std::string()));
  }
  return absl::StrFormat(
      "{\"steps\":%d,\"makespan_seconds\":%.9g,\"ideal_seconds\":%.9g,\"makespan_ratio\":%.9g,"
      "\"compute_makespan_ratio\":%.9g,\"workers\":[%s]}",
      c.steps, c.makespan_seconds, c.ideal_seconds, c.makespan_ratio, c.compute_makespan_ratio,
      absl::StrJoin(ws, ","));
}

std::string StepsJson(const std::vector<PlanStep>& pass) {
  std::vector<std::string> steps;
  auto range = [](const RowRange& r) { return absl::StrCat("[", r.begin, ",", r.end, "]"); };
  for (const PlanStep& s : pass) {
    std::vector<std::string> c, snd, rcv;
    for (const ComputeOp& op : s.computes) {
      c.push_back(absl::StrCat("{\"q\":", range(op.q_rows), ",\"kv\":", range(op.kv_rows), "}"));
    }
    for (const Transfer& x : s.sends) {
      snd.push_back(absl::StrCat("{\"peer\":", x.peer, ",\"tensor\":\"", PlanTensorName(x.tensor),
                                 "\",\"rows\":", range(x.rows), "}"));
    }
    for (const Transfer& x : s.recvs) {
      rcv.push_back(absl::StrCat("{\"peer\":", x.peer, ",\"tensor\":\"", PlanTensorName(x.tensor),
                                 "\",\"rows\":", range(x.rows), "}"));
    }
    steps.push_back(absl::StrCat("{\"computes\":[", absl::StrJoin(c, ","), "],\"sends\":[",
                                 absl::StrJoin(snd, ","), "],\"recvs\":[", absl::StrJoin(rcv, ","),
                                 "]}"));
  }
  return absl::StrCat("[", absl::StrJoin(steps, ","), "]");
}

// Documents of batch row 0 (1 without offsets) and the longest.
std::pair<size_t, int64_t> Documents(const Plan& plan) {
  const std::vector<int64_t>& off = plan.mask_spec.OffsetsOf(0);
  if (off.size() < 2) return {1, plan.seq_len};
  int64_t longest = 0;
  for (size_t i = 1; i < off.size(); ++i) longest = std::max(longest, off[i] - off[i - 1]);
  return {off.size() - 1, longest};
}

// ", causal", ", full", plus the documents and window of a masked plan.
std::string MaskText(const Plan& plan) {
  std::string out = plan.causal ? ", causal" : ", full";
  if (plan.dense()) return out;
  const auto [docs, longest] = Documents(plan);
  if (docs > 1) {
    absl::StrAppend(&out, ", ", docs, " documents (longest ", longest, ")");
    if (plan.mask_spec.doc_offsets.size() > 1) absl::StrAppend(&out, " in row 0");
  }
  const MaskSpec m = plan.Mask();
  if (m.window_left >= 0 || (!m.causal && m.window_right >= 0)) {
    absl::StrAppend(&out, ", window ", m.window_left, ",", m.causal ? 0 : m.window_right);
  }
  const double all = static_cast<double>(plan.seq_len) * static_cast<double>(plan.seq_len);
  absl::StrAppendFormat(&out, ", %.4f of all pairs visible",
                        UnitPairs(plan)({0, plan.seq_len}, {0, plan.seq_len}) / all);
  return out;
}

std::string MaskJson(const Plan& plan) {
  const auto [docs, longest] = Documents(plan);
  const MaskSpec m = plan.Mask();
  const double all = static_cast<double>(plan.seq_len) * static_cast<double>(plan.seq_len);
  return absl::StrFormat(
      ",\"documents\":%d,\"longest_document\":%d,\"window_left\":%d,\"window_right\":%d,"
      "\"visible_pair_fraction\":%.9g",
      docs, longest, m.window_left, m.window_right,
      UnitPairs(plan)({0, plan.seq_len}, {0, plan.seq_len}) / all);
}

}  // namespace

std::string FormatSteps(const Plan& plan, bool backward) {
  std::string out;
  for (int w = 0; w < plan.num_workers(); ++w) {
    const WorkerPlan& wp = plan.workers[w];
    std::vector<std::string> owned;
    for (const RowRange& r : wp.owned) owned.push_back(R(r));
    if (!plan.rank_workers.empty()) {
      absl::StrAppend(&out, "rank ", w, " on ");
    }
    absl::StrAppend(&out, "worker ", plan.WorkerOfRank(w), " owns ", absl::StrJoin(owned, " "),
                    wp.kv_heads.empty() ? std::string() : HeadsText(wp), "\n");
    const auto& pass = backward ? wp.backward : wp.forward;
    for (size_t t = 0; t < pass.size(); ++t) {
      std::vector<std::string> parts;
      for (const Transfer& x : pass[t].recvs) parts.push_back(TransferText(x, false));
      for (const ComputeOp& c : pass[t].computes) {
        parts.push_back(absl::StrCat("q", R(c.q_rows), "xkv", R(c.kv_rows)));
      }
      for (const Transfer& x : pass[t].sends) parts.push_back(TransferText(x, true));
      absl::StrAppend(&out, "  step ", t, ": ", parts.empty() ? "idle" : absl::StrJoin(parts, "; "),
                      "\n");
    }
  }
  return out;
}

std::string FormatCost(const Plan& plan, const PlanCost& cost, const CheckReport& check) {
  std::string out = absl::StrCat("schedule ", plan.schedule, ", ", plan.physical_workers(),
                                 " workers",
                                 plan.rank_workers.empty()
                                     ? std::string()
                                     : absl::StrCat(" (", plan.num_workers(), " ranks)"),
                                 ", seq_len ", plan.seq_len,
                                 MaskText(plan), "; CheckPlan: OK\n");
  absl::StrAppend(&out, PassTable("forward", cost.forward, check.peak_forward_bytes, plan));
  absl::StrAppend(&out, PassTable("backward", cost.backward, check.peak_backward_bytes, plan));
  return out;
}

std::string FormatJson(const Plan& plan, const PlanCost& cost, const CheckReport& check,
                       bool with_steps, const std::string& profile) {
  std::string out = absl::StrFormat(
      "{%s\"schedule\":\"%s\",\"workers\":%d,\"seq_len\":%d,\"causal\":%s,\"makespan_ratio\":%.9g,"
      "\"compute_makespan_ratio\":%.9g,\"backward_makespan_ratio\":%.9g,\"max_peak_buffer_bytes\":%d,"
      "\"forward\":%s,\"backward\":%s",
      profile.empty() ? std::string() : absl::StrCat("\"profile\":\"", profile, "\","),
      plan.schedule, plan.physical_workers(), plan.seq_len, plan.causal ? "true" : "false",
      cost.forward.makespan_ratio, cost.forward.compute_makespan_ratio,
      cost.backward.makespan_ratio, check.max_peak_bytes,
      PassJson(cost.forward, check.peak_forward_bytes, plan),
      PassJson(cost.backward, check.peak_backward_bytes, plan));
  absl::StrAppend(&out, MaskJson(plan));
  if (with_steps) {
    std::vector<std::string> ws;
    for (int r = 0; r < plan.num_workers(); ++r) {
      const WorkerPlan& w = plan.workers[r];
      std::vector<std::string> owned;
      for (const RowRange& r : w.owned) owned.push_back(absl::StrCat("[", r.begin, ",", r.end, "]"));
      ws.push_back(absl::StrCat("{",
                                plan.rank_workers.empty()
                                    ? std::string()
                                    : absl::StrCat("\"worker\":", plan.WorkerOfRank(r), ","),
                                "\"owned\":[", absl::StrJoin(owned, ","), "]",
                                w.kv_heads.empty() ? std::string() : HeadsJson(w), ",\"forward\":",
                                StepsJson(w.forward), ",\"backward\":", StepsJson(w.backward), "}"));
    }
    absl::StrAppend(&out, ",\"plan\":[", absl::StrJoin(ws, ","), "]");
  }
  absl::StrAppend(&out, "}");
  return out;
}

}  // namespace dfa
