#include "worker/executor/output_finality.h"

#include <algorithm>
#include <cstdint>

namespace dfa::executor_internal {
namespace {

// Last touching step per local row (-1: none), over the owned ranges.
class LastTouch {
 public:
  explicit LastTouch(const std::vector<RowRange>& owned) : owned_(owned) {
    int64_t n = 0;
    for (const RowRange& o : owned) n += o.size();
    last_.assign(static_cast<size_t>(n), -1);
  }
  // Every owned row of global range `r` was touched at step t.
  void Touch(const RowRange& r, int t) {
    int64_t base = 0;
    for (const RowRange& o : owned_) {
      const int64_t b = std::max(o.begin, r.begin), e = std::min(o.end, r.end);
      for (int64_t g = b; g < e; ++g) {
        int& l = last_[static_cast<size_t>(base + g - o.begin)];
        l = std::max(l, t);
      }
      base += o.size();
    }
  }
  // The local ranges whose last touch is each step, runs split at owned-range boundaries.
  std::vector<std::vector<RowRange>> ByStep(int steps) const {
    std::vector<std::vector<RowRange>> out(static_cast<size_t>(steps));
    int64_t base = 0;
    for (const RowRange& o : owned_) {
      int64_t i = base;
      const int64_t end = base + o.size();
      while (i < end) {
        const int t = last_[static_cast<size_t>(i)];
        int64_t j = i;
        while (j < end && last_[static_cast<size_t>(j)] == t) ++j;
        if (t >= 0) out[static_cast<size_t>(t)].push_back({i, j});
        i = j;
      }
      base = end;
    }
    return out;
  }

 private:
  const std::vector<RowRange>& owned_;
  std::vector<int> last_;
};

}  // namespace

OutputFinality FinalRowsByStep(const Plan& plan, int rank, bool forward) {
  const WorkerPlan& w = plan.workers[static_cast<size_t>(rank)];
  const std::vector<PlanStep>& steps = forward ? w.forward : w.backward;
  LastTouch q(w.owned), kv(w.owned);
  for (int t = 0; t < static_cast<int>(steps.size()); ++t) {
    const PlanStep& s = steps[static_cast<size_t>(t)];
    for (const ComputeOp& op : s.computes) {
      q.Touch(op.q_rows, t);  // only the owned part counts (received rows are no one's here)
      if (!forward) kv.Touch(op.kv_rows, t);
    }
    for (const Transfer& r : s.recvs) {
      if (r.tensor == PlanTensor::kOutPartial || r.tensor == PlanTensor::kDqPartial) {
        q.Touch(r.rows, t);
      } else if (r.tensor == PlanTensor::kDkvPartial) {
        kv.Touch(r.rows, t);
      }
    }
    if (forward) continue;
    for (const Transfer& x : s.sends) {
      if (x.tensor == PlanTensor::kGradIn) q.Touch(x.rows, t);
      if (x.tensor == PlanTensor::kKV) kv.Touch(x.rows, t);
    }
  }
  OutputFinality out;
  const int T = static_cast<int>(steps.size());
  out.queries = q.ByStep(T);
  out.keys = forward ? std::vector<std::vector<RowRange>>(static_cast<size_t>(T)) : kv.ByStep(T);
  return out;
}

RowRange GlobalRows(const std::vector<RowRange>& owned, const RowRange& local) {
  int64_t base = 0;
  for (const RowRange& o : owned) {
    if (local.begin < base + o.size()) {
      return {o.begin + local.begin - base, o.begin + local.end - base};
    }
    base += o.size();
  }
  return {};
}

}  // namespace dfa::executor_internal
