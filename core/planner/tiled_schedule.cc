// The 2-D tiled plan: communication-avoiding attention for many workers of unequal speed.
//
// Why. In every 1-D plan (ring, zigzag, striped ring) each worker receives all the K/V its
// queries see, about S rows, whatever its speed: at P = 64 with fast workers that is more time on
// the link than the ideal compute time (docs/planner.md, "Theoretical bounds"). Here a worker
// receives O(S / sqrt(P)) rows instead.
//
// Pair space. As in the striped ring, front row p and back row S-1-p form pair p in [0, F),
// F = S/2; a "mirrored range" [p0, p1) is front rows [p0, p1) plus back rows mirrored. Under the
// causal mask a mirrored range of x pairs sees exactly 2·x·y keys of any disjoint mirrored range
// of y pairs (full: 4·x·y), so causal work is a uniform density on the square
// [0, F) x [0, F) of (query pair, key pair): every rectangle costs its area.
//
// Layout. Worker w owns the mirrored range O_w of x_w pairs, x_w proportional to its speed, in
// worker order. Workers form G groups of consecutive workers; group g's query block Q_g is the
// union of its members' O_w. Member i's key set is K_i = O_i plus a share of the rest of the key
// axis R_g = [0, F) \ Q_g, its share proportional to its speed (so |K_i| = F·s_i/σ_g). Worker i
// computes the tile Q_g x K_i: area |Q_g|·|K_i| = F²·s_i/Σs, proportional to its speed, and
// the tiles of a group's members partition Q_g x [0, F) (each visible pair exactly once).
// A worker receives its peers' queries (|Q_g| - x_i pairs) and the K/V of K_i \ O_i, directly
// from their owners, each K piece cut at owner boundaries and to at most `max_piece_pairs`.
// The groups' shares of R_g start at staggered offsets, so in each step the owners serve
// different receivers.
//
// Order of one worker's work (rows = query pieces: own, peers; columns = K pieces: own,
// foreign), chosen so that partial results leave progressively, never all at the end:
//  step 0           own queries x own K/V (no data needed);
//  (peers_first: the first `head_rows` peers' queries x own K/V, one peer per step;)
//  phase 1 (stream) each step receives the next foreign K piece (and, in the first `head_rows`
//                   steps, one peer's queries); computes the "head" rows (a fraction
//                   `head_fraction` of the own queries plus the first `head_rows` peers) against
//                   it: enough compute to hide the K/V stream. The head peers finish at its end.
//  phase 2 (rows)   one peer's queries per step against all K/V: a peer's partial output
//                   (backward: dQ) is sent while the next peer computes.
//  phase 3 (cols)   the rest of the own queries against one foreign K piece per step: in the
//                   backward each piece's dK/dV partial returns to its owner while the next
//                   piece is used, so only the last (small) piece's is left after the end.
#include <algorithm>
#include <cmath>

#include "core/planner/plan_builder.h"
#include "core/planner/planner.h"

