// ExecutorPassScratch (core/planner/worker_memory.h): the scratch a worker's PlanExecutor
// (worker/executor/) allocates over one pass, replayed from the plan in the executor's order of
// events, so that admission charges what the executor will hold.
#include <algorithm>
#include <limits>
#include <vector>

#include "core/planner/worker_memory.h"

namespace dfa {
namespace {

bool OwnsRange(const WorkerPlan& w, const RowRange& r) {
  for (const RowRange& o : w.owned) {
    if (o.Contains(r)) return true;
  }
  return false;
}

// Bytes of one message component as the executor lays it out (worker/executor/
// transfer_layout.h): dense [B, rows, heads, D] in its dtype, or a statistic fp32 [B, heads, rows].
struct Part {
  bool stat;
  int64_t bytes;
};
std::vector<Part> Parts(PlanTensor t, const AttentionShape& s, int64_t rows) {
  const int64_t es = DTypeSize(s.dtype);
  const int64_t q = int64_t{s.batch} * rows * s.q_heads * s.head_dim;
  const int64_t kv = int64_t{s.batch} * rows * s.kv_heads * s.head_dim;
  const int64_t st = int64_t{s.batch} * rows * s.q_heads * 4;
  switch (t) {
    case PlanTensor::kQ: return {{false, q * es}};
    case PlanTensor::kKV: return {{false, kv * es}, {false, kv * es}};
    case PlanTensor::kOutPartial: return {{false, q * 4}, {true, st}};
    case PlanTensor::kGradIn: return {{false, q * es}, {false, q * es}, {true, st}, {true, st}};
    case PlanTensor::kDqPartial: return {{false, q * 4}};
    case PlanTensor::kDkvPartial: return {{false, kv * 4}, {false, kv * 4}};
  }
  return {};
}

// The executor's scratch over one pass, event by event in the order worker/executor/
// plan_executor.cc runs them (step_groups.h, pass_buffers.h): receive buffers (adjacent K/V
// messages of one peer and group in one buffer, batch 1) from their group's preparation to the
// end of their last use; packed sends from their preparation to their step's wait; partials
// from their first compute to the wait of their last send's group (after that step's
// computes); received partials from their late group's posting to its merge (the same point).
// Returns the most alive at once.
class PassModel {
 public:
  PassModel(const Plan& plan, int rank, const AttentionShape& shape, bool fwd, int64_t start)
      : w_(plan.workers[rank]), shape_(shape), fwd_(fwd),
        steps_(fwd ? w_.forward : w_.backward), live_(start), peak_(start) {}

  int64_t Run() {
    const int T = static_cast<int>(steps_.size());
    leads_.assign(T, {});
    staging_.assign(T, 0);
    arrivals_.assign(T, 0);
    for (int t = 0; t < T; ++t) {
      for (const auto* list : {&steps_[t].sends, &steps_[t].recvs}) {
        for (const Transfer& x : *list) {
          if (!IsPartial(x.tensor)) leads_[t].push_back(x.lead);
        }
      }
    }
    if (T == 0) return peak_;
    for (int u = 0; u < T; ++u) {
      if (HasLead(u, u)) PrepareEarly(u, u);
    }
    PostLate(0);
    for (int t = 0; t < T; ++t) {
      Free(staging_[t]);  // WaitEarly(t)
      for (int u = t + 1; u < T; ++u) {
        if (HasLead(u, u - 1 - t)) PrepareEarly(u, u - 1 - t);
      }
      Compute(t);
      // FinishLate(t): its arrivals merged, the partials it sent free.
      Free(arrivals_[t]);
      ReleaseSent(t);
      if (t + 1 < T) PostLate(t + 1);
      Release(t);
    }
    return peak_;
  }

 private:
  struct Buffer {
    PlanTensor tensor;
    RowRange rows;
    int64_t bytes;
    int free_after;
    int64_t rows_unsent = 0;
  };

