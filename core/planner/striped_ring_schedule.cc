// The striped ring: zigzag generalised to workers of unequal speed (the core of "balanced").
//
// Layout. Row u of the front half and its mirror S-1-u of the back half form a "pair"; worker
// i owns one front range and its mirror back range, of x_i pairs with x_i proportional to its
// speed. Under the causal mask, the queries of a mirrored range of x pairs see exactly
// 2·x·y keys of any other mirrored range of y pairs, wherever the two lie (front sees front
// before it, back sees both), and 2·x² + O(x) of their own: so worker i's work is x_i·S,
// proportional to its speed, for ANY speeds, and its work against any K/V block is proportional
// to the block's size. Full attention: 4·x·y, the same proportions.
//
// Pieces. Each worker's pair range is cut into n_i equal pieces (n_i ~ x_i / piece_pairs), so all
// K/V blocks that travel are about the same size. The pieces are numbered in worker order;
// worker i owns pieces [o_i, o_i + n_i). At step t worker i computes its queries against piece
// (o_i + n_i - 1 - t) mod N (N pieces, N steps): its own pieces first (steps 0..n_i-1, no data
// needed), then its predecessor's, and so on around the ring. From step n_i on it receives that
// piece from its predecessor i-1, which computed with it n_i steps earlier (owned or received)
// and forwards it: each K/V piece reaches each worker exactly once, one piece per link per step,
// and the transfer of step t+1 overlaps the compute of step t. Each step of each worker costs
// 2·x_i·y/s_i: the same for all workers when pieces are equal, so no one waits.
// The backward pass derives from it: a dK/dV partial goes back to the piece's owner in the step
// after its use, overlapping that step's compute (partials are merged one step later). Or, with
// kv_stationary_backward, the backward is the same ring over query pieces (see below): fewer
// bytes (no fp32 dK/dV on the wire), so it stays within the links at large P.
#include <algorithm>
#include <cmath>

#include "core/planner/plan_builder.h"
#include "core/planner/planner.h"