namespace dfa {

using planner_internal::AddForwardCompute;
using planner_internal::AddForwardTransfer;

namespace {


struct PairRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// A piece of a worker's work axis: mirrored pair range, its owner and its row ranges.
struct Piece {
  int owner = 0;
  std::vector<RowRange> rows;
};

}  // namespace

namespace {

// Group bounds for speed_groups mode (workers already sorted by speed, fastest first): a group
// starting at a worker of speed s gets about speed_groups * sqrt(sum(s) / (1.5 s)) members,
// the size that minimises a member's received bytes (peer queries and partials grow with the
// group, its key share shrinks with it).
std::vector<int> SpeedGroupBounds(const std::vector<double>& speeds, double scale) {
  const int P = static_cast<int>(speeds.size());
  double sum = 0;
  for (double x : speeds) sum += x;
  std::vector<int> gb = {0};
  while (gb.back() < P) {
    const int a = gb.back();
    const double m = scale * std::sqrt(sum / (1.5 * speeds[a]));
    int b = std::min(P, a + std::max(1, static_cast<int>(std::llround(m))));
    if (P - b > 0 && P - b < std::max<int64_t>(1, std::llround(m / 2))) b = P;  // no runt group
    gb.push_back(b);
  }
  return gb;
}

Plan BuildTiledPlan(const PlanRequest& r, const TiledOptions& o, const std::vector<int>& gbounds);

}  // namespace

bool TiledPlanApplies(const PlanRequest& r, const TiledOptions& o) {
  return (o.speed_groups > 0 || (o.groups >= 1 && o.groups <= r.workers)) &&
         r.seq_len / 2 >= 4 * int64_t{r.workers} && o.max_piece_pairs >= 1;
}

Plan MakeTiledPlan(const PlanRequest& r, const TiledOptions& o) {
  const int P = r.workers;
  if (o.speed_groups <= 0) {
    std::vector<int> gb;
    for (int g = 0; g <= o.groups; ++g) gb.push_back(static_cast<int>(int64_t{g} * P / o.groups));
    return BuildTiledPlan(r, o, gb);
  }
  std::vector<double> speeds = r.speeds;
  if (speeds.empty()) speeds.assign(P, 1.0);
  std::vector<int> order(P);
  for (int w = 0; w < P; ++w) order[w] = w;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return speeds[a] > speeds[b]; });
  PlanRequest slots = r;
  slots.speeds.assign(P, 1.0);
  for (int k = 0; k < P; ++k) slots.speeds[k] = speeds[order[k]];
  Plan plan = BuildTiledPlan(slots, o, SpeedGroupBounds(slots.speeds, o.speed_groups));
  planner_internal::PermuteWorkers(plan, order);
  return plan;
}

