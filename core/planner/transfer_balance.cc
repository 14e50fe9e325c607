// Spreads a plan's transfers over the steps where the links have room (plan_builder.h).
//
// In the executor (and the cost model) a non-partial transfer of step s travels during step
// s-1's computes and a partial of step s during step s's computes: each has one step's compute
// time (its "window") to arrive, or the receiver idles. Plans built around a shared step grid
// (the tiled plan) put several large transfers on one link in one window and none in the next.
// This pass moves each transfer, within the freedom the plan semantics leave, to the step whose
// window is least loaded on both of its links:
//   - a kQ/kKV/kGradIn send of rows the sender owns may move up to `window` steps earlier
//     (owned data is available from the start; never into step 0, whose window is empty);
//   - a partial may move up to `window` steps later (nothing writes a partial after its send,
//     and it still reaches its owner exactly once, before the end of the pass).
// Transfers of forwarded (not owned) buffers stay, and so do transfers posted early already
// (Transfer::lead > 0). The result passes CheckPlan if the input does;
// receive buffers may live a little longer (peak memory is reported by the checker).
#include <algorithm>
#include <limits>
#include <tuple>

#include "core/planner/plan_builder.h"
#include "core/planner/planner.h"

namespace dfa::planner_internal {

namespace {

struct Move {
  int from = 0, to = 0, step = 0, lo = 0, hi = 0;  // current step, allowed [lo, hi]
  Transfer send;                                   // as on the sender (peer = to)
  double seconds = 0;                              // on the wire
};

bool Owns(const WorkerPlan& w, const RowRange& rows) {
  for (const RowRange& o : w.owned) {
    if (o.Contains(rows)) return true;
  }
  return false;
}

}  // namespace

void BalanceTransfers(Plan& plan, const CostParams& params, int window, bool forward) {
  const int P = plan.num_workers();
  if (P < 2 || window < 1 || params.bandwidth_bytes_per_second <= 0) return;
  auto pass_of = [&](WorkerPlan& w) -> std::vector<PlanStep>& {
    return forward ? w.forward : w.backward;
  };
  size_t n = 0;
  for (WorkerPlan& w : plan.workers) n = std::max(n, pass_of(w).size());
  for (WorkerPlan& w : plan.workers) pass_of(w).resize(n);
  if (n < 2) return;
  std::vector<double> speeds = params.speeds;
  if (speeds.size() != static_cast<size_t>(P)) speeds.assign(P, 1.0);
  // Window t = step t's compute time (the slowest worker's; the grid makes them near equal).
  const double flops_per_pair = 4.0 * params.shape.batch * params.shape.q_heads *
                                params.shape.head_dim * (forward ? 1.0 : 2.5);
  std::vector<double> dur(n, 0);
  const UnitPairs pairs_of(plan);
  for (int w = 0; w < P; ++w) {
    const auto& pass = pass_of(plan.workers[w]);
    for (size_t t = 0; t < n; ++t) {
      double pairs = 0;
      for (const ComputeOp& c : pass[t].computes) {
        pairs += pairs_of(c.q_rows, c.kv_rows);
      }
      dur[t] = std::max(dur[t], pairs * flops_per_pair / params.flops_per_second / speeds[w]);
    }
  }
  std::vector<Move> moves;
  for (int w = 0; w < P; ++w) {
    auto& pass = pass_of(plan.workers[w]);
    for (int t = 0; t < static_cast<int>(n); ++t) {
      for (const Transfer& x : pass[t].sends) {
        Move m{w, x.peer, t, t, t, x, 0};
        m.seconds = params.latency_seconds +
                    static_cast<double>(TransferBytes(params.shape, x.tensor, x.rows.size())) /
                        params.bandwidth_bytes_per_second;
        if (IsPartial(x.tensor)) {
          if (t >= 1) m.hi = std::min<int>(static_cast<int>(n) - 1, t + window);
        } else if (t >= 2 && x.lead == 0 && Owns(plan.workers[w], x.rows)) {  // (led: early already)
          m.lo = std::max(1, t - window);
        }
        moves.push_back(m);
      }
    }
  }
  // Loads per (worker, window) of the outgoing and incoming links, in seconds.
  std::vector<std::vector<double>> out(P, std::vector<double>(n, 0)), in = out;
  auto win = [&](const Move& m, int s) { return IsPartial(m.send.tensor) ? s : s - 1; };
  auto add = [&](const Move& m, int s, double sign) {
    const int k = win(m, s);
    if (k < 0) return;
    out[m.from][k] += sign * m.seconds;
    in[m.to][k] += sign * m.seconds;
  };
  for (const Move& m : moves) add(m, m.step, 1);
  std::vector<size_t> order(moves.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return moves[a].seconds > moves[b].seconds; });
  for (int round = 0; round < 3; ++round) {
    for (size_t i : order) {
      Move& m = moves[i];
      if (m.lo == m.hi) continue;
      add(m, m.step, -1);
      // The step whose window would be least full, relative to its length; ties: nearest use.
      int best = m.step;
      double best_fill = std::numeric_limits<double>::infinity();
      const bool partial = IsPartial(m.send.tensor);
      for (int s = partial ? m.lo : m.hi; partial ? s <= m.hi : s >= m.lo; s += partial ? 1 : -1) {
        const int k = win(m, s);
        if (dur[k] <= 0) continue;
        const double fill = std::max(out[m.from][k], in[m.to][k]) / dur[k] + m.seconds / dur[k];
        if (fill < best_fill - 1e-9) {
          best_fill = fill;
          best = s;
        }
      }
      m.step = best;
      add(m, m.step, 1);
    }
  }
  for (WorkerPlan& w : plan.workers) {
    for (PlanStep& s : pass_of(w)) {
      s.sends.clear();
      s.recvs.clear();
    }
  }
  for (const Move& m : moves) {
    pass_of(plan.workers[m.from])[m.step].sends.push_back(m.send);
    Transfer r = m.send;
    r.peer = m.from;
    pass_of(plan.workers[m.to])[m.step].recvs.push_back(r);
  }
}

}  // namespace dfa::planner_internal
