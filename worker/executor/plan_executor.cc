#include "worker/executor/plan_executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/executor/op_fusion.h"
#include "worker/executor/transfer_layout.h"

namespace dfa {
namespace {

using executor_internal::AddInto;
using executor_internal::Component;
using executor_internal::ComponentBytes;
using executor_internal::Components;
using executor_internal::ComponentView;
using executor_internal::IsContiguous;
using executor_internal::StatView;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string Rows(const RowRange& r) { return absl::StrCat("[", r.begin, ", ", r.end, ")"); }

// Backend memory freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer(AttentionBackend* b, void* p) : backend_(b), p_(p) {}
  ~DeviceBuffer() { if (p_ != nullptr) backend_->Free(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }

 private:
  AttentionBackend* backend_;
  void* p_;
};

// A received buffer or a partial: its components, dense over `rows`.
struct Buffer {
  PlanTensor tensor;
  RowRange rows;
  std::vector<RowRange> layout;  // {rows}: the op fusion's view of it (op_fusion.h)
  std::vector<std::unique_ptr<DeviceBuffer>> parts;
  int64_t bytes = 0;
  int free_after = 0;  // step after whose end it is released
  int64_t rows_unsent = 0;  // partials: rows not yet sent to their owner
};

struct Group {
  std::vector<TransportMessage> sends, recvs;  // prepared, not yet posted (early groups)
  std::unique_ptr<PendingGroup> pending;
  std::vector<std::unique_ptr<DeviceBuffer>> staging;  // packed sends
  std::vector<std::unique_ptr<Buffer>> arrivals;       // received partials, merged after Wait
};

class PassRunner {
 public:
  PassRunner(AttentionBackend* backend, Transport* transport, SessionStorage* storage,
             const ExecutorOptions& options, const Plan& plan, bool fwd)
      : backend_(backend), transport_(transport), st_(storage), opt_(options), plan_(plan),
        fwd_(fwd), shape_(storage->shape()) {}

  absl::StatusOr<PassStats> Run();

 private:
  const std::vector<PlanStep>& pass() const {
    const WorkerPlan& w = plan_.workers[rank_];
    return fwd_ ? w.forward : w.backward;
  }
  bool Owned(const RowRange& r) const { return st_->LocalRow(r).ok(); }
  absl::StatusOr<std::unique_ptr<Buffer>> NewBuffer(PlanTensor t, const RowRange& rows);
  Buffer* FindReceived(PlanTensor t, const RowRange& rows);
  absl::StatusOr<Buffer*> Partial(PlanTensor t, const RowRange& rows, int step);
  // The early group of step t's non-partial transfers with lead L (plan.h): receive buffers
  // allocated, sends packed (queued on the compute stream), then posted by LaunchEarly at the
  // start of step t-1-L.
  absl::Status PrepareEarly(int t, int lead);
  absl::Status LaunchEarly(int t, int lead);
  // The (step, lead) groups the start of step `post` posts (-1: before the pass), step order.
  std::vector<std::pair<int, int>> GroupsPostedAt(int post) const;
  absl::Status PostLate(int t);
  // Waits for step t's partial group and merges what it brought (one step after t's computes).
  absl::Status FinishLate(int t);
  absl::Status Merge(const Buffer& arrival);
  // Where an op's rows live (owned storage or a received buffer; null buffer = owned).
  struct Side {
    RowPlace place;
    Buffer* buffer = nullptr;
  };
  absl::StatusOr<Side> QuerySide(const RowRange& rows, int t);
  absl::StatusOr<Side> KvSide(const RowRange& rows, int t);
  // The step's ops, fused into as few backend calls as exactness allows (op_fusion.h).
  absl::Status ComputeStep(int t);
  absl::Status Compute(const FusedCall& call, const Side& q, const Side& kv, int t);
  absl::Status Launch(int64_t* counter, absl::Status s) {
    ++*counter;
    return s;
  }
  int64_t LiveBytes() const;
  // The last step that reads a buffer received at step t (its computes and forwarding sends).
  int LastUse(const Transfer& recv, int t) const;

