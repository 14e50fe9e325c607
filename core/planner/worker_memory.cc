#include "core/planner/worker_memory.h"

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dfa {
namespace {

bool OwnsRange(const WorkerPlan& w, const RowRange& r) {
  for (const RowRange& o : w.owned) {
    if (o.Contains(r)) return true;
  }
  return false;
}

// Cuts one pass of every worker (CutTransfers). Returns false, leaving `out` alone, when the
// plan is not one CheckPlan accepts in the ways the cut relies on (a received row no worker of
// the receiver's head group owns, a unit on rows neither owned nor received): the executor then
// runs the plan as it is and reports its error.
struct CutPiece {
  PlanTensor tensor;
  RowRange rows;
  int owner;
  int step;  // the cut step it arrives for
  int lead;
  int last_use = -1;
};

struct CutPart {
  RowRange rows;
  CutPiece* piece;  // nullptr: owned rows
};

bool CutPass(const Plan& plan, const TransferCut& cut, bool fwd, Plan* out) {
  const int P = plan.num_workers();
  auto steps_of = [&](const WorkerPlan& w) -> const std::vector<PlanStep>& {
    return fwd ? w.forward : w.backward;
  };
  int T = 0;
  for (const WorkerPlan& w : plan.workers) T = std::max(T, static_cast<int>(steps_of(w).size()));
  std::vector<int> k(T, 1);
  for (const WorkerPlan& w : plan.workers) {
    int64_t owned = 0;
    for (const RowRange& r : w.owned) owned += r.size();
    const int64_t bound =
        std::max<int64_t>(1, std::clamp<int64_t>((owned + cut.shard_fraction - 1) /
                                                     std::max<int64_t>(1, cut.shard_fraction),
                                                 cut.min_rows, std::max(cut.min_rows, cut.max_rows)));
    const std::vector<PlanStep>& steps = steps_of(w);
    for (size_t t = 0; t < steps.size(); ++t) {
      int64_t rows = 0;
      for (const Transfer& x : steps[t].recvs) {
        if (!IsPartial(x.tensor)) rows += x.rows.size();
      }
      k[t] = std::max<int>(k[t], static_cast<int>((rows + bound - 1) / bound));
    }
  }
  std::vector<int> base(T + 1, 0);
  for (int t = 0; t < T; ++t) base[t + 1] = base[t] + k[t];
  std::vector<std::vector<PlanStep>> passes(P, std::vector<PlanStep>(base[T]));
  const UnitPairs pairs(plan);
  for (int w = 0; w < P; ++w) {
    const WorkerPlan& me = plan.workers[w];
    const std::vector<PlanStep>& steps = steps_of(me);
    std::vector<PlanStep>& mine = passes[w];
    std::deque<CutPiece> pieces;  // stable addresses
    // The pieces of each tensor by first row (a pass receives a row of a tensor at most once).
    std::map<PlanTensor, std::map<int64_t, CutPiece*>> by_row;
    for (int t = 0; t < static_cast<int>(steps.size()); ++t) {
      // The rows received in step t, cut at their owners' ranges (in the receiver's head group),
      // then dealt in order into k[t] windows of nearly equal row counts: piece j of step t is
      // what falls into window j.
      struct Seg {
        PlanTensor tensor;
        RowRange rows;
        int owner;
        int lead;
      };
      std::vector<Seg> segs;
      int64_t total = 0;
      for (const Transfer& x : steps[t].recvs) {
        if (IsPartial(x.tensor)) continue;
        std::vector<Seg> own;
        for (int u = 0; u < P; ++u) {
          if (u == w || plan.workers[u].kv_heads != me.kv_heads) continue;
          for (const RowRange& o : plan.workers[u].owned) {
            const RowRange i{std::max(o.begin, x.rows.begin), std::min(o.end, x.rows.end)};
            if (i.size() > 0) own.push_back(Seg{x.tensor, i, u, 0});
          }
        }
        std::sort(own.begin(), own.end(),
                  [](const Seg& a, const Seg& b) { return a.rows.begin < b.rows.begin; });
        int64_t at = x.rows.begin;
        for (const Seg& g : own) {
          if (g.rows.begin != at) return false;
          at = g.rows.end;
        }
        if (at != x.rows.end) return false;
        // Uncut steps keep the posting step (start of step t-1-lead); cut ones post a piece one
        // cut step before it is used.
        const int post = t - 1 - x.lead >= 0 ? base[t - 1 - x.lead] : -1;
        for (Seg& g : own) {
          g.lead = k[t] == 1 ? base[t] - 1 - post : 0;
          segs.push_back(g);
          total += g.rows.size();
        }
      }
      int64_t offset = 0;  // of the segment in the step's rows
      for (const Seg& g : segs) {
        for (int j = 0; j < k[t]; ++j) {
          const int64_t lo = std::max(total * j / k[t], offset) - offset;
          const int64_t hi = std::min(total * (j + 1) / k[t], offset + g.rows.size()) - offset;
          if (hi <= lo) continue;
          pieces.push_back(CutPiece{g.tensor, RowRange{g.rows.begin + lo, g.rows.begin + hi},
                                    g.owner, base[t] + j, g.lead});
          by_row[g.tensor][pieces.back().rows.begin] = &pieces.back();
        }
        offset += g.rows.size();
      }
      // The parts of a unit's rows: owned, or the received pieces (arrived by step t) they cover.
      auto parts = [&](const RowRange& r, PlanTensor tensor, std::vector<CutPart>* v) {
        v->clear();
        if (OwnsRange(me, r)) {
          v->push_back({r, nullptr});
          return true;
        }
        int64_t covered = 0;
        const std::map<int64_t, CutPiece*>& index = by_row[tensor];
        auto it = index.upper_bound(r.begin);
        if (it != index.begin()) --it;
        for (; it != index.end() && it->first < r.end; ++it) {
          CutPiece* p = it->second;
          const RowRange i{std::max(p->rows.begin, r.begin), std::min(p->rows.end, r.end)};
          if (i.size() <= 0 || p->step >= base[t + 1]) continue;
          v->push_back({i, p});
          covered += i.size();
        }
        return covered == r.size();
      };
      std::vector<CutPart> qs, kvs;
      for (const ComputeOp& op : steps[t].computes) {
        if (!parts(op.q_rows, fwd ? PlanTensor::kQ : PlanTensor::kGradIn, &qs)) return false;
        if (!parts(op.kv_rows, PlanTensor::kKV, &kvs)) return false;
        for (const CutPart& q : qs) {
          for (const CutPart& kv : kvs) {
            if (qs.size() * kvs.size() > 1 && pairs(q.rows, kv.rows) <= 0) continue;
            int at = base[t];
            if (q.piece != nullptr) at = std::max(at, q.piece->step);
            if (kv.piece != nullptr) at = std::max(at, kv.piece->step);
            mine[at].computes.push_back(ComputeOp{q.rows, kv.rows});
            for (CutPiece* p : {q.piece, kv.piece}) {
              if (p != nullptr) p->last_use = std::max(p->last_use, at);
            }
          }
        }
      }
    }
    for (const CutPiece& p : pieces) {
      if (p.last_use < 0) continue;  // no unit uses it: not sent
      mine[p.step].recvs.push_back(Transfer{p.owner, p.tensor, p.rows, p.lead});
      passes[p.owner][p.step].sends.push_back(Transfer{w, p.tensor, p.rows, p.lead});
      // Its partial, to the owner in the step after the last unit on it.
      PlanTensor partial = PlanTensor::kOutPartial;
      if (!fwd) partial = p.tensor == PlanTensor::kKV ? PlanTensor::kDkvPartial
                                                      : PlanTensor::kDqPartial;
      if (fwd && p.tensor == PlanTensor::kKV) continue;
      const int s = p.last_use + 1;
      if (s >= base[T]) return false;
      mine[s].sends.push_back(Transfer{p.owner, partial, p.rows, 0});
      passes[p.owner][s].recvs.push_back(Transfer{w, partial, p.rows, 0});
    }
  }
  for (int w = 0; w < P; ++w) {
    (fwd ? out->workers[w].forward : out->workers[w].backward) = std::move(passes[w]);
  }
  return true;
}

bool SameSteps(const std::vector<PlanStep>& a, const std::vector<PlanStep>& b) {
  if (a.size() != b.size()) return false;
  for (size_t t = 0; t < a.size(); ++t) {
    if (a[t].sends != b[t].sends || a[t].recvs != b[t].recvs ||
        a[t].computes != b[t].computes) {
      return false;
    }
  }
  return true;
}

bool SamePlan(const Plan& a, const Plan& b) {
  const MaskSpec &ma = a.mask_spec, &mb = b.mask_spec;
  if (a.seq_len != b.seq_len || a.causal != b.causal || a.num_workers() != b.num_workers() ||
      ma.causal != mb.causal || ma.window_left != mb.window_left ||
      ma.window_right != mb.window_right || ma.doc_offsets != mb.doc_offsets) {
    return false;
  }
  for (int w = 0; w < a.num_workers(); ++w) {
    const WorkerPlan &x = a.workers[w], &y = b.workers[w];
    if (x.owned != y.owned || x.kv_heads != y.kv_heads || !SameSteps(x.forward, y.forward) ||
        !SameSteps(x.backward, y.backward)) {
      return false;
    }
  }
  return true;
}

// The cut of the plan PlanWorkerMemory was last asked about: admission asks for every rank of
// one plan in turn, and the cut covers all workers (O(P) cheaper than cutting per rank).
std::shared_ptr<const Plan> CachedCut(const Plan& plan, const TransferCut& cut) {
  struct Cache {
    std::mutex mu;
    Plan in;
    TransferCut cut;
    std::shared_ptr<const Plan> out;
  };
  static Cache* cache = new Cache;
  {
    std::lock_guard<std::mutex> l(cache->mu);
    if (cache->out != nullptr && cache->cut.shard_fraction == cut.shard_fraction &&
        cache->cut.min_rows == cut.min_rows && cache->cut.max_rows == cut.max_rows &&
        SamePlan(cache->in, plan)) {
      return cache->out;
    }
  }
  auto out = std::make_shared<const Plan>(CutTransfers(plan, cut));
  std::lock_guard<std::mutex> l(cache->mu);
  cache->in = plan;
  cache->cut = cut;
  cache->out = out;
  return out;
}

}  // namespace

Plan CutTransfers(const Plan& plan, const TransferCut& cut) {
  bool receives = false;
  for (const WorkerPlan& w : plan.workers) {
    for (const auto* pass : {&w.forward, &w.backward}) {
      for (const PlanStep& s : *pass) receives = receives || !s.recvs.empty();
    }
  }
  if (!receives) return plan;
  Plan out = plan;
  if (!CutPass(plan, cut, true, &out) || !CutPass(plan, cut, false, &out)) return plan;
  return out;
}

bool SingleWriterForward(const Plan& plan, int rank) {
  const WorkerPlan& w = plan.workers[rank];
  std::vector<RowRange> written;
  for (const PlanStep& step : w.forward) {
    for (const Transfer& x : step.recvs) {
      if (x.tensor == PlanTensor::kOutPartial) return false;
    }
    for (const ComputeOp& op : step.computes) {
      if (OwnsRange(w, op.q_rows)) written.push_back(op.q_rows);
    }
  }
  std::sort(written.begin(), written.end(),
            [](const RowRange& a, const RowRange& b) { return a.begin < b.begin; });
  int64_t covered = 0, total = 0;
  for (size_t i = 0; i < written.size(); ++i) {
    if (i > 0 && written[i].begin < written[i - 1].end) return false;  // a row written twice
    covered += written[i].size();
  }
  for (const RowRange& r : w.owned) total += r.size();
  return covered == total;
}

bool ChunkedBackward(const Plan& plan, int rank) {
  const WorkerPlan& w = plan.workers[rank];
  int step_with_owned_keys = -1;
  for (size_t t = 0; t < w.backward.size(); ++t) {
    const PlanStep& step = w.backward[t];
    for (const Transfer& x : step.recvs) {
      if (x.tensor == PlanTensor::kDkvPartial) return false;
    }
    for (const Transfer& x : step.sends) {
      if (x.tensor == PlanTensor::kKV) return false;
    }
    for (const ComputeOp& op : step.computes) {
      if (!OwnsRange(w, op.kv_rows)) continue;
      if (step_with_owned_keys >= 0 && step_with_owned_keys != static_cast<int>(t)) return false;
      step_with_owned_keys = static_cast<int>(t);
    }
  }
  return true;
}

absl::StatusOr<WorkerMemory> PlanWorkerMemory(const Plan& plan_in, int rank,
                                              const AttentionShape& local,
                                              const CheckReport& report, int64_t step_tokens,
                                              const TransferCut& cut) {
  if (rank < 0 || rank >= plan_in.num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat("rank: ", rank, " is outside the plan's ",
                                                   plan_in.num_workers(), " workers"));
  }
  if (step_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("step_tokens: must be >= 1, got ", step_tokens));
  }
  int64_t rows = 0;
  for (const RowRange& r : plan_in.workers[rank].owned) rows += r.size();
  const std::shared_ptr<const Plan> run = CachedCut(plan_in, cut);  // what the executor runs
  const Plan& plan = *run;
  (void)report;
  // The layout with fp32 dK, dV of all owned rows, or key chunks where the backward allows them
  // (ChunkedBackward) and they hold no more: with a merging forward the work region keeps O
  // beside its fp32 accumulator, which a chunk of all the keys would exceed.
  auto memory = [&](bool kv_accumulators) {
    WorkerMemory m;
    m.step_tokens = step_tokens;
    m.layout.forward_accumulator = !SingleWriterForward(plan, rank);
    m.layout.kv_accumulators = kv_accumulators;
    m.storage = SessionStorageLayout(local, rows, m.layout);
    if (!m.layout.kv_accumulators && rows > 0) {
      m.key_chunk = KeyChunkBytes(local, std::min(rows, step_tokens));
    }
    // A masked plan's interval arrays (worker/session_mask.h SessionMask::Bytes).
    if (!plan.dense()) m.mask = 16 * int64_t{local.batch} * plan.seq_len;
    m.forward_buffers = ExecutorPassScratch(plan, rank, local, true, 0);
    m.backward_buffers =
        ExecutorPassScratch(plan, rank, local, false, m.key_chunk) - m.key_chunk;
    return m;
  };
  const WorkerMemory whole = memory(true);
  if (!ChunkedBackward(plan, rank)) return whole;
  const WorkerMemory chunked = memory(false);
  return chunked.peak() <= whole.peak() ? chunked : whole;
}

}  // namespace dfa
