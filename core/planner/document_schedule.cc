// The packed-document plan (MakeDocumentPlan, planner.h): one of the "balanced" candidates for
// masked requests with documents (docs/planner.md, "Masked plans").
//
// A long-tailed document mix puts most of the visible work in a few long documents. Cutting the
// whole sequence into contiguous shards of equal work makes a long document's later shards
// receive nearly all of its keys, and its first shard's owner send its (largest) shard to every
// later one over one link. This plan treats the two kinds of documents apart:
//  - Long documents (visible work above long_fraction x the mean worker share), largest first,
//    each get the next consecutive workers whose speed shares hold it (fewer long documents when
//    the workers would not suffice), and inside the document the striped ring (the zigzag layout
//    of striped_ring_schedule.cc on the document's rows): each of its k workers owns a front
//    range and its mirror back range of the document, the work is split by speed exactly, and
//    each K/V piece travels the document's ring once per link; with the ring's derived or its
//    K/V-stationary backward.
//  - The short documents fill what is left of every worker's share (DocumentOptions
//    short_groups, fill_rings, cut_bins): packed whole into the ring workers' free shares, the
//    rest cut into contiguous pieces over the workers outside the rings (fill_rings: over the
//    ring workers' free shares too); or given whole to groups (each ring's workers, the workers
//    outside) and cut inside each group; or binned (every free share a bin, whole into the
//    fullest that holds it, else cut over one group's bins). A document cut by a boundary is
//    shared by two or more workers: each receives the keys of it that its queries see
//    (KeysSeen) from their owners.
// Steps: a ring worker's short work is spread evenly over its ring's steps (the ring's steps stay
// equal: all its workers have the same free share), the keys it receives from a worker of its
// ring in pieces, one per ring step, each used in the step it arrives, and tail_fraction of its
// own short work in a step after the ring (the derived backward's last partials travel while it
// computes). Outside the rings the same on the longest ring's steps (so that the derived
// backward's dK/dV partials return spread over the pass); with no ring of >= 2 steps, own work
// in step 0 and a tail step, foreign keys in step 1.
// The backward is derived (MakePlan, or the search) except for the K/V-stationary rings, whose
// own backward is merged with the short documents' derived one.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/planner/plan_builder.h"
#include "core/planner/planner.h"