  AttentionBackend* backend_;
  Transport* transport_;
  SessionStorage* st_;
  const ExecutorOptions& opt_;
  const Plan& plan_;
  const bool fwd_;
  const SessionShape shape_;
  int rank_ = 0;
  float scale_ = 0;
  void* stream_ = nullptr;
  std::vector<std::unique_ptr<Buffer>> received_;
  std::vector<std::unique_ptr<Buffer>> partials_;
  std::vector<std::map<int, Group>> early_;  // [step][lead]
  std::vector<Group> late_;
  std::vector<std::set<int>> leads_;  // [step]: leads of its non-partial transfers
  std::unique_ptr<DeviceBuffer> out_acc_;  // forward fp32 output accumulator (dtype != f32)
  TensorView out_view_;                    // fp32 [B, rows, Hq, D] accumulator view
  // Forward, session dtype != f32: every owned row is written by exactly one call and nothing
  // is merged into it (no kOutPartial arrives; e.g. a head group of one worker, or P = 1). Then
  // the calls write O in the session's dtype straight into storage: no fp32 accumulator, no
  // Convert at the end (cuDNN writes its bf16 O in place instead of through two conversions).
  bool SingleWriterForward() const;
  // Forward: local rows of the output accumulator (and LSE) that hold a partial already. The
  // first call on rows writes them (accumulate = false): no zeroing and -inf fill per pass.
  std::vector<RowRange> acc_ready_;
  // Rows [a, a + m): *fresh = none of them was written yet (then they count as written now);
  // otherwise the unwritten ones are initialised (O = 0, LSE = -inf) so that a call can merge.
  absl::Status PrepareAccRows(int64_t a, int64_t m, bool* fresh);
  absl::Status InitAccRows(const RowRange& local);
  PassStats stats_;
  StepStats* cur_ = nullptr;
};

absl::StatusOr<std::unique_ptr<Buffer>> PassRunner::NewBuffer(PlanTensor t, const RowRange& rows) {
  auto b = std::make_unique<Buffer>();
  b->tensor = t;
  b->rows = rows;
  b->layout = {rows};
  for (const Component& c : Components(t, shape_)) {
    const int64_t bytes = ComponentBytes(c, shape_, rows.size());
    ASSIGN_OR_RETURN(void* p, backend_->Alloc(static_cast<size_t>(bytes)));
    b->parts.push_back(std::make_unique<DeviceBuffer>(backend_, p));
    b->bytes += bytes;
  }
  return b;
}

Buffer* PassRunner::FindReceived(PlanTensor t, const RowRange& rows) {
  for (auto& b : received_) {
    if (b->tensor == t && b->rows.Contains(rows)) return b.get();
  }
  return nullptr;
}

// The partial of kind t for the buffer `rows`, created (and initialised) on first use.
absl::StatusOr<Buffer*> PassRunner::Partial(PlanTensor t, const RowRange& rows, int step) {
  for (auto& b : partials_) {
    if (b->tensor == t && b->rows == rows) return b.get();
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Buffer> b, NewBuffer(t, rows));
  std::vector<Component> comps = Components(t, shape_);
  for (size_t i = 0; i < comps.size(); ++i) {
    const size_t bytes = static_cast<size_t>(ComponentBytes(comps[i], shape_, rows.size()));
    if (comps[i].stat) {  // LSE of an empty partial: -inf
      std::vector<float> host(bytes / 4, -std::numeric_limits<float>::infinity());
      RETURN_IF_ERROR(backend_->Copy(b->parts[i]->get(), host.data(), bytes,
                                     AttentionBackend::CopyKind::kHostToDevice, stream_));
    } else {
      RETURN_IF_ERROR(backend_->Memset(b->parts[i]->get(), 0, bytes, stream_));
    }
  }
  b->free_after = std::numeric_limits<int>::max();  // until its (last) send completes
  b->rows_unsent = rows.size();
  (void)step;
  partials_.push_back(std::move(b));
  return partials_.back().get();
}

// Transfers of one step in the order both sides share: by peer, then canonical.
std::vector<Transfer> Sorted(const std::vector<Transfer>& list) {
  std::vector<Transfer> v = list;
  std::stable_sort(v.begin(), v.end(), [](const Transfer& a, const Transfer& b) {
    if (a.peer != b.peer) return a.peer < b.peer;
    return CanonicalTransferLess(a, b);
  });
  return v;
}

std::vector<std::pair<int, int>> PassRunner::GroupsPostedAt(int post) const {
  std::vector<std::pair<int, int>> out;
  for (int t = std::max(0, post + 1); t < static_cast<int>(leads_.size()); ++t) {
    if (leads_[t].count(t - 1 - post)) out.push_back({t, t - 1 - post});
  }
  return out;
}

// The transfers of `list` with the given lead.
std::vector<Transfer> WithLead(const std::vector<Transfer>& list, int lead) {
  std::vector<Transfer> out;
  for (const Transfer& x : list) {
    if (x.lead == lead) out.push_back(x);
  }
  return out;
}

absl::Status PassRunner::PrepareEarly(int t, int lead) {
  const PlanStep& step = pass()[t];
  Group& g = early_[t][lead];
  std::vector<TransportMessage>& sends = g.sends;
  std::vector<TransportMessage>& recvs = g.recvs;
  const std::vector<Transfer> rs = Sorted(WithLead(step.recvs, lead));
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
    if (x.tensor == PlanTensor::kKV && shape_.batch == 1) {
      while (j < rs.size() && rs[j].peer == x.peer && rs[j].tensor == x.tensor &&
             rs[j].rows.begin == all.end) {
        all.end = rs[j++].rows.end;
      }
    }
    ASSIGN_OR_RETURN(std::unique_ptr<Buffer> b, NewBuffer(x.tensor, all));
    const std::vector<Component> comps = Components(x.tensor, shape_);
    for (size_t u = i; u < j; ++u) {
      for (size_t c = 0; c < comps.size(); ++c) {
        const TensorView dst = ComponentView(b->parts[c]->get(), comps[c], shape_, all.size(),
                                             rs[u].rows.begin - all.begin, rs[u].rows.size());
        recvs.push_back({x.peer, dst.data,
                         static_cast<size_t>(ComponentBytes(comps[c], shape_, rs[u].rows.size()))});
      }
      b->free_after = std::max(b->free_after, LastUse(rs[u], t));
    }
    stats_.steps[t].bytes_received += b->bytes;
    received_.push_back(std::move(b));
    i = j;
  }
  for (const Transfer& x : Sorted(WithLead(step.sends, lead))) {
    if (IsPartial(x.tensor)) continue;
    std::vector<Component> comps = Components(x.tensor, shape_);
    // Source components: owned storage, or a buffer received earlier (forwarding).
    std::vector<TensorView> src;
    absl::StatusOr<int64_t> local = st_->LocalRow(x.rows);
    if (local.ok()) {
      std::vector<void*> bases;
      switch (x.tensor) {
        case PlanTensor::kQ: bases = {st_->q().data}; break;
        case PlanTensor::kKV: bases = {st_->k().data, st_->v().data}; break;
        case PlanTensor::kGradIn:
          bases = {st_->q().data, st_->dout().data, st_->lse().data, st_->delta().data};
          break;
        default: break;
      }
      for (size_t i = 0; i < comps.size(); ++i) {
        src.push_back(ComponentView(bases[i], comps[i], shape_, st_->rows(), *local, x.rows.size()));
      }
    } else {
      Buffer* b = FindReceived(x.tensor, x.rows);
      if (b == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "plan step ", t, ": worker ", rank_, " sends ", PlanTensorName(x.tensor), " ",
            Rows(x.rows), " which it neither owns nor has received"));
      }
      b->free_after = std::max(b->free_after, t);
      for (size_t i = 0; i < comps.size(); ++i) {
        src.push_back(ComponentView(b->parts[i]->get(), comps[i], shape_, b->rows.size(),
                                    x.rows.begin - b->rows.begin, x.rows.size()));
      }
    }
    for (size_t i = 0; i < comps.size(); ++i) {
      const size_t bytes = static_cast<size_t>(ComponentBytes(comps[i], shape_, x.rows.size()));
      void* data = src[i].data;
      if (!IsContiguous(src[i])) {  // pack into a dense staging buffer
        ASSIGN_OR_RETURN(void* p, backend_->Alloc(bytes));
        g.staging.push_back(std::make_unique<DeviceBuffer>(backend_, p));
        TensorView dst = src[i];
        dst.data = p;
        dst.row_stride = dst.batch_stride = 0;
        RETURN_IF_ERROR(Launch(&stats_.steps[t].other_launches, backend_->Convert(src[i], dst, stream_)));
        data = p;
      }
      sends.push_back({x.peer, data, bytes});
      stats_.steps[t].bytes_sent += static_cast<int64_t>(bytes);
    }
  }
  return absl::OkStatus();
}