namespace dfa {

using planner_internal::AddForwardCompute;
using planner_internal::AddForwardTransfer;


Plan MakeStripedRingPlan(const PlanRequest& r, const std::vector<int>& pieces) {
  return MakeStripedRingPlan(r, pieces, /*kv_stationary_backward=*/false);
}

Plan MakeStripedRingPlan(const PlanRequest& r, const std::vector<int>& pieces,
                         bool kv_stationary_backward, int lead) {
  const int P = r.workers;
  const int64_t S = r.seq_len;
  Plan plan;
  plan.schedule = "balanced";
  plan.seq_len = S;
  plan.causal = r.causal;
  plan.mask_spec = r.mask_spec;
  plan.workers.resize(P);
  std::vector<double> speeds = r.speeds;
  if (speeds.empty()) speeds.assign(P, 1.0);
  // Front half [0, F) in pair order; back half [F, S) in reverse pair order (one row more when
  // S is odd: the middle row belongs to the back range of the last worker).
  const int64_t F = S / 2, B = S - F;
  const std::vector<int64_t> fc = planner_internal::ProportionalCuts(F, speeds, 0);
  const std::vector<int64_t> bc = planner_internal::ProportionalCuts(B, speeds, 0);
  // A piece: a front range and its mirror back range (either may be empty for tiny S).
  struct Piece {
    int owner;
    RowRange front, back;
  };
  std::vector<Piece> all;
  std::vector<int> first(P);
  for (int i = 0; i < P; ++i) {
    first[i] = static_cast<int>(all.size());
    const int n = std::max(1, pieces[i]);
    for (int k = 0; k < n; ++k) {
      const int64_t f0 = fc[i] + (fc[i + 1] - fc[i]) * k / n;
      const int64_t f1 = fc[i] + (fc[i + 1] - fc[i]) * (k + 1) / n;
      const int64_t b0 = bc[i] + (bc[i + 1] - bc[i]) * k / n;
      const int64_t b1 = bc[i] + (bc[i + 1] - bc[i]) * (k + 1) / n;
      all.push_back(Piece{i, RowRange{f0, f1}, RowRange{S - b1, S - b0}});
    }
    std::vector<RowRange>& owned = plan.workers[i].owned;
    if (fc[i + 1] > fc[i]) owned.push_back(RowRange{fc[i], fc[i + 1]});
    if (bc[i + 1] > bc[i]) owned.push_back(RowRange{S - bc[i + 1], S - bc[i]});
  }
  const int N = static_cast<int>(all.size());
  const UnitPairs unit_pairs(plan);
  auto ranges = [](const Piece& p) {
    std::vector<RowRange> v;
    if (p.front.size() > 0) v.push_back(p.front);
    if (p.back.size() > 0) v.push_back(p.back);
    return v;
  };
  for (int i = 0; i < P; ++i) {
    const int n = std::max(1, pieces[i]);
    const int pred = (i + P - 1) % P;
    for (int t = 0; t < N; ++t) {
      const Piece& piece = all[((first[i] + n - 1 - t) % N + N) % N];
      if (piece.owner != i) {
        // The predecessor meets this piece n steps earlier (owned, or received for that step):
        // the transfer may be posted from then on.
        const int early = std::min({lead, n - 1, t});
        for (const RowRange& kv : ranges(piece)) {
          AddForwardTransfer(plan, t, pred, i, PlanTensor::kKV, kv);
          plan.workers[pred].forward[t].sends.back().lead = early;
          plan.workers[i].forward[t].recvs.back().lead = early;
        }
      }
      for (const RowRange& q : plan.workers[i].owned) {
        for (const RowRange& kv : ranges(piece)) {
          if (unit_pairs(q, kv) > 0) {
            AddForwardCompute(plan, t, i, q, kv);
          }
        }
      }
    }
  }
  if (!kv_stationary_backward) return plan;
  // The K/V-stationary backward: the same ring with the roles of queries and keys swapped. At
  // step t worker i computes the query piece the forward's step t used as K/V (its Q, dO, LSE, D
  // travel the ring as kGradIn) against its own K/V: dK/dV accumulate at home (no dK/dV
  // partials at all), and the piece's dQ partial goes straight to its owner in step t+1. Per
  // piece pair on the links: grad_in 2 x (8 KiB + 128 B) plus one fp32 dQ partial, 32 KiB,
  // against K/V 32 KiB plus fp32 dK/dV 64 KiB for the derived backward.
  using planner_internal::StepAt;
  auto transfer = [&](int t, int from, int to, PlanTensor tensor, RowRange rows, int early) {
    StepAt(plan.workers[from].backward, t).sends.push_back(Transfer{to, tensor, rows, early});
    StepAt(plan.workers[to].backward, t).recvs.push_back(Transfer{from, tensor, rows, early});
  };
  for (int i = 0; i < P; ++i) {
    const int n = std::max(1, pieces[i]);
    const int pred = (i + P - 1) % P;
    for (int t = 0; t < N; ++t) {
      const Piece& piece = all[((first[i] + n - 1 - t) % N + N) % N];
      for (const RowRange& q : ranges(piece)) {
        if (piece.owner != i) {
          transfer(t, pred, i, PlanTensor::kGradIn, q, std::min({lead, n - 1, t}));
        }
        bool used = false;
        for (const RowRange& kv : plan.workers[i].owned) {
          if (unit_pairs(q, kv) > 0) {
            StepAt(plan.workers[i].backward, t).computes.push_back(ComputeOp{q, kv});
            used = true;
          }
        }
        if (used && piece.owner != i) {
          transfer(t + 1, i, piece.owner, PlanTensor::kDqPartial, q, 0);
        }
      }
    }
  }
  size_t steps = 0;
  for (const WorkerPlan& w : plan.workers) steps = std::max(steps, w.backward.size());
  for (WorkerPlan& w : plan.workers) w.backward.resize(steps);
  return plan;
}

}  // namespace dfa
