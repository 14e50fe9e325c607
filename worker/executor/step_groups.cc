#include "worker/executor/step_groups.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/executor/pass_accumulators.h"
#include "worker/executor/transfer_layout.h"

namespace dfa::executor_internal {
namespace {

// Transfers of one step in the order both sides share: by peer, then canonical.
std::vector<Transfer> Sorted(const std::vector<Transfer>& list) {
  std::vector<Transfer> v = list;
  std::stable_sort(v.begin(), v.end(), [](const Transfer& a, const Transfer& b) {
    if (a.peer != b.peer) return a.peer < b.peer;
    return CanonicalTransferLess(a, b);
  });
  return v;
}

// The transfers of `list` with the given lead.
std::vector<Transfer> WithLead(const std::vector<Transfer>& list, int lead) {
  std::vector<Transfer> out;
  for (const Transfer& x : list) {
    if (x.lead == lead) out.push_back(x);
  }
  return out;
}

}  // namespace

absl::Status StepGroups::Init() {
  const int T = static_cast<int>(ctx_.steps().size());
  early_.clear();
  early_.resize(T);
  leads_.assign(T, {});
  for (int t = 0; t < T; ++t) {
    for (const auto* list : {&ctx_.steps()[t].sends, &ctx_.steps()[t].recvs}) {
      for (const Transfer& x : *list) {
        if (IsPartial(x.tensor)) continue;
        if (x.lead < 0 || x.lead > t) {
          return absl::InvalidArgumentError(absl::StrCat("plan step ", t, ": worker ", ctx_.rank,
                                                         ": transfer lead ", x.lead,
                                                         " outside [0, ", t, "]"));
        }
        leads_[t].insert(x.lead);
      }
    }
  }
  late_.resize(T);
  return absl::OkStatus();
}

std::vector<std::pair<int, int>> StepGroups::PostedAt(int post) const {
  std::vector<std::pair<int, int>> out;
  for (int t = std::max(0, post + 1); t < static_cast<int>(leads_.size()); ++t) {
    if (leads_[t].count(t - 1 - post)) out.push_back({t, t - 1 - post});
  }
  return out;
}

absl::Status StepGroups::PrepareEarly(int t, int lead) {
  const PlanStep& step = ctx_.steps()[t];
  Group& g = early_[t][lead];
  RETURN_IF_ERROR(PrepareEarlyRecvs(t, Sorted(WithLead(step.recvs, lead)), &g));
  return PrepareEarlySends(t, Sorted(WithLead(step.sends, lead)), &g);
}

absl::Status StepGroups::PrepareEarlyRecvs(int t, const std::vector<Transfer>& rs, Group* g) {
  const AttentionShape& shape = ctx_.shape;
  for (size_t i = 0; i < rs.size();) {
    const Transfer& x = rs[i];
    if (IsPartial(x.tensor)) {  // received in the late group (PostLate)
      ++i;
      continue;
    }
    // Adjacent rows of the same tensor from the same peer land in ONE buffer (each message in
    // its own rows of it), so that the step's ops on them can be fused into one call
    // (op_fusion.h). Only where every component's row slices are contiguous (batch 1).
    RowRange all = x.rows;
    size_t j = i + 1;
    // K/V only: a Q buffer's output partial carries LSE rows, which a slice cannot send whole.
    // The backward's dK/dV partial of a coalesced buffer is sent back in the plan's pieces.
    if (x.tensor == PlanTensor::kKV && shape.batch == 1) {
      while (j < rs.size() && rs[j].peer == x.peer && rs[j].tensor == x.tensor &&
             rs[j].rows.begin == all.end) {
        all.end = rs[j++].rows.end;
      }
    }
    ASSIGN_OR_RETURN(std::unique_ptr<Buffer> b, buffers_.New(x.tensor, all));
    const std::vector<Component> comps = Components(x.tensor, shape);
    for (size_t u = i; u < j; ++u) {
      for (size_t c = 0; c < comps.size(); ++c) {
        const TensorView dst = ComponentView(b->parts[c]->get(), comps[c], shape, all.size(),
                                             rs[u].rows.begin - all.begin, rs[u].rows.size());
        g->recvs.push_back(
            {x.peer, dst.data,
             static_cast<size_t>(ComponentBytes(comps[c], shape, rs[u].rows.size()))});
      }
      b->free_after = std::max(b->free_after, LastUse(rs[u], t));
    }
    ctx_.stats.steps[t].bytes_received += b->bytes;
    buffers_.KeepReceived(std::move(b));
    i = j;
  }
  return absl::OkStatus();
}

absl::Status StepGroups::PrepareEarlySends(int t, const std::vector<Transfer>& sends, Group* g) {
  const AttentionShape& shape = ctx_.shape;
  SessionStorage* st = ctx_.storage;
  StepStats& s = ctx_.stats.steps[t];
  for (const Transfer& x : sends) {
    if (IsPartial(x.tensor)) continue;
    std::vector<Component> comps = Components(x.tensor, shape);
    // Source components: owned storage, or a buffer received earlier (forwarding).
    std::vector<TensorView> src;
    absl::StatusOr<int64_t> local = st->LocalRow(x.rows);
    if (local.ok()) {
      // Inputs still arriving: a send waits for the rows it carries (the backward's Q, K, V are
      // the forward's; its dO is waited for with D, below).
      if (ctx_.fwd && x.tensor == PlanTensor::kQ) {
        RETURN_IF_ERROR(ctx_.WaitInput(InputTensor::kQ, x.rows));
      }
      if (ctx_.fwd && x.tensor == PlanTensor::kKV) {
        RETURN_IF_ERROR(ctx_.WaitInput(InputTensor::kK, x.rows));
        RETURN_IF_ERROR(ctx_.WaitInput(InputTensor::kV, x.rows));
      }
      // A backward's grad_in carries dO and D: with dO still arriving, both for these rows.
      if (!ctx_.fwd && x.tensor == PlanTensor::kGradIn && ctx_.acc != nullptr) {
        RETURN_IF_ERROR(ctx_.acc->PrepareQueries({*local, *local + x.rows.size()}));
      }
      std::vector<void*> bases;
      switch (x.tensor) {
        case PlanTensor::kQ: bases = {st->q().data}; break;
        case PlanTensor::kKV: bases = {st->k().data, st->v().data}; break;
        case PlanTensor::kGradIn:
          bases = {st->q().data, st->dout().data, st->lse().data, st->delta().data};
          break;
        default: break;
      }
      for (size_t i = 0; i < comps.size(); ++i) {
        src.push_back(ComponentView(bases[i], comps[i], shape, st->rows(), *local, x.rows.size()));
      }
    } else {
      Buffer* b = buffers_.FindReceived(x.tensor, x.rows);
      if (b == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "plan step ", t, ": worker ", ctx_.rank, " sends ", PlanTensorName(x.tensor), " ",
            Rows(x.rows), " which it neither owns nor has received"));
      }
      b->free_after = std::max(b->free_after, t);
      for (size_t i = 0; i < comps.size(); ++i) {
        src.push_back(ComponentView(b->parts[i]->get(), comps[i], shape, b->rows.size(),
                                    x.rows.begin - b->rows.begin, x.rows.size()));
      }
    }
    for (size_t i = 0; i < comps.size(); ++i) {
      const size_t bytes = static_cast<size_t>(ComponentBytes(comps[i], shape, x.rows.size()));
      void* data = src[i].data;
      if (!IsContiguous(src[i])) {  // pack into a dense staging buffer
        ASSIGN_OR_RETURN(void* p, ctx_.backend->Alloc(bytes));
        g->staging.push_back(std::make_unique<DeviceBuffer>(ctx_.backend, p));
        TensorView dst = src[i];
        dst.data = p;
        dst.row_stride = dst.batch_stride = 0;
        RETURN_IF_ERROR(
            Launch(&s.other_launches, ctx_.backend->Convert(src[i], dst, ctx_.stream)));
        data = p;
      }
      g->sends.push_back({x.peer, data, bytes});
      s.bytes_sent += static_cast<int64_t>(bytes);
    }
  }
  return absl::OkStatus();
}