absl::Status PassRunner::LaunchEarly(int t, int lead) {
  Group& g = early_[t][lead];
  if (g.sends.empty() && g.recvs.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(g.pending, transport_->Post(g.sends, g.recvs, stream_));
  return absl::OkStatus();
}

absl::Status PassRunner::PostLate(int t) {
  Group& g = late_[t];
  std::vector<TransportMessage> sends, recvs;
  for (const Transfer& x : Sorted(pass()[t].recvs)) {
    if (!IsPartial(x.tensor)) continue;
    ASSIGN_OR_RETURN(std::unique_ptr<Buffer> b, NewBuffer(x.tensor, x.rows));
    std::vector<Component> comps = Components(x.tensor, shape_);
    for (size_t i = 0; i < comps.size(); ++i) {
      recvs.push_back({x.peer, b->parts[i]->get(),
                       static_cast<size_t>(ComponentBytes(comps[i], shape_, x.rows.size()))});
    }
    stats_.steps[t].bytes_received += b->bytes;
    g.arrivals.push_back(std::move(b));
  }
  for (const Transfer& x : Sorted(pass()[t].sends)) {
    if (!IsPartial(x.tensor)) continue;
    Buffer* b = nullptr;
    for (auto& p : partials_) {
      if (p->tensor == x.tensor && p->rows.Contains(x.rows)) b = p.get();
    }
    std::vector<Component> comps = Components(x.tensor, shape_);
    // A partial of a coalesced K/V or grad_in buffer goes back in the plan's pieces: contiguous
    // rows of its (one-component-per-row) dK/dV or dQ parts, batch 1.
    const bool sliceable = shape_.batch == 1 && (x.tensor == PlanTensor::kDkvPartial ||
                                                 x.tensor == PlanTensor::kDqPartial);
    if (b == nullptr || (b->rows != x.rows && !sliceable)) {
      return absl::InvalidArgumentError(absl::StrCat("plan step ", t, ": worker ", rank_,
                                                     " sends partial ", Rows(x.rows),
                                                     " that no compute produced"));
    }
    b->rows_unsent -= x.rows.size();
    if (b->rows_unsent <= 0) b->free_after = t;
    for (size_t i = 0; i < comps.size(); ++i) {
      const size_t bytes = static_cast<size_t>(ComponentBytes(comps[i], shape_, x.rows.size()));
      const TensorView src = ComponentView(b->parts[i]->get(), comps[i], shape_, b->rows.size(),
                                           x.rows.begin - b->rows.begin, x.rows.size());
      sends.push_back({x.peer, src.data, bytes});
      stats_.steps[t].bytes_sent += static_cast<int64_t>(bytes);
    }
  }
  if (sends.empty() && recvs.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(g.pending, transport_->Post(sends, recvs, stream_));
  return absl::OkStatus();
}

absl::Status PassRunner::FinishLate(int t) {
  Group& g = late_[t];
  if (g.pending != nullptr) {
    absl::Status w = g.pending->Wait(stream_, opt_.step_timeout);
    if (!w.ok()) return absl::Status(w.code(), absl::StrCat("step ", t, " partials: ", w.message()));
  }
  for (const auto& a : g.arrivals) RETURN_IF_ERROR(Merge(*a));
  g = Group{};
  return absl::OkStatus();
}

// A partial received by its owner: merged (forward) or added (backward) into the accumulators.
absl::Status PassRunner::Merge(const Buffer& a) {
  ASSIGN_OR_RETURN(int64_t local, st_->LocalRow(a.rows));
  const int64_t n = a.rows.size(), total = st_->rows();
  std::vector<Component> comps = Components(a.tensor, shape_);
  auto part = [&](int i) { return ComponentView(a.parts[i]->get(), comps[i], shape_, n, 0, n); };
  StepStats& s = *cur_;
  switch (a.tensor) {
    case PlanTensor::kOutPartial: {
      bool fresh = false;
      RETURN_IF_ERROR(PrepareAccRows(local, n, &fresh));
      if (fresh) RETURN_IF_ERROR(InitAccRows({local, local + n}));
      MergeArgs m;
      m.out_a = out_view_.Slice(local, n);
      m.lse_a = st_->lse().Slice(local, n);
      m.out_b = part(0);
      m.lse_b = StatView(a.parts[1]->get(), shape_, n, 0, n);
      m.stream = stream_;
      return Launch(&s.merge_launches, backend_->Merge(m));
    }
    case PlanTensor::kDqPartial:
      return Launch(&s.other_launches, AddInto(*backend_, st_->dq().Slice(local, n), part(0), stream_));
    case PlanTensor::kDkvPartial:
      RETURN_IF_ERROR(Launch(&s.other_launches,
                             AddInto(*backend_, st_->dk().Slice(local, n), part(0), stream_)));
      return Launch(&s.other_launches, AddInto(*backend_, st_->dv().Slice(local, n), part(1), stream_));
    default:
      break;
  }
  (void)total;
  return absl::InvalidArgumentError("received a non-partial as a partial");
}

absl::StatusOr<PassRunner::Side> PassRunner::KvSide(const RowRange& rows, int t) {
  if (absl::StatusOr<int64_t> local = st_->LocalRow(rows); local.ok()) {
    return Side{{&st_->owned(), *local}, nullptr};
  }
  Buffer* b = FindReceived(PlanTensor::kKV, rows);
  if (b == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("plan step ", t, ": worker ", rank_,
                                                   " computes with kv ", Rows(rows),
                                                   " it neither owns nor has received"));
  }
  b->free_after = std::max(b->free_after, t);
  return Side{{&b->layout, rows.begin - b->rows.begin}, b};
}

absl::StatusOr<PassRunner::Side> PassRunner::QuerySide(const RowRange& rows, int t) {
  if (absl::StatusOr<int64_t> local = st_->LocalRow(rows); local.ok()) {
    return Side{{&st_->owned(), *local}, nullptr};
  }
  Buffer* b = FindReceived(fwd_ ? PlanTensor::kQ : PlanTensor::kGradIn, rows);
  if (b == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("plan step ", t, ": worker ", rank_,
                                                   " computes with q ", Rows(rows),
                                                   " it neither owns nor has received"));
  }
  b->free_after = std::max(b->free_after, t);
  return Side{{&b->layout, rows.begin - b->rows.begin}, b};
}