namespace dfa {

namespace {

// The one document list of a masked request (every batch row the same), or empty.
std::vector<int64_t> DocumentOffsets(const PlanRequest& r) {
  const auto& rows = r.mask_spec.doc_offsets;
  if (rows.empty()) return {};
  for (const std::vector<int64_t>& row : rows) {
    if (row != rows[0]) return {};
  }
  if (rows[0].size() < 3) return {};  // one document: dense
  return rows[0];
}

}  // namespace

bool DocumentPlanApplies(const PlanRequest& r) {
  return r.workers >= 2 && r.mask_spec.window_left < 0 && r.mask_spec.window_right < 0 &&
         !DocumentOffsets(r).empty();
}

namespace {

// Appends `from`'s steps to `to`'s (step by step), rows shifted by `offset`, peers mapped.
void AppendSteps(std::vector<PlanStep>& to, const std::vector<PlanStep>& from, int64_t offset,
                 const std::vector<int>& peer_of) {
  auto shift = [offset](RowRange r) { return RowRange{r.begin + offset, r.end + offset}; };
  for (size_t t = 0; t < from.size(); ++t) {
    PlanStep& step = planner_internal::StepAt(to, static_cast<int>(t));
    for (Transfer x : from[t].sends) {
      x.peer = peer_of[x.peer];
      x.rows = shift(x.rows);
      step.sends.push_back(x);
    }
    for (Transfer x : from[t].recvs) {
      x.peer = peer_of[x.peer];
      x.rows = shift(x.rows);
      step.recvs.push_back(x);
    }
    for (const ComputeOp& c : from[t].computes) {
      step.computes.push_back(ComputeOp{shift(c.q_rows), shift(c.kv_rows)});
    }
  }
}

}  // namespace

Plan MakeDocumentPlan(const PlanRequest& r, const DocumentOptions& options) {
  if (!DocumentPlanApplies(r)) return Plan{};
  const int P = r.workers;
  const int64_t S = r.seq_len;
  std::vector<double> speeds = r.speeds;
  if (speeds.empty()) speeds.assign(P, 1.0);
  const double total_speed = std::accumulate(speeds.begin(), speeds.end(), 0.0);
  Plan plan;
  plan.schedule = "balanced";
  plan.seq_len = S;
  plan.causal = r.causal;
  plan.mask_spec = r.mask_spec;
  plan.workers.resize(P);
  const UnitPairs pairs(plan);
  const RowRange all{0, S};
  const std::vector<int64_t> offsets = DocumentOffsets(r);
  const int docs = static_cast<int>(offsets.size()) - 1;
  auto doc_rows = [&](int d) { return RowRange{offsets[d], offsets[d + 1]}; };
  std::vector<double> doc_work(docs);
  double total = 0;
  for (int d = 0; d < docs; ++d) {
    doc_work[d] = pairs(doc_rows(d), all);
    total += doc_work[d];
  }
  if (!(total > 0)) return Plan{};
  // Each worker's capacity: its speed share of the work; `left`: what is still free of it.
  std::vector<double> left(P);
  for (int w = 0; w < P; ++w) left[w] = total * speeds[w] / total_speed;
  const double mean = total / P;
  // The passes in two parts: the document rings' (forward, and with kv_stationary_backward
  // their own backward) and the short documents' (backward derived).
  std::vector<std::vector<PlanStep>> ring_forward(P), ring_backward(P), short_forward(P);
  std::vector<bool> in_ring(P, false);

  // Long documents, largest first, each on the next consecutive workers whose capacities hold it.
  std::vector<int> order(docs);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return doc_work[a] > doc_work[b]; });
  // How many of the largest documents get rings: those above long_fraction x the mean share,
  // fewer while their workers (consecutive, each taken whole) would not be enough.
  int rings = 0;
  while (rings < docs && doc_work[order[rings]] > options.long_fraction * mean) ++rings;
  for (; rings > 0; --rings) {
    int used = 0;
    bool fits = true;
    for (int k = 0; k < rings && fits; ++k) {
      double capacity = 0;
      while (used < P && capacity < doc_work[order[k]] * (1 - 1e-9)) capacity += left[used++];
      fits = capacity >= doc_work[order[k]] * (1 - 1e-9);
    }
    if (fits) break;
  }
  std::vector<bool> placed(docs, false);
  // The workers of each ring (in ring order); then the workers outside the rings as one group.
  std::vector<std::vector<int>> groups;
  int next = 0;
  for (int k = 0; k < rings; ++k) {
    const int d = order[k];
    const RowRange doc = doc_rows(d);
    std::vector<int> members;
    double capacity = 0;
    while (next < P && capacity < doc_work[d] * (1 - 1e-9)) {
      capacity += left[next];
      members.push_back(next++);
    }
    if (capacity < doc_work[d] * (1 - 1e-9)) return Plan{};  // more long work than workers
    if (members.size() < 2) {  // one worker holds it whole: a short document after all
      --next;
      break;
    }
    // The document's striped ring at the members' speeds (its work split by speed).
    PlanRequest sub = r;
    sub.workers = static_cast<int>(members.size());
    sub.seq_len = doc.size();
    sub.mask_spec = MaskSpec{};
    sub.session_shape = PlanRequest{}.session_shape;
    sub.speeds.clear();
    double sub_speed = 0, slowest = speeds[members[0]];
    for (int m : members) {
      sub.speeds.push_back(speeds[m]);
      sub_speed += speeds[m];
      slowest = std::min(slowest, speeds[m]);
    }
    std::vector<int> pieces;
    int64_t piece_total = 0;
    for (int m : members) {
      pieces.push_back(
          std::max(1, static_cast<int>(std::lround(options.pieces * speeds[m] / slowest))));
      piece_total += pieces.back();
    }
    if (2 * piece_total > doc.size()) return Plan{};
    const Plan ring =
        MakeStripedRingPlan(sub, pieces, options.kv_stationary_backward, options.lead);
    for (size_t i = 0; i < members.size(); ++i) {
      const int w = members[i];
      left[w] -= doc_work[d] * speeds[w] / sub_speed;
      in_ring[w] = true;
      for (const RowRange& o : ring.workers[i].owned) {
        plan.workers[w].owned.push_back(RowRange{o.begin + doc.begin, o.end + doc.begin});
      }
      AppendSteps(ring_forward[w], ring.workers[i].forward, doc.begin, members);
      AppendSteps(ring_backward[w], ring.workers[i].backward, doc.begin, members);
    }
    placed[d] = true;
    groups.push_back(members);
  }
  // The short documents (DocumentOptions::short_groups): packed whole into the ring workers'
  // free shares with the rest cut over the workers outside the rings, or given whole to groups
  // (each ring's workers, the workers outside the rings) and cut inside each group over its
  // workers' free shares. A document cut between two workers of a ring has its keys sent on the
  // ring's own step times (below); outside the rings, at the start of the pass.
  std::vector<std::vector<RowRange>> short_rows(P);
  std::vector<int> outside;
  for (int w = 0; w < P; ++w) {
    if (!in_ring[w] && left[w] > 0) outside.push_back(w);
  }
  std::vector<std::vector<int>> group_docs;
  if (options.cut_bins) {
    // Every worker's free share a bin (ring workers and the workers outside alike); the short
    // documents largest first, each whole into the fullest bin that holds it (a hair of
    // overfill allowed), else cut over the bins with the most free share, front first: few
    // documents cut, each over few workers.
    const double slack = 1e-3 * mean;
    for (int d : order) {
      if (placed[d]) continue;
      int fit = -1;
      for (int w = 0; w < P; ++w) {
        if (doc_work[d] <= left[w] + slack && (fit < 0 || left[w] < left[fit])) fit = w;
      }
      if (fit >= 0) {
        short_rows[fit].push_back(doc_rows(d));
        left[fit] -= doc_work[d];
        placed[d] = true;
        continue;
      }
      // The bins by group (each ring's workers, then the workers outside: a document cut inside
      // a ring has its keys on the ring's own step times), the group with the most free share
      // first, inside a group the most free first.
      std::vector<int> group_of(P, static_cast<int>(groups.size()));
      for (size_t g = 0; g < groups.size(); ++g) {
        for (int w : groups[g]) group_of[w] = static_cast<int>(g);
      }
      std::vector<double> group_free(groups.size() + 1, 0);
      for (int w = 0; w < P; ++w) group_free[group_of[w]] += std::max(0.0, left[w]);
      std::vector<int> bins(P);
      std::iota(bins.begin(), bins.end(), 0);
      std::stable_sort(bins.begin(), bins.end(), [&](int a, int b) {
        if (group_of[a] != group_of[b]) return group_free[group_of[a]] > group_free[group_of[b]];
        return left[a] > left[b];
      });
      int64_t row = offsets[d];
      const int64_t end = offsets[d + 1];
      for (size_t k = 0; k < bins.size() && row < end; ++k) {
        const int w = bins[k];
        const RowRange rest{row, end};
        const double rest_work = pairs(rest, all);
        if (k + 1 == bins.size() || rest_work <= left[w] + slack) {
          short_rows[w].push_back(rest);
          left[w] -= rest_work;
          row = end;
          break;
        }
        if (left[w] <= slack) continue;
        const int64_t cut = planner_internal::CutRowNear(rest, all, pairs, left[w]);
        if (cut <= row) continue;
        short_rows[w].push_back(RowRange{row, cut});
        left[w] -= pairs(RowRange{row, cut}, all);
        row = cut;
      }
      placed[d] = true;
    }
    groups.clear();
  } else if (options.short_groups) {
    if (!outside.empty()) groups.push_back(outside);
    std::vector<double> group_free(groups.size(), 0);
    for (size_t g = 0; g < groups.size(); ++g) {
      for (int w : groups[g]) group_free[g] += std::max(0.0, left[w]);
    }
    group_docs.resize(groups.size());
    for (int d : order) {
      if (placed[d]) continue;
      const size_t g = static_cast<size_t>(
          std::max_element(group_free.begin(), group_free.end()) - group_free.begin());
      group_docs[g].push_back(d);
      group_free[g] -= doc_work[d];
    }
  } else {
    // Packed: the ring workers' free shares filled with whole documents, largest that fits
    // first (no traffic for them); the rest cut over the workers outside the rings, which absorb
    // what the rings leave (over the ring workers with a free share when there are none).
    for (int d : order) {
      if (placed[d]) continue;
      for (int w = 0; w < P; ++w) {
        if (in_ring[w] && doc_work[d] <= left[w]) {
          short_rows[w].push_back(doc_rows(d));
          left[w] -= doc_work[d];
          placed[d] = true;
          break;
        }
      }
    }
    if (outside.empty() || options.fill_rings) {
      std::vector<int> fillers;
      for (int w = 0; w < P; ++w) {
        if (in_ring[w] && left[w] > 1e-3 * mean) fillers.push_back(w);
      }
      if (!outside.empty()) fillers.insert(fillers.end(), outside.begin(), outside.end());
      outside = std::move(fillers);
    }
    if (outside.empty()) outside.push_back(0);
    groups = {outside};
    group_docs.resize(1);
    for (int d = 0; d < docs; ++d) {
      if (!placed[d]) group_docs[0].push_back(d);
    }
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    if (group_docs[g].empty()) continue;
    std::sort(group_docs[g].begin(), group_docs[g].end());
    std::vector<RowRange> runs;
    double run_total = 0;
    for (int d : group_docs[g]) {
      run_total += doc_work[d];
      if (!runs.empty() && runs.back().end == offsets[d]) {
        runs.back().end = offsets[d + 1];
      } else {
        runs.push_back(doc_rows(d));
      }
    }
    // (No worker with a sliver: a document cut into slivers costs a message per sliver.)
    std::vector<int> fillers;
    double free_total = 0;
    for (int w : groups[g]) {
      if (left[w] > 1e-3 * mean) fillers.push_back(w);
    }
    if (fillers.empty()) fillers.push_back(groups[g][0]);
    for (int w : fillers) free_total += std::max(0.0, left[w]);
    if (!(free_total > 0)) free_total = 1;
    size_t run = 0;
    int64_t row = runs[0].begin;  // the next unassigned row
    for (size_t f = 0; f < fillers.size() && run < runs.size(); ++f) {
      const int w = fillers[f];
      const bool last = f + 1 == fillers.size();
      double need = run_total * std::max(0.0, left[w]) / free_total;
      while (run < runs.size()) {
        const RowRange rest{row, runs[run].end};
        const double rest_work = pairs(rest, all);
        if (last || rest_work <= need * (1 + 1e-12)) {  // the whole rest of the run
          if (rest.size() > 0) short_rows[w].push_back(rest);
          need -= rest_work;
          ++run;
          row = run < runs.size() ? runs[run].begin : S;
          if (!last && need <= 1e-9 * mean) break;
          continue;
        }
        const int64_t cut = planner_internal::CutRowNear(rest, all, pairs, need);
        if (cut > row) short_rows[w].push_back(RowRange{row, cut});
        row = cut;
        break;
      }
    }
  }
  // Owned: the ring ranges and the short rows, sorted, adjacent ranges merged (the short rows
  // merged among themselves too: the units below never reach into a ring's rows).
  auto sort_merge = [](std::vector<RowRange>& ranges) {
    std::sort(ranges.begin(), ranges.end(),
              [](const RowRange& a, const RowRange& b) { return a.begin < b.begin; });
    std::vector<RowRange> merged;
    for (const RowRange& o : ranges) {
      if (!merged.empty() && merged.back().end == o.begin) {
        merged.back().end = o.end;
      } else {
        merged.push_back(o);
      }
    }
    ranges = std::move(merged);
  };
  for (int w = 0; w < P; ++w) {
    std::vector<RowRange>& owned = plan.workers[w].owned;
    owned.insert(owned.end(), short_rows[w].begin(), short_rows[w].end());
    sort_merge(owned);
    sort_merge(short_rows[w]);
  }
  {  // Every row owned exactly once, else no plan (the search skips it).
    std::vector<RowRange> every;
    for (const WorkerPlan& w : plan.workers) {
      every.insert(every.end(), w.owned.begin(), w.owned.end());
    }
    std::sort(every.begin(), every.end(),
              [](const RowRange& a, const RowRange& b) { return a.begin < b.begin; });
    int64_t at = 0;
    for (const RowRange& o : every) {
      if (o.begin != at || o.size() <= 0) return Plan{};
      at = o.end;
    }
    if (at != S) return Plan{};
  }
  // The short documents' work. With no ring of >= 2 steps: own keys in step 0 and a tail step
  // (2), the other workers' keys in step 1 (sent at the start of the pass). A ring worker (and a
  // worker outside the rings, on the longest ring's steps) spreads its short work evenly over its
  // ring's steps (every worker of the ring has the same free share, so the ring's steps stay
  // equal): the keys of a document cut between two of its workers
  // travel in pieces, one per ring step, each used in the step it arrives (its derived dK/dV
  // partial returns during the next); own keys fill each step to the even share, the
  // tail_fraction of them in a step after the ring.
  size_t ring_steps = 0;
  for (int w = 0; w < P; ++w) ring_steps = std::max(ring_steps, ring_forward[w].size());
  for (int w = 0; w < P; ++w) {
    struct Item {
      RowRange q, kv;
      int source;
    };
    std::vector<Item> own, foreign;
    for (const RowRange& q : short_rows[w]) {
      for (int j = 0; j < P; ++j) {
        for (const RowRange& k : short_rows[j]) {
          const RowRange kv = pairs.KeysSeen(q, k);
          if (kv.size() <= 0) continue;
          const RowRange qs = pairs.QueriesSeeing(q, kv);
          if (qs.size() <= 0 || pairs(qs, kv) <= 0) continue;
          (j == w ? own : foreign).push_back({qs, kv, j});
        }
      }
    }
    auto compute = [&](int t, const RowRange& q, const RowRange& kv) {
      planner_internal::StepAt(short_forward[w], t).computes.push_back(ComputeOp{q, kv});
    };
    auto receive = [&](int t, int from, const RowRange& kv) {
      planner_internal::StepAt(short_forward[from], t)
          .sends.push_back(Transfer{w, PlanTensor::kKV, kv});
      planner_internal::StepAt(short_forward[w], t)
          .recvs.push_back(Transfer{from, PlanTensor::kKV, kv});
    };
    int N = static_cast<int>(ring_forward[w].size());
    if (N == 0 && ring_steps >= 2) N = ring_steps;
    const double tail_fraction = std::clamp(options.tail_fraction, 0.0, 1.0);
    double own_work = 0;
    for (const Item& it : own) own_work += pairs(it.q, it.kv);
    // step_work[t]: short work placed in step t so far (ring workers).
    std::vector<double> step_work(std::max(N, 1), 0);
    int tail = 0;       // the step the own tail goes to (0: no tail)
    double spread = 0;  // own work to spread over the steps before the tail
    if (N == 0) {
      for (const Item& it : foreign) {
        compute(1, it.q, it.kv);
        receive(1, it.source, it.kv);
      }
      tail = foreign.empty() ? 0 : 2;
      spread = tail == 0 ? own_work : own_work * (1 - tail_fraction);
      step_work.assign(1, 0);
    } else {
      double foreign_work = 0;
      for (const Item& it : foreign) {
        // Pieces of >= 64 rows, at most one per ring step after the first, round robin.
        const int n = static_cast<int>(std::clamp<int64_t>(it.kv.size() / 64, 1, std::max(1, N - 1)));
        for (int k = 0; k < n; ++k) {
          const RowRange kv{it.kv.begin + it.kv.size() * k / n, it.kv.begin + it.kv.size() * (k + 1) / n};
          const RowRange qs = pairs.QueriesSeeing(it.q, kv);
          const double work = qs.size() > 0 ? pairs(qs, kv) : 0;
          if (kv.size() <= 0 || work <= 0) continue;
          const int t = N > 1 ? 1 + k * (N - 1) / n : 1;
          compute(t, qs, kv);
          receive(t, it.source, kv);
          if (t < static_cast<int>(step_work.size())) step_work[t] += work;
          foreign_work += work;
        }
      }
      tail = tail_fraction > 0 ? std::max(N, 2) : 0;
      spread = own_work * (1 - tail_fraction);
      // Even share per ring step of the short work before the tail.
      const double share = (spread + foreign_work) / N;
      for (double& x : step_work) x = share - x;  // what own work may still add to each step
    }
    if (own.empty()) continue;
    // Own work: the steps before the tail filled in order (ring workers: up to each step's
    // share; others: step 0), the rest in the tail.
    size_t item = 0;
    int64_t q = own.empty() ? 0 : own[0].q.begin;
    double placed_work = 0;
    for (size_t t = 0; t < step_work.size() && item < own.size(); ++t) {
      double room = N == 0 ? spread : std::min(step_work[t], spread - placed_work);
      if (t + 1 == step_work.size() && tail == 0) room = 1e300;  // the rest: last step
      while (item < own.size() && room > 0) {
        const Item& it = own[item];
        const RowRange rest{q, it.q.end};
        const double work = pairs(rest, it.kv);
        if (work <= room * (1 + 1e-12)) {
          if (work > 0) compute(static_cast<int>(t), rest, it.kv);
          room -= work;
          placed_work += work;
          if (++item < own.size()) q = own[item].q.begin;
          continue;
        }
        const int64_t cut = planner_internal::CutRowNear(rest, it.kv, pairs, room);
        const RowRange front{q, cut};
        if (front.size() > 0 && pairs(front, it.kv) > 0) {
          compute(static_cast<int>(t), front, it.kv);
          placed_work += pairs(front, it.kv);
        }
        q = cut;
        room = 0;
      }
    }
    for (; item < own.size(); ++item, q = item < own.size() ? own[item].q.begin : q) {
      const RowRange rest{q, own[item].q.end};
      if (rest.size() > 0 && pairs(rest, own[item].kv) > 0) {
        compute(tail > 0 ? tail : static_cast<int>(step_work.size()) - 1, rest, own[item].kv);
      }
    }
  }
  std::vector<int> identity(P);
  std::iota(identity.begin(), identity.end(), 0);
  if (options.kv_stationary_backward) {
    // The short documents' backward derived from their forward alone, then the rings' own.
    for (int w = 0; w < P; ++w) plan.workers[w].forward = short_forward[w];
    planner_internal::EqualizeSteps(plan);
    DeriveBackwardSteps(plan);
    for (int w = 0; w < P; ++w) {
      AppendSteps(plan.workers[w].backward, ring_backward[w], 0, identity);
    }
    size_t n = 0;
    for (const WorkerPlan& w : plan.workers) n = std::max(n, w.backward.size());
    for (WorkerPlan& w : plan.workers) w.backward.resize(n);
  }
  for (int w = 0; w < P; ++w) {
    plan.workers[w].forward = short_forward[w];
    AppendSteps(plan.workers[w].forward, ring_forward[w], 0, identity);
  }
  planner_internal::EqualizeSteps(plan);
  return plan;
}

}  // namespace dfa