bool StepGroups::HasMessages(int t, int lead) const {
  auto it = early_[t].find(lead);
  return it != early_[t].end() && (!it->second.sends.empty() || !it->second.recvs.empty());
}

absl::Status StepGroups::LaunchEarly(int t, int lead) {
  Group& g = early_[t][lead];
  if (g.sends.empty() && g.recvs.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(g.pending, ctx_.transport->Post(g.sends, g.recvs, ctx_.stream));
  return absl::OkStatus();
}

absl::Status StepGroups::WaitEarly(int t) {
  for (auto& [lead, g] : early_[t]) {
    if (g.pending == nullptr) continue;
    absl::Status w = g.pending->Wait(ctx_.stream, ctx_.options.step_timeout);
    if (!w.ok()) return absl::Status(w.code(), absl::StrCat("step ", t, ": ", w.message()));
  }
  early_[t].clear();
  return absl::OkStatus();
}

absl::Status StepGroups::PostLate(int t) {
  const AttentionShape& shape = ctx_.shape;
  StepStats& s = ctx_.stats.steps[t];
  Group& g = late_[t];
  std::vector<TransportMessage> sends, recvs;
  for (const Transfer& x : Sorted(ctx_.steps()[t].recvs)) {
    if (!IsPartial(x.tensor)) continue;
    ASSIGN_OR_RETURN(std::unique_ptr<Buffer> b, buffers_.New(x.tensor, x.rows));
    std::vector<Component> comps = Components(x.tensor, shape);
    for (size_t i = 0; i < comps.size(); ++i) {
      recvs.push_back({x.peer, b->parts[i]->get(),
                       static_cast<size_t>(ComponentBytes(comps[i], shape, x.rows.size()))});
    }
    s.bytes_received += b->bytes;
    g.arrivals.push_back(std::move(b));
  }
  for (const Transfer& x : Sorted(ctx_.steps()[t].sends)) {
    if (!IsPartial(x.tensor)) continue;
    Buffer* b = buffers_.PartialContaining(x.tensor, x.rows);
    std::vector<Component> comps = Components(x.tensor, shape);
    // A partial of a coalesced K/V or grad_in buffer goes back in the plan's pieces: contiguous
    // rows of its (one-component-per-row) dK/dV or dQ parts, batch 1.
    const bool sliceable = shape.batch == 1 && (x.tensor == PlanTensor::kDkvPartial ||
                                                x.tensor == PlanTensor::kDqPartial);
    if (b == nullptr || (b->rows != x.rows && !sliceable)) {
      return absl::InvalidArgumentError(absl::StrCat("plan step ", t, ": worker ", ctx_.rank,
                                                     " sends partial ", Rows(x.rows),
                                                     " that no compute produced"));
    }
    b->rows_unsent -= x.rows.size();
    if (b->rows_unsent <= 0) b->free_after = t;
    for (size_t i = 0; i < comps.size(); ++i) {
      const size_t bytes = static_cast<size_t>(ComponentBytes(comps[i], shape, x.rows.size()));
      const TensorView src = ComponentView(b->parts[i]->get(), comps[i], shape, b->rows.size(),
                                           x.rows.begin - b->rows.begin, x.rows.size());
      sends.push_back({x.peer, src.data, bytes});
      s.bytes_sent += static_cast<int64_t>(bytes);
    }
  }
  if (sends.empty() && recvs.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(g.pending, ctx_.transport->Post(sends, recvs, ctx_.stream));
  return absl::OkStatus();
}

absl::Status StepGroups::FinishLate(int t,
                                    const std::function<absl::Status(const Buffer&)>& merge) {
  Group& g = late_[t];
  if (g.pending != nullptr) {
    absl::Status w = g.pending->Wait(ctx_.stream, ctx_.options.step_timeout);
    if (!w.ok()) {
      return absl::Status(w.code(), absl::StrCat("step ", t, " partials: ", w.message()));
    }
  }
  for (const auto& a : g.arrivals) RETURN_IF_ERROR(merge(*a));
  g = Group{};
  return absl::OkStatus();
}

int StepGroups::LastUse(const Transfer& recv, int t) const {
  const std::vector<PlanStep>& steps = ctx_.steps();
  const bool q_side = recv.tensor != PlanTensor::kKV;
  int last = t;
  for (int u = t; u < static_cast<int>(steps.size()); ++u) {
    for (const ComputeOp& c : steps[u].computes) {
      if (recv.rows.Contains(q_side ? c.q_rows : c.kv_rows)) last = u;
    }
    for (const Transfer& x : steps[u].sends) {
      if (u > t && x.tensor == recv.tensor && recv.rows.Contains(x.rows)) last = u;
    }
  }
  return last;
}

}  // namespace dfa::executor_internal