absl::Status PassRunner::ComputeStep(int t) {
  const std::vector<ComputeOp>& ops = pass()[t].computes;
  std::vector<Side> qs, kvs;
  std::vector<RowPlace> qp, kp;
  for (const ComputeOp& op : ops) {
    ASSIGN_OR_RETURN(Side q, QuerySide(op.q_rows, t));
    ASSIGN_OR_RETURN(Side kv, KvSide(op.kv_rows, t));
    qs.push_back(q);
    kvs.push_back(kv);
    qp.push_back(q.place);
    kp.push_back(kv.place);
  }
  // DFA_FUSE_OPS=0: one call per op, as the plan lists them (for measuring what fusion gains).
  static const bool fuse = [] {
    const char* v = std::getenv("DFA_FUSE_OPS");
    return v == nullptr || v[0] != '0';
  }();
  std::vector<FusedCall> calls;
  if (fuse) {
    calls = FuseStepOps(ops, qp, kp, plan_.mask());
  } else {
    for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
      calls.push_back(FuseStepOps({ops[i]}, {qp[i]}, {kp[i]}, plan_.mask())[0]);
      calls.back().ops = {i};
    }
  }
  for (const FusedCall& call : calls) {
    RETURN_IF_ERROR(Compute(call, qs[call.ops[0]], kvs[call.ops[0]], t));
  }
  return absl::OkStatus();
}