namespace {

Plan BuildTiledPlan(const PlanRequest& r, const TiledOptions& o, const std::vector<int>& gbounds) {
  const int P = r.workers;
  const int64_t S = r.seq_len;
  const int64_t F = S / 2, Bk = S - F;  // pairs; back half rows (one more when S is odd)
  Plan plan;
  plan.schedule = "balanced";
  plan.seq_len = S;
  plan.causal = r.causal;
  plan.mask_spec = r.mask_spec;
  plan.workers.resize(P);
  std::vector<double> speeds = r.speeds;
  if (speeds.empty()) speeds.assign(P, 1.0);
  // Back offset of pair cut p: the middle row of odd S goes with the last pair.
  auto back = [&](int64_t p) { return p >= F ? Bk : p; };
  auto rows_of = [&](PairRange pr) {
    std::vector<RowRange> v;
    if (pr.size() <= 0) return v;
    v.push_back(RowRange{pr.begin, pr.end});
    v.push_back(RowRange{S - back(pr.end), S - back(pr.begin)});
    return v;
  };
  const std::vector<int64_t> oc = planner_internal::ProportionalCuts(F, speeds, 1);  // owned pair ranges
  for (int w = 0; w < P; ++w) plan.workers[w].owned = rows_of({oc[w], oc[w + 1]});
  auto owner_of_pair = [&](int64_t p) {
    return static_cast<int>(std::upper_bound(oc.begin(), oc.end(), p) - oc.begin()) - 1;
  };
  const int G = static_cast<int>(gbounds.size()) - 1;
  const UnitPairs pairs_of(plan);

  // The step grid, shared by all workers (every worker's work is proportional to its speed, so
  // the same fraction of it takes the same time): bounds[t] = fraction of the non-local work done
  // by the end of step t. Fine steps at the start (K/V streaming in; sizes double) and in the
  // tail (one K piece per step: its dK/dV leaves while the next is used), even steps between.
  double tail = 0;  // largest share of the work in phase 3
  for (int g = 0; g < G; ++g) {
    const int g0 = gbounds[g], g1 = gbounds[g + 1];
    double sigma = 0;
    for (int w = g0; w < g1; ++w) sigma += speeds[w];
    for (int w = g0; w < g1; ++w) {
      // Column-major mode: the tail is the own queries against the late pieces, about
      // late_pieces * max_piece_pairs of the worker's key share.
      const double share = F * speeds[w] / sigma;
      const double frac = o.late_pieces > 0
                              ? std::min(1.0, o.late_pieces * double(o.max_piece_pairs) / share)
                              : 1 - o.head_fraction;
      tail = std::max(tail, frac * speeds[w] / sigma);
    }
  }
  tail = std::min(0.5, tail * 1.05);
  std::vector<double> bounds = {0};
  {
    const int T = std::max(1, o.steps), H = std::clamp(o.head_ramp, 0, 20);
    std::vector<double> weights;
    for (int k = 0; k < T; ++k) weights.push_back(k < H ? std::ldexp(1.0, k - H) : 1.0);
    double sum = 0;
    for (double x : weights) sum += x;
    double cum = 0;
    for (double x : weights) bounds.push_back((cum += x) / sum * (1 - tail));
    const int nt = std::max(1, o.tail_steps);
    for (int k = 1; k <= nt; ++k) bounds.push_back(1 - tail + tail * k / nt);
  }

  for (int g = 0; g < G; ++g) {
    const int g0 = gbounds[g], g1 = gbounds[g + 1];
    const int m = g1 - g0;
    const PairRange qg{oc[g0], oc[g1]};
    // The rest of the key axis as a virtual line [0, L): v < qg.begin is pair v, else v + |Q_g|.
    const int64_t L = F - qg.size();
    std::vector<double> member_speeds(speeds.begin() + g0, speeds.begin() + g1);
    const std::vector<int64_t> vc = planner_internal::ProportionalCuts(L, member_speeds, 0);
    // Staggered start: group g's shares begin g/G of a share later, so that at each step the
    // members of different groups ask different owners.
    const int64_t rot = L > 0 ? static_cast<int64_t>(std::llround(double(L) / m * g / G)) % L : 0;
    for (int i = 0; i < m; ++i) {
      const int w = g0 + i;
      // Foreign K pieces, in virtual order from the share's start.
      std::vector<Piece> cols;
      int64_t v = vc[i], v_end = vc[i + 1];
      while (v < v_end) {
        const int64_t pv = (v + rot) % L;                 // virtual position
        int64_t run = std::min(v_end - v, L - pv);        // no wrap
        int64_t pair = pv < qg.begin ? pv : pv + qg.size();
        if (pv < qg.begin) run = std::min(run, qg.begin - pv);  // stop at Q_g
        const int owner = owner_of_pair(pair);
        // The first pieces are smaller (1/8, 1/4, 1/2): little data before the first computes.
        const int64_t cap = std::max<int64_t>(1, o.max_piece_pairs >> std::max<int>(0, 3 - static_cast<int>(cols.size())));
        run = std::min({run, oc[owner + 1] - pair, cap});
        cols.push_back(Piece{owner, rows_of({pair, pair + run})});
        v += run;
      }
      // Query pieces: own head part, own rest, then the peers in rotation order.
      const PairRange own{oc[w], oc[w + 1]};
      const int64_t head_pairs =
          o.late_pieces > 0 ? own.size() : std::llround(own.size() * o.head_fraction);
      // Column-major mode: the last late_pieces K pieces wait for the end (see TiledOptions).
      const int n_late = std::clamp<int>(o.late_pieces, 0, static_cast<int>(cols.size()));
      std::vector<Piece> late(cols.end() - n_late, cols.end());
      cols.resize(cols.size() - n_late);
      const Piece own_all{w, rows_of(own)};
      const Piece own_head{w, rows_of({own.begin, own.begin + head_pairs})};
      const Piece own_rest{w, rows_of({own.begin + head_pairs, own.end})};
      std::vector<Piece> peers;
      for (int k = 1; k < m; ++k) {
        const int j = g0 + (i + k) % m;
        peers.push_back(Piece{j, rows_of({oc[j], oc[j + 1]})});
      }
      const int h = std::min<int>(o.head_rows, static_cast<int>(peers.size()));
      // The work list, in order (see the top of the file); step 0 is the local part.
      std::vector<ComputeOp> ops;
      auto cell = [&](const Piece& q, const Piece& kv) {
        for (const RowRange& qr : q.rows) {
          for (const RowRange& kr : kv.rows) {
            if (pairs_of(qr, kr) > 0) ops.push_back(ComputeOp{qr, kr});
          }
        }
      };
      cell(own_all, own_all);
      const size_t local_ops = ops.size();
      const int n1 = std::max<int>(static_cast<int>(cols.size()), h);
      std::vector<const Piece*> rows_in = {&own_head};
      std::vector<const Piece*> cols_in = {&own_all};
      // peers_first: the head peers' queries come first, against the own K/V (twice the compute
      // per byte received of a K piece against the own head rows), then the K pieces stream in
      // against all head rows.
      const int pf = o.peers_first ? h : 0;
      for (int s = 0; s < pf; ++s) {
        cell(peers[s], own_all);
        rows_in.push_back(&peers[s]);
      }
      for (int s = 0; s < n1; ++s) {
        if (s < static_cast<int>(cols.size())) {
          for (const Piece* q : rows_in) cell(*q, cols[s]);
          cols_in.push_back(&cols[s]);
        }
        if (s >= pf && s < h) {
          for (const Piece* c : cols_in) cell(peers[s], *c);
          rows_in.push_back(&peers[s]);
        }
      }
      for (int k = h; k < static_cast<int>(peers.size()); ++k) {
        for (const Piece* c : cols_in) cell(peers[k], *c);
      }
      for (const Piece& c : cols) cell(own_rest, c);
      for (const Piece& p : peers) {
        for (const Piece& c : late) cell(p, c);
      }
      for (const Piece& c : late) cell(own_all, c);
      // Steps: 0 = the local ops; the rest cut into steps of equal work (query rows split).
      double local = 0, rest = 0;
      for (size_t k = 0; k < ops.size(); ++k) {
        (k < local_ops ? local : rest) += pairs_of(ops[k].q_rows, ops[k].kv_rows);
      }
      for (size_t k = 0; k < local_ops; ++k) AddForwardCompute(plan, 0, w, ops[k].q_rows, ops[k].kv_rows);
      int t = 1;
      double done = 0;
      for (size_t k = local_ops; k < ops.size(); ++k) {
        RowRange q = ops[k].q_rows;
        const RowRange kv = ops[k].kv_rows;
        while (q.size() > 0) {
          const double target = rest * bounds[t];
          int64_t cut = q.end;
          if (t + 1 < static_cast<int>(bounds.size()) && done + pairs_of(q, kv) > target + 0.5) {
            cut = planner_internal::CutRowNear(q, kv, pairs_of, target - done);
          }
          if (cut > q.begin) {
            const RowRange part{q.begin, cut};
            const double work = pairs_of(part, kv);
            if (work > 0) AddForwardCompute(plan, t, w, part, kv);  // masks: may see none
            done += work;
            q.begin = cut;
          }
          if (q.size() > 0) ++t;  // step t is full
        }
      }
      // Receives at first use; each peer query range's partial output goes home in the step
      // after its last use (a range that sees none of this worker's keys is neither received
      // nor returned).
      const auto& pass = plan.workers[w].forward;
      auto first_last = [&](const RowRange& rr, bool query) {
        int first = -1, last = -1;
        for (int u = 0; u < static_cast<int>(pass.size()); ++u) {
          for (const ComputeOp& c : pass[u].computes) {
            if (rr.Contains(query ? c.q_rows : c.kv_rows)) {
              if (first < 0) first = u;
              last = u;
            }
          }
        }
        return std::make_pair(first, last);
      };
      for (const Piece& q : peers) {
        for (const RowRange& rr : q.rows) {
          const auto [first, last] = first_last(rr, true);
          if (first < 0) continue;
          AddForwardTransfer(plan, first, q.owner, w, PlanTensor::kQ, rr);
          AddForwardTransfer(plan, last + 1, w, q.owner, PlanTensor::kOutPartial, rr);
        }
      }
      cols.insert(cols.end(), late.begin(), late.end());
      for (const Piece& c : cols) {
        for (const RowRange& rr : c.rows) {
          const int first = first_last(rr, false).first;
          if (first >= 0) AddForwardTransfer(plan, first, c.owner, w, PlanTensor::kKV, rr);
        }
      }
    }
  }
  if (o.balance_window > 0) {
    // Spread the transfers over the steps' windows (transfer_balance.cc), with the search's
    // H200-like figures.
    planner_internal::EqualizeSteps(plan);
    CostParams params;
    params.shape = AttentionShape{1, 32, 32, 128, DType::kBF16};
    params.speeds = speeds;
    planner_internal::BalanceTransfers(plan, params, o.balance_window, /*forward=*/true);
  }
  return plan;
}

}  // namespace

}  // namespace dfa
