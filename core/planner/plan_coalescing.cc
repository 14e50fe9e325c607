#include "core/planner/plan_coalescing.h"

#include <algorithm>
#include <vector>

#include "core/planner/plan_checker.h"

namespace dfa {
namespace {

// Q and output partials stay apart: a Q buffer's output partial carries LSE rows that a merged
// message could not split again.
bool Mergeable(PlanTensor t) {
  return t == PlanTensor::kKV || t == PlanTensor::kGradIn || t == PlanTensor::kDqPartial ||
         t == PlanTensor::kDkvPartial;
}

// Merges adjacent transfers of the same (peer, tensor); the others keep their order.
bool MergeList(std::vector<Transfer>* list) {
  std::vector<Transfer> v = *list;
  std::stable_sort(v.begin(), v.end(), [](const Transfer& a, const Transfer& b) {
    if (a.peer != b.peer) return a.peer < b.peer;
    if (a.tensor != b.tensor) return a.tensor < b.tensor;
    if (a.lead != b.lead) return a.lead < b.lead;
    return a.rows.begin < b.rows.begin;
  });
  std::vector<Transfer> out;
  bool merged = false;
  for (const Transfer& x : v) {
    if (!out.empty() && Mergeable(x.tensor) && out.back().peer == x.peer &&
        out.back().tensor == x.tensor && out.back().lead == x.lead &&
        out.back().rows.end == x.rows.begin) {
      out.back().rows.end = x.rows.end;
      merged = true;
    } else {
      out.push_back(x);
    }
  }
  if (merged) *list = std::move(out);
  return merged;
}

}  // namespace

Plan CoalesceTransfers(const Plan& plan, const AttentionShape& shape) {
  if (shape.batch != 1) return plan;
  Plan merged = plan;
  bool any = false;
  for (WorkerPlan& w : merged.workers) {
    // Adjacent owned ranges are one range (a send may then cover both).
    std::vector<RowRange> owned;
    for (const RowRange& r : w.owned) {
      if (!owned.empty() && owned.back().end == r.begin) {
        owned.back().end = r.end;
        any = true;
      } else {
        owned.push_back(r);
      }
    }
    w.owned = std::move(owned);
    for (std::vector<PlanStep>* pass : {&w.forward, &w.backward}) {
      for (PlanStep& step : *pass) {
        any |= MergeList(&step.sends);
        any |= MergeList(&step.recvs);
      }
    }
  }
  if (!any) return plan;
  CheckOptions check;
  check.shape = shape;
  if (!CheckPlan(merged, check).ok()) return plan;
  return merged;
}

}  // namespace dfa