absl::Status PassRunner::Compute(const FusedCall& call, const Side& qside, const Side& kvside,
                                 int t) {
  const int64_t m = call.m, n = call.n;
  StepStats& s = stats_.steps[t];
  s.units += static_cast<int64_t>(call.ops.size());
  for (int i : call.ops) {
    const ComputeOp& op = pass()[t].computes[i];
    s.flops += (fwd_ ? 1.0 : 2.5) * ForwardFlops(shape_.batch, shape_.q_heads, shape_.head_dim,
                                                 op.q_rows.begin, op.q_rows.size(),
                                                 op.kv_rows.begin, op.kv_rows.size(), plan_.mask());
  }
  // Key/value side.
  TensorView k, v, dk, dv;
  if (Buffer* kvbuf = kvside.buffer; kvbuf == nullptr) {
    const int64_t local = call.kv.local;
    k = st_->k().Slice(local, n);
    v = st_->v().Slice(local, n);
    dk = st_->dk().Slice(local, n);
    dv = st_->dv().Slice(local, n);
  } else {
    const int64_t off = call.kv.local, tot = kvbuf->rows.size();
    const Component c = Components(PlanTensor::kKV, shape_)[0];
    k = ComponentView(kvbuf->parts[0]->get(), c, shape_, tot, off, n);
    v = ComponentView(kvbuf->parts[1]->get(), c, shape_, tot, off, n);
    if (!fwd_) {
      ASSIGN_OR_RETURN(Buffer * p, Partial(PlanTensor::kDkvPartial, kvbuf->rows, t));
      const Component c32 = Components(PlanTensor::kDkvPartial, shape_)[0];
      dk = ComponentView(p->parts[0]->get(), c32, shape_, tot, off, n);
      dv = ComponentView(p->parts[1]->get(), c32, shape_, tot, off, n);
    }
  }
  // Query side.
  Buffer* qbuf = qside.buffer;
  Buffer* qpart = nullptr;
  const int64_t qlocal = call.q.local;
  const int64_t qoff = call.q.local, qtot = qbuf != nullptr ? qbuf->rows.size() : 0;
  if (qbuf != nullptr) {
    ASSIGN_OR_RETURN(qpart, Partial(fwd_ ? PlanTensor::kOutPartial : PlanTensor::kDqPartial,
                                    qbuf->rows, t));
  }
  const PlanTensor q_kind = fwd_ ? PlanTensor::kQ : PlanTensor::kGradIn;
  const std::vector<Component> qc = Components(q_kind, shape_);
  const Component q32{DType::kF32, shape_.q_heads, false};
  if (fwd_) {
    ForwardArgs a;
    a.scale = scale_;
    a.mask = call.mask;
    a.q_row0 = call.q_row0;
    a.kv_row0 = call.kv_row0;
    a.k = k;
    a.v = v;
    a.accumulate = true;
    a.stream = stream_;
    if (qbuf == nullptr) {
      bool fresh = false;
      RETURN_IF_ERROR(PrepareAccRows(qlocal, m, &fresh));
      a.accumulate = !fresh;
      a.q = st_->q().Slice(qlocal, m);
      a.out = out_view_.Slice(qlocal, m);
      a.lse = st_->lse().Slice(qlocal, m);
    } else {
      a.q = ComponentView(qbuf->parts[0]->get(), qc[0], shape_, qtot, qoff, m);
      a.out = ComponentView(qpart->parts[0]->get(), q32, shape_, qtot, qoff, m);
      a.lse = StatView(qpart->parts[1]->get(), shape_, qtot, qoff, m);
    }
    return Launch(&s.forward_launches, backend_->Forward(a));
  }
  BackwardArgs a;
  a.scale = scale_;
  a.mask = call.mask;
  a.q_row0 = call.q_row0;
  a.kv_row0 = call.kv_row0;
  a.k = k;
  a.v = v;
  a.dk = dk;
  a.dv = dv;
  a.stream = stream_;
  if (qbuf == nullptr) {
    a.q = st_->q().Slice(qlocal, m);
    a.dout = st_->dout().Slice(qlocal, m);
    a.lse = st_->lse().Slice(qlocal, m);
    a.delta = st_->delta().Slice(qlocal, m);
    a.dq = st_->dq().Slice(qlocal, m);
    // The final O of the worker's own rows: backends whose backward forms D themselves (cudnn)
    // need it; the others ignore it. Helpers' rows carry D only (no O travels).
    a.out = st_->o().Slice(qlocal, m);
  } else {
    a.q = ComponentView(qbuf->parts[0]->get(), qc[0], shape_, qtot, qoff, m);
    a.dout = ComponentView(qbuf->parts[1]->get(), qc[1], shape_, qtot, qoff, m);
    a.lse = StatView(qbuf->parts[2]->get(), shape_, qtot, qoff, m);
    a.delta = StatView(qbuf->parts[3]->get(), shape_, qtot, qoff, m);
    a.dq = ComponentView(qpart->parts[0]->get(), q32, shape_, qtot, qoff, m);
  }
  return Launch(&s.backward_launches, backend_->Backward(a));
}