  void Alloc(int64_t b) {
    live_ += b;
    peak_ = std::max(peak_, live_);
  }
  void Free(int64_t b) { live_ -= b; }
  bool HasLead(int t, int lead) const {
    return std::find(leads_[t].begin(), leads_[t].end(), lead) != leads_[t].end();
  }
  static std::vector<Transfer> Sorted(const std::vector<Transfer>& list, int lead) {
    std::vector<Transfer> v;
    for (const Transfer& x : list) {
      if (!IsPartial(x.tensor) && x.lead == lead) v.push_back(x);
    }
    std::stable_sort(v.begin(), v.end(), [](const Transfer& a, const Transfer& b) {
      if (a.peer != b.peer) return a.peer < b.peer;
      return CanonicalTransferLess(a, b);
    });
    return v;
  }
  int LastUse(const Transfer& recv, int t) const {
    const bool q_side = recv.tensor != PlanTensor::kKV;
    int last = t;
    for (int u = t; u < static_cast<int>(steps_.size()); ++u) {
      for (const ComputeOp& c : steps_[u].computes) {
        if (recv.rows.Contains(q_side ? c.q_rows : c.kv_rows)) last = u;
      }
      for (const Transfer& x : steps_[u].sends) {
        if (u > t && x.tensor == recv.tensor && recv.rows.Contains(x.rows)) last = u;
      }
    }
    return last;
  }
  // (total rows of the source, offset) of a send's rows: owned storage or a received buffer.
  bool SourceOf(const Transfer& x, int64_t* total, int64_t* off) {
    int64_t rows = 0, base = 0, local = -1;
    for (const RowRange& r : w_.owned) {
      if (local < 0 && r.Contains(x.rows)) local = base + (x.rows.begin - r.begin);
      base += r.size();
      rows += r.size();
    }
    if (local >= 0) {
      *total = rows;
      *off = local;
      return true;
    }
    for (const Buffer& b : received_) {
      if (b.tensor == x.tensor && b.rows.Contains(x.rows)) {
        *total = b.rows.size();
        *off = x.rows.begin - b.rows.begin;
        return true;
      }
    }
    return false;
  }
  // Early group (t, lead): its receive buffers and packed sends.
  void PrepareEarly(int t, int lead) {
    const std::vector<Transfer> rs = Sorted(steps_[t].recvs, lead);
    for (size_t i = 0; i < rs.size();) {
      RowRange all = rs[i].rows;
      size_t j = i + 1;
      if (rs[i].tensor == PlanTensor::kKV && shape_.batch == 1) {
        while (j < rs.size() && rs[j].peer == rs[i].peer && rs[j].tensor == rs[i].tensor &&
               rs[j].rows.begin == all.end) {
          all.end = rs[j++].rows.end;
        }
      }
      Buffer b{rs[i].tensor, all, 0, 0};
      for (const Part& p : Parts(b.tensor, shape_, all.size())) b.bytes += p.bytes;
      for (size_t u = i; u < j; ++u) b.free_after = std::max(b.free_after, LastUse(rs[u], t));
      Alloc(b.bytes);
      received_.push_back(b);
      i = j;
    }
    for (const Transfer& x : Sorted(steps_[t].sends, lead)) {
      int64_t total = 0, off = 0;
      if (!SourceOf(x, &total, &off)) continue;
      const int64_t n = x.rows.size();
      for (const Part& p : Parts(x.tensor, shape_, n)) {
        const int64_t outer = p.stat ? int64_t{shape_.batch} * shape_.q_heads : shape_.batch;
        const bool contiguous = outer == 1 || total == n;
        if (!contiguous) {
          Alloc(p.bytes);
          staging_[t] += p.bytes;
        }
      }
    }
  }
  Buffer* FindReceived(PlanTensor t, const RowRange& r) {
    for (Buffer& b : received_) {
      if (b.tensor == t && b.rows.Contains(r)) return &b;
    }
    return nullptr;
  }
  void Partial(PlanTensor t, const RowRange& rows) {
    for (const Buffer& p : partials_) {
      if (p.tensor == t && p.rows == rows) return;
    }
    Buffer p{t, rows, 0, std::numeric_limits<int>::max(), rows.size()};
    for (const Part& part : Parts(t, shape_, rows.size())) p.bytes += part.bytes;
    Alloc(p.bytes);
    partials_.push_back(p);
  }
  void Compute(int t) {
    for (const ComputeOp& op : steps_[t].computes) {
      if (!OwnsRange(w_, op.q_rows)) {
        if (Buffer* b = FindReceived(fwd_ ? PlanTensor::kQ : PlanTensor::kGradIn, op.q_rows)) {
          Partial(fwd_ ? PlanTensor::kOutPartial : PlanTensor::kDqPartial, b->rows);
        }
      }
      if (!fwd_ && !OwnsRange(w_, op.kv_rows)) {
        if (Buffer* b = FindReceived(PlanTensor::kKV, op.kv_rows)) {
          Partial(PlanTensor::kDkvPartial, b->rows);
        }
      }
    }
  }
  void PostLate(int t) {
    for (const Transfer& x : steps_[t].recvs) {
      if (!IsPartial(x.tensor)) continue;
      for (const Part& p : Parts(x.tensor, shape_, x.rows.size())) arrivals_[t] += p.bytes;
    }
    Alloc(arrivals_[t]);
    for (const Transfer& x : steps_[t].sends) {
      if (!IsPartial(x.tensor)) continue;
      Buffer* found = nullptr;
      for (Buffer& p : partials_) {
        if (p.tensor == x.tensor && p.rows.Contains(x.rows)) found = &p;
      }
      if (found == nullptr) continue;
      found->rows_unsent -= x.rows.size();
      if (found->rows_unsent <= 0) found->free_after = t;
    }
  }
  void ReleaseSent(int t) {
    for (auto it = partials_.begin(); it != partials_.end();) {
      if (it->free_after <= t) {
        Free(it->bytes);
        it = partials_.erase(it);
      } else {
        ++it;
      }
    }
  }
  void Release(int t) {
    auto drop = [&](std::vector<Buffer>* list, auto done) {
      for (auto it = list->begin(); it != list->end();) {
        if (done(*it)) {
          Free(it->bytes);
          it = list->erase(it);
        } else {
          ++it;
        }
      }
    };
    drop(&received_, [t](const Buffer& b) { return b.free_after <= t; });
    drop(&partials_, [t](const Buffer& b) { return b.free_after < t; });
  }

  const WorkerPlan& w_;
  const AttentionShape shape_;
  const bool fwd_;
  const std::vector<PlanStep>& steps_;
  int64_t live_, peak_;
  std::vector<std::vector<int>> leads_;
  std::vector<int64_t> staging_;   // [step]: packed sends of its early groups
  std::vector<int64_t> arrivals_;  // [step]: partials its late group receives
  std::vector<Buffer> received_, partials_;
};

}  // namespace

int64_t ExecutorPassScratch(const Plan& plan, int rank, const AttentionShape& local, bool forward,
                            int64_t start_bytes) {
  return PassModel(plan, rank, local, forward, start_bytes).Run();
}

}  // namespace dfa
