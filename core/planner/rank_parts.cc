#include "core/planner/rank_parts.h"

#include <algorithm>
#include <utility>

#include "core/planner/plan_builder.h"

namespace dfa::planner_internal {

PlanRequest PartRequest(const PlanRequest& r, int workers, int kv_heads,
                        std::vector<double> speeds) {
  PlanRequest sub = r;
  sub.schedule = "balanced";
  sub.session_shape = PlanRequest{}.session_shape;
  sub.workers = workers;
  sub.speeds = std::move(speeds);
  const int q_per_kv = r.shape.q_heads / r.shape.kv_heads;
  sub.shape.kv_heads = kv_heads;
  sub.shape.q_heads = kv_heads * q_per_kv;
  return sub;
}

Plan PlanOfRankParts(const PlanRequest& r, std::vector<RankPart> parts) {
  const int P = r.workers;
  // Ranks: per worker its parts' ranks in part order.
  Plan plan;
  plan.schedule = "balanced";
  plan.seq_len = r.seq_len;
  plan.causal = r.causal;
  plan.mask_spec = r.mask_spec;
  std::vector<std::vector<std::pair<int, int>>> on(P);  // per worker: (part, member index)
  std::vector<std::vector<int>> rank(parts.size());     // per part and member
  for (size_t i = 0; i < parts.size(); ++i) {
    for (size_t k = 0; k < parts[i].members.size(); ++k) {
      on[parts[i].members[k]].emplace_back(static_cast<int>(i), static_cast<int>(k));
    }
    rank[i].assign(parts[i].members.size(), -1);
  }
  for (int w = 0; w < P; ++w) {
    for (auto [i, k] : on[w]) {
      rank[i][k] = static_cast<int>(plan.rank_workers.size());
      plan.rank_workers.push_back(w);
    }
  }
  plan.workers.resize(plan.rank_workers.size());
  // Every rank's pass has the longest part's step count T; a part's step i of n goes to
  // at[pass][part][i] = i (T - 1) / (n - 1) (order and gaps kept).
  size_t T[2] = {1, 1};
  std::vector<std::vector<size_t>> at[2];
  for (RankPart& part : parts) {  // (a part's ranks padded to its own longest pass first)
    size_t n[2] = {0, 0};
    for (const WorkerPlan& w : part.plan.workers) {
      n[0] = std::max(n[0], w.forward.size());
      n[1] = std::max(n[1], w.backward.size());
    }
    for (WorkerPlan& w : part.plan.workers) {
      w.forward.resize(n[0]);
      w.backward.resize(n[1]);
    }
    for (int pass = 0; pass < 2; ++pass) {
      T[pass] = std::max(T[pass], n[pass]);
      at[pass].emplace_back(n[pass], 0);
    }
  }
  for (int pass = 0; pass < 2; ++pass) {
    for (std::vector<size_t>& a : at[pass]) {
      const size_t n = a.size();
      for (size_t i = 0; i < n; ++i) a[i] = n > 1 ? i * (T[pass] - 1) / (n - 1) : 0;
    }
  }
  const UnitPairs visible(RequestMask(r), r.seq_len);
  // A part's pass on `steps` plan steps, its step i at at[i] with its transfers (non-partials
  // posted where they were: at the start of their post step's new place) and its computes cut
  // by query rows over at[i] .. at[i + 1] - 1 in pieces of about equal visible work (what they
  // read arrived by at[i]; what they produce is sent at at[i + 1] or later), so every plan step
  // of the rank has compute.
  auto spread = [&](const std::vector<PlanStep>& pass, size_t steps,
                    const std::vector<size_t>& at) {
    const size_t n = pass.size();
    std::vector<PlanStep> out(steps);
    for (size_t i = 0; i < n; ++i) {
      const size_t t = at[i], next = i + 1 < n ? at[i + 1] : steps;
      out[t].sends = pass[i].sends;
      out[t].recvs = pass[i].recvs;
      // A non-partial posted at the start of the part's step i - 1 - lead is posted at the
      // start of that step's new place: it keeps the compute it travelled behind (a lead of 0
      // would leave it one new step, a fraction of the part's step).
      for (auto* list : {&out[t].sends, &out[t].recvs}) {
        for (Transfer& x : *list) {
          if (IsPartial(x.tensor)) continue;
          const int post = static_cast<int>(i) - 1 - x.lead;
          const int new_post = post < 0 ? -1 : static_cast<int>(at[post]);
          x.lead = static_cast<int>(t) - 1 - new_post;
        }
      }
      // The step's computes cut by query rows into pieces of about equal visible work.
      const int64_t k = static_cast<int64_t>(next - t);
      for (const ComputeOp& c : pass[i].computes) {
        const double work = visible(c.q_rows, c.kv_rows);
        int64_t from = c.q_rows.begin;
        for (int64_t j = 0; j < k && from < c.q_rows.end; ++j) {
          const int64_t to =
              j + 1 == k ? c.q_rows.end
                         : CutRowNear(RowRange{from, c.q_rows.end}, c.kv_rows, visible,
                                      work / k * (j + 1) -
                                          visible(RowRange{c.q_rows.begin, from}, c.kv_rows));
          const RowRange q{from, to};
          if (q.size() <= 0) continue;
          from = to;
          const RowRange kv = visible.KeysSeen(q, c.kv_rows);
          if (kv.size() <= 0) continue;
          // (KeysSeen narrows a dense op only where no key is visible: the pairs are the same.)
          out[t + j].computes.push_back(ComputeOp{q, visible.dense() ? c.kv_rows : kv});
        }
      }
    }
    return out;
  };
  // Query pieces [b_j, b_{j+1}) of visible work against all keys in proportion to weight[j].
  auto pieces = [&](const std::vector<double>& weight) {
    const size_t n = weight.size();
    double sum = 0;
    for (double x : weight) sum += x;
    std::vector<int64_t> b{0};
    const RowRange all{0, r.seq_len};
    const double total = visible(all, all);
    double cum = 0;
    for (size_t j = 1; j < n; ++j) {
      cum += weight[j - 1];
      int64_t lo = b.back(), hi = r.seq_len;
      const double want = total * cum / sum;
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (visible(RowRange{0, mid}, all) < want)
          lo = mid + 1;
        else
          hi = mid;
      }
      b.push_back(lo);
    }
    b.push_back(r.seq_len);
    return b;
  };
  for (size_t i = 0; i < parts.size(); ++i) {
    RankPart& part = parts[i];
    for (size_t k = 0; k < part.members.size(); ++k) {
      WorkerPlan wp;
      if (part.plan.workers.empty()) {  // one worker, all rows of its heads
        wp.owned = {RowRange{0, r.seq_len}};
        for (int pass = 0; pass < 2; ++pass) {
          std::vector<PlanStep>& steps = pass == 0 ? wp.forward : wp.backward;
          steps.resize(T[pass]);
          // Twice the share in the forward's first step (the first K/V pieces' latency) and in
          // the backward's last (the last partials').
          std::vector<double> weight(T[pass], 1.0);
          if (T[pass] > 1) weight[pass == 0 ? 0 : T[pass] - 1] = 2.0;
          const std::vector<int64_t> b = pieces(weight);
          for (size_t j = 0; j < T[pass]; ++j) {
            const RowRange q{b[j], b[j + 1]};
            if (q.size() <= 0) continue;
            const RowRange kv = visible.KeysSeen(q, RowRange{0, r.seq_len});
            if (kv.size() <= 0) continue;
            steps[j].computes.push_back(ComputeOp{q, kv});
          }
        }
      } else {
        wp = part.plan.workers[k];
        for (auto* pass : {&wp.forward, &wp.backward}) {
          for (PlanStep& s : *pass) {
            for (auto* list : {&s.sends, &s.recvs}) {
              for (Transfer& x : *list) x.peer = rank[i][x.peer];
            }
          }
        }
        wp.forward = spread(wp.forward, T[0], at[0][i]);
        wp.backward = spread(wp.backward, T[1], at[1][i]);
      }
      wp.kv_heads = HeadRange{part.head, part.head + part.heads};
      plan.workers[rank[i][k]] = std::move(wp);
    }
  }
  return plan;
}

}  // namespace dfa::planner_internal