absl::Status PassRunner::PrepareAccRows(int64_t a, int64_t m, bool* fresh) {
  std::vector<RowRange> gaps;  // parts of [a, a + m) not written yet
  int64_t at = a;
  std::sort(acc_ready_.begin(), acc_ready_.end(),
            [](const RowRange& x, const RowRange& y) { return x.begin < y.begin; });
  for (const RowRange& r : acc_ready_) {
    if (r.end <= at || r.begin >= a + m) continue;
    if (r.begin > at) gaps.push_back({at, r.begin});
    at = std::max(at, r.end);
  }
  if (at < a + m) gaps.push_back({at, a + m});
  *fresh = gaps.size() == 1 && gaps[0].begin == a && gaps[0].end == a + m;
  if (!*fresh) {
    for (const RowRange& g : gaps) RETURN_IF_ERROR(InitAccRows(g));
  }
  for (const RowRange& g : gaps) acc_ready_.push_back(g);
  return absl::OkStatus();
}

bool PassRunner::SingleWriterForward() const {
  const std::vector<RowRange>& owned = st_->owned();
  std::vector<RowRange> written;
  for (const PlanStep& step : pass()) {
    for (const Transfer& x : step.recvs) {
      if (x.tensor == PlanTensor::kOutPartial) return false;
    }
    for (const ComputeOp& op : step.computes) {
      for (const RowRange& r : owned) {
        if (r.Contains(op.q_rows)) written.push_back(op.q_rows);
      }
    }
  }
  std::sort(written.begin(), written.end(),
            [](const RowRange& a, const RowRange& b) { return a.begin < b.begin; });
  int64_t covered = 0, total = 0;
  for (size_t i = 0; i < written.size(); ++i) {
    if (i > 0 && written[i].begin < written[i - 1].end) return false;  // a row written twice
    covered += written[i].size();
  }
  for (const RowRange& r : owned) total += r.size();
  return covered == total;
}

absl::Status PassRunner::InitAccRows(const RowRange& local) {
  const int64_t n = local.size();
  if (n <= 0) return absl::OkStatus();
  if (out_view_.dtype != DType::kF32) {  // single-writer forward: never merges, never fills
    return absl::InternalError(absl::StrCat("worker ", rank_, ": output rows [", local.begin, ", ",
                                            local.end, ") need a merge in a single-writer pass"));
  }
  StepStats unattributed;  // only outside the steps (none exist)
  StepStats& counts = cur_ != nullptr ? *cur_ : unattributed;
  const TensorView out = out_view_.Slice(local.begin, n);
  const int64_t row_bytes = int64_t{shape_.q_heads} * shape_.head_dim * 4;
  for (int b = 0; b < shape_.batch; ++b) {
    char* base = static_cast<char*>(out.data) + b * out.BatchStride() * 4;
    RETURN_IF_ERROR(Launch(&counts.other_launches,
                           backend_->Memset(base, 0, static_cast<size_t>(n * row_bytes), stream_)));
  }
  // LSE = -inf: staged through a dense device buffer, copied into the rows' strided slots.
  const int64_t count = int64_t{shape_.batch} * shape_.q_heads * n;
  std::vector<float> ninf(static_cast<size_t>(count), -std::numeric_limits<float>::infinity());
  ASSIGN_OR_RETURN(void* p, backend_->Alloc(static_cast<size_t>(count) * 4));
  DeviceBuffer staging(backend_, p);
  RETURN_IF_ERROR(backend_->Copy(p, ninf.data(), ninf.size() * 4,
                                 AttentionBackend::CopyKind::kHostToDevice, stream_));
  const Component stat{DType::kF32, shape_.q_heads, true};
  const TensorView src = ComponentView(p, stat, shape_, n, 0, n);
  const TensorView dst = ComponentView(st_->lse().data, stat, shape_, st_->rows(), local.begin, n);
  return Launch(&counts.other_launches, backend_->Convert(src, dst, stream_));
}

int PassRunner::LastUse(const Transfer& recv, int t) const {
  const bool q_side = recv.tensor != PlanTensor::kKV;
  int last = t;
  for (int u = t; u < static_cast<int>(pass().size()); ++u) {
    for (const ComputeOp& c : pass()[u].computes) {
      if (recv.rows.Contains(q_side ? c.q_rows : c.kv_rows)) last = u;
    }
    for (const Transfer& x : pass()[u].sends) {
      if (u > t && x.tensor == recv.tensor && recv.rows.Contains(x.rows)) last = u;
    }
  }
  return last;
}

int64_t PassRunner::LiveBytes() const {
  int64_t live = 0;
  for (const auto& b : received_) live += b->bytes;
  for (const auto& b : partials_) live += b->bytes;
  return live;
}

absl::StatusOr<PassStats> PassRunner::Run() {
  rank_ = transport_->rank();
  if (plan_.num_workers() != transport_->size()) {
    return absl::InvalidArgumentError(absl::StrCat("plan has ", plan_.num_workers(),
                                                   " workers, the transport ", transport_->size()));
  }
  if (rank_ < 0 || rank_ >= plan_.num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank_, " outside the plan"));
  }
  if (plan_.workers[rank_].owned != st_->owned()) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", rank_,
                                                   ": the session's owned rows differ from the plan's"));
  }
  // A head-split worker (plan.h "Head groups") runs at its local heads: its storage must hold
  // exactly its range's kv heads (buffers and messages are sized from the storage's shape).
  const HeadRange& heads = plan_.workers[rank_].kv_heads;
  if (!heads.empty() && heads.size() != shape_.kv_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", rank_, ": the plan's kv_heads [", heads.begin, ", ", heads.end, ") are ",
        heads.size(), " heads, the session's storage holds ", shape_.kv_heads));
  }
  scale_ = opt_.softmax_scale > 0 ? opt_.softmax_scale
                                  : 1.0f / std::sqrt(static_cast<float>(shape_.head_dim));
  stream_ = opt_.compute_stream;
  transport_->ClearReadyMark();  // nothing an earlier (failed) pass marked applies to this one
  const int T = static_cast<int>(pass().size());
  stats_.steps.assign(T, StepStats{});
  early_.clear();
  early_.resize(T);
  leads_.assign(T, {});
  for (int t = 0; t < T; ++t) {
    for (const auto* list : {&pass()[t].sends, &pass()[t].recvs}) {
      for (const Transfer& x : *list) {
        if (IsPartial(x.tensor)) continue;
        if (x.lead < 0 || x.lead > t) {
          return absl::InvalidArgumentError(absl::StrCat("plan step ", t, ": worker ", rank_,
                                                         ": transfer lead ", x.lead,
                                                         " outside [0, ", t, "]"));
        }
        leads_[t].insert(x.lead);
      }
    }
  }
  late_.resize(T);
  const int64_t rows = st_->rows();
  // Accumulators.
  if (fwd_) {
    out_view_ = st_->o();
    static const bool single_writer = [] {  // DFA_DIRECT_OUT=0: always the fp32 accumulator
      const char* v = std::getenv("DFA_DIRECT_OUT");
      return v == nullptr || v[0] != '0';
    }();
    if (shape_.dtype != DType::kF32 && !(single_writer && SingleWriterForward())) {
      const int64_t bytes = int64_t{shape_.batch} * rows * shape_.q_heads * shape_.head_dim * 4;
      ASSIGN_OR_RETURN(void* p, backend_->Alloc(static_cast<size_t>(bytes)));
      out_acc_ = std::make_unique<DeviceBuffer>(backend_, p);
      out_view_.data = p;
      out_view_.dtype = DType::kF32;
    }
    acc_ready_.clear();
  } else {
    for (TensorView g : {st_->dq(), st_->dk(), st_->dv()}) {
      RETURN_IF_ERROR(backend_->Memset(
          g.data, 0, static_cast<size_t>(int64_t{g.batch} * g.rows * g.heads * g.head_dim * 4),
          stream_));
    }
    // D = rowsum(dO * O) of the owned rows, before any grad_in leaves this worker.
    if (T > 0) ++stats_.steps[0].delta_launches;
    RETURN_IF_ERROR(backend_->ComputeDelta(st_->dout(), st_->o(), st_->delta(), stream_));
  }
  if (T > 0) {
    for (const auto& [u, lead] : GroupsPostedAt(-1)) {  // step 0's, and steps u's with lead u
      RETURN_IF_ERROR(PrepareEarly(u, lead));
      RETURN_IF_ERROR(LaunchEarly(u, lead));
    }
    RETURN_IF_ERROR(PostLate(0));
  }
  for (int t = 0; t < T; ++t) {
    StepStats& s = stats_.steps[t];
    cur_ = &s;
    if (opt_.cancel != nullptr && opt_.cancel->load()) {
      transport_->Abort();
      return absl::CancelledError(absl::StrCat("cancelled before step ", t));
    }
    double t0 = Now();
    for (auto& [lead, g] : early_[t]) {
      if (g.pending == nullptr) continue;
      absl::Status w = g.pending->Wait(stream_, opt_.step_timeout);
      if (!w.ok()) return absl::Status(w.code(), absl::StrCat("step ", t, ": ", w.message()));
    }
    early_[t].clear();
    // Step t-1's partials were posted after step t-2's computes and travelled during step
    // t-1's: waited for and merged only now (see the header).
    if (t >= 1) RETURN_IF_ERROR(FinishLate(t - 1));
    double t1 = Now();
    s.idle_seconds = t1 - t0;
    // Step t+1's early group travels during step t's computes. A GPU transport takes a mark
    // of what its sends wait for (the packing just queued), so the computes are queued first
    // and the group's host-side launch (~0.1-0.4 ms for NCCL) no longer delays them.
    // Transfers with a lead (plan.h) for later steps are posted here too, in step order.
    const std::vector<std::pair<int, int>> posted = GroupsPostedAt(t);
    bool launch_after = false;
    if (!posted.empty()) {
      bool any = false;
      for (const auto& [u, lead] : posted) {
        RETURN_IF_ERROR(PrepareEarly(u, lead));
        const Group& g = early_[u][lead];
        any = any || !g.sends.empty() || !g.recvs.empty();
      }
      launch_after = any && transport_->MarkReady(stream_);
      if (!launch_after) {
        for (const auto& [u, lead] : posted) RETURN_IF_ERROR(LaunchEarly(u, lead));
      }
    }
    stats_.peak_scratch_bytes = std::max(stats_.peak_scratch_bytes, LiveBytes());
    RETURN_IF_ERROR(ComputeStep(t));
    if (launch_after) {
      for (const auto& [u, lead] : posted) RETURN_IF_ERROR(LaunchEarly(u, lead));
      transport_->ClearReadyMark();
    }
    stats_.peak_scratch_bytes = std::max(stats_.peak_scratch_bytes, LiveBytes());
    if (t + 1 < T) RETURN_IF_ERROR(PostLate(t + 1));
    s.busy_seconds = Now() - t1;
    // Release what this step was the last to use (sends of step t completed in the Wait above).
    auto expired = [t](const std::unique_ptr<Buffer>& b) { return b->free_after <= t; };
    received_.erase(std::remove_if(received_.begin(), received_.end(), expired), received_.end());
    partials_.erase(std::remove_if(partials_.begin(), partials_.end(),
                                   [t](const std::unique_ptr<Buffer>& b) {
                                     return b->free_after < t;
                                   }),
                    partials_.end());
  }
  if (T > 0) {
    const double t0 = Now();
    RETURN_IF_ERROR(FinishLate(T - 1));
    stats_.steps[T - 1].idle_seconds += Now() - t0;
  }
  if (fwd_) {  // rows no call wrote (no plan leaves any): an empty output, LSE -inf
    bool fresh = false;
    RETURN_IF_ERROR(PrepareAccRows(0, rows, &fresh));
    if (fresh) RETURN_IF_ERROR(InitAccRows({0, rows}));
  }
  if (fwd_ && out_acc_ != nullptr) {
    RETURN_IF_ERROR(backend_->Convert(out_view_, st_->o(), stream_));
  }
  // GPU transports: a failure after the last Wait() surfaces here (issue 6, NcclTransport).
  RETURN_IF_ERROR(transport_->Finish(opt_.step_timeout));
  RETURN_IF_ERROR(backend_->Synchronize(stream_));
  for (const StepStats& s : stats_.steps) {
    stats_.busy_seconds += s.busy_seconds;
    stats_.idle_seconds += s.idle_seconds;
    stats_.bytes_sent += s.bytes_sent;
    stats_.bytes_received += s.bytes_received;
    stats_.flops += s.flops;
  }
  return stats_;
}

}  // namespace

PlanExecutor::PlanExecutor(AttentionBackend* backend, Transport* transport,
                           SessionStorage* storage, ExecutorOptions options)
    : backend_(backend), transport_(transport), storage_(storage), options_(options) {}

absl::StatusOr<PassStats> PlanExecutor::RunForward(const Plan& plan) {
  PassRunner runner(backend_, transport_, storage_, options_, plan, true);
  return runner.Run();
}

absl::StatusOr<PassStats> PlanExecutor::RunBackward(const Plan& plan) {
  PassRunner runner(backend_, transport_, storage_, options_, plan, false);
  return runner.Run();
}

}  // namespace dfa
