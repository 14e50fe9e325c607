#include "worker/executor/step_compute.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/executor/transfer_layout.h"

namespace dfa::executor_internal {

absl::Status StepCompute::Merge(const Buffer& a) {
  SessionStorage* st = ctx_.storage;
  const AttentionShape& shape = ctx_.shape;
  ASSIGN_OR_RETURN(int64_t local, st->LocalRow(a.rows));
  const int64_t n = a.rows.size();
  std::vector<Component> comps = Components(a.tensor, shape);
  auto part = [&](int i) { return ComponentView(a.parts[i]->get(), comps[i], shape, n, 0, n); };
  StepStats& s = *ctx_.cur;
  switch (a.tensor) {
    case PlanTensor::kOutPartial: {
      bool fresh = false;
      RETURN_IF_ERROR(acc_.PrepareRows(local, n, &fresh));
      if (fresh) RETURN_IF_ERROR(acc_.InitRows({local, local + n}));
      MergeArgs m;
      m.out_a = acc_.out().Slice(local, n);
      m.lse_a = st->lse().Slice(local, n);
      m.out_b = part(0);
      m.lse_b = StatView(a.parts[1]->get(), shape, n, 0, n);
      m.stream = ctx_.stream;
      return Launch(&s.merge_launches, ctx_.backend->Merge(m));
    }
    case PlanTensor::kDqPartial:
      RETURN_IF_ERROR(acc_.PrepareQueries({local, local + n}));
      return Launch(&s.other_launches,
                    AddInto(*ctx_.backend, st->dq_acc().Slice(local, n), part(0), ctx_.stream));
    case PlanTensor::kDkvPartial:
      if (st->dk_acc().data == nullptr) {
        return absl::InternalError("a dK/dV partial arrived in a chunked backward");
      }
      RETURN_IF_ERROR(Launch(&s.other_launches, AddInto(*ctx_.backend,
                                                        st->dk_acc().Slice(local, n), part(0),
                                                        ctx_.stream)));
      return Launch(&s.other_launches,
                    AddInto(*ctx_.backend, st->dv_acc().Slice(local, n), part(1), ctx_.stream));
    default:
      break;
  }
  return absl::InvalidArgumentError("received a non-partial as a partial");
}

absl::StatusOr<StepCompute::Side> StepCompute::KvSide(const RowRange& rows, int t) {
  SessionStorage* st = ctx_.storage;
  if (absl::StatusOr<int64_t> local = st->LocalRow(rows); local.ok()) {
    return Side{{&st->owned(), *local}, nullptr};
  }
  Buffer* b = buffers_.FindReceived(PlanTensor::kKV, rows);
  if (b == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("plan step ", t, ": worker ", ctx_.rank,
                                                   " computes with kv ", Rows(rows),
                                                   " it neither owns nor has received"));
  }
  b->free_after = std::max(b->free_after, t);
  return Side{{&b->layout, rows.begin - b->rows.begin}, b};
}

absl::StatusOr<StepCompute::Side> StepCompute::QuerySide(const RowRange& rows, int t) {
  SessionStorage* st = ctx_.storage;
  if (absl::StatusOr<int64_t> local = st->LocalRow(rows); local.ok()) {
    return Side{{&st->owned(), *local}, nullptr};
  }
  Buffer* b = buffers_.FindReceived(ctx_.fwd ? PlanTensor::kQ : PlanTensor::kGradIn, rows);
  if (b == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("plan step ", t, ": worker ", ctx_.rank,
                                                   " computes with q ", Rows(rows),
                                                   " it neither owns nor has received"));
  }
  b->free_after = std::max(b->free_after, t);
  return Side{{&b->layout, rows.begin - b->rows.begin}, b};
}

const UnitPairs* StepCompute::MaskedPairs() {
  if (ctx_.plan.mask() != MaskKind::kIntervals) return nullptr;
  if (pairs_ == nullptr) pairs_ = std::make_unique<UnitPairs>(ctx_.plan);
  return pairs_.get();
}

namespace {

// Query blocks of a streamed call (StreamInBlocks): this many, of at least kMinStreamBlock rows.
constexpr int64_t kStreamBlocks = 4;
constexpr int64_t kMinStreamBlock = 128;

// The global range of local rows [local, local + n) when they are one contiguous global range.
std::optional<RowRange> GlobalRange(const SessionStorage& st, int64_t local, int64_t n) {
  int64_t at = 0;
  for (const RowRange& r : st.owned()) {
    if (local >= at && local < at + r.size()) {
      if (local + n > at + r.size()) return std::nullopt;
      return RowRange{r.begin + (local - at), r.begin + (local - at) + n};
    }
    at += r.size();
  }
  return std::nullopt;
}

}  // namespace

bool StepCompute::StreamInBlocks(const FusedCall& call, const Side& q, const Side& kv) const {
  if (ctx_.options.inputs == nullptr || !ctx_.fwd || q.buffer != nullptr || kv.buffer != nullptr ||
      call.mask != MaskKind::kCausal || call.m < 2 * kMinStreamBlock ||
      call.kv_row0 > call.q_row0) {
    return false;
  }
  const std::optional<RowRange> qg = GlobalRange(*ctx_.storage, call.q.local, call.m);
  const std::optional<RowRange> kg = GlobalRange(*ctx_.storage, call.kv.local, call.n);
  return qg && kg && qg->begin == call.q_row0 && kg->begin == call.kv_row0;
}

absl::Status StepCompute::WaitForInputs(const FusedCall& call, const std::vector<ComputeOp>& ops,
                                         const std::vector<Side>& qs,
                                         const std::vector<Side>& kvs) {
  if (ctx_.options.inputs == nullptr) return absl::OkStatus();
  if (StreamInBlocks(call, qs[static_cast<size_t>(call.ops[0])],
                     kvs[static_cast<size_t>(call.ops[0])])) {
    return absl::OkStatus();  // Compute waits block by block
  }
  for (int i : call.ops) {
    const ComputeOp& op = ops[static_cast<size_t>(i)];
    if (qs[static_cast<size_t>(i)].buffer == nullptr) {
      RETURN_IF_ERROR(ctx_.WaitInput(InputTensor::kQ, op.q_rows));
    }
    if (kvs[static_cast<size_t>(i)].buffer == nullptr) {
      RETURN_IF_ERROR(ctx_.WaitInput(InputTensor::kK, op.kv_rows));
      RETURN_IF_ERROR(ctx_.WaitInput(InputTensor::kV, op.kv_rows));
    }
  }
  return absl::OkStatus();
}

absl::Status StepCompute::RunStep(int t) {
  const std::vector<ComputeOp>& ops = ctx_.steps()[t].computes;
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
  const std::vector<FusedCall> calls = FuseStepOps(ops, qp, kp, ctx_.plan.mask(), MaskedPairs());
  if (ctx_.fwd || !acc_.chunked()) {
    for (const FusedCall& call : calls) {
      if (ctx_.fwd) RETURN_IF_ERROR(WaitForInputs(call, ops, qs, kvs));
      RETURN_IF_ERROR(Compute(call, qs[call.ops[0]], kvs[call.ops[0]], t, {}));
    }
    return absl::OkStatus();
  }
  // Chunked backward (pass_accumulators.h): calls on received keys as they come; calls on owned
  // keys key chunk by key chunk, each chunk converted into K's and V's slots once every call of
  // the step has run on it (ChunkedBackward: no other step computes on owned keys).
  const int64_t R = acc_.chunk_rows();
  std::vector<int64_t> first(calls.size(), 0), last(calls.size(), -1);
  int64_t lo = acc_.num_chunks(), hi = -1;
  for (size_t i = 0; i < calls.size(); ++i) {
    const FusedCall& call = calls[i];
    if (kvs[call.ops[0]].buffer != nullptr) {
      RETURN_IF_ERROR(Compute(call, qs[call.ops[0]], kvs[call.ops[0]], t, {}));
      continue;
    }
    if (call.n <= 0) continue;
    first[i] = call.kv.local / R;
    last[i] = (call.kv.local + call.n - 1) / R;
    lo = std::min(lo, first[i]);
    hi = std::max(hi, last[i]);
  }
  for (int64_t c = lo; c <= hi; ++c) {
    for (size_t i = 0; i < calls.size(); ++i) {
      if (c < first[i] || c > last[i]) continue;
      const FusedCall& call = calls[i];
      const int64_t b = std::max(call.kv.local, c * R);
      const int64_t e = std::min(call.kv.local + call.n, (c + 1) * R);
      RETURN_IF_ERROR(Compute(call, qs[call.ops[0]], kvs[call.ops[0]], t,
                              KeyPiece{b - call.kv.local, e - b, c, c == first[i]}));
    }
    RETURN_IF_ERROR(acc_.FinishChunk(c));
  }
  return absl::OkStatus();
}

absl::Status StepCompute::Compute(const FusedCall& call, const Side& qside, const Side& kvside,
                                  int t, const KeyPiece& piece) {
  SessionStorage* st = ctx_.storage;
  const AttentionShape& shape = ctx_.shape;
  const bool fwd = ctx_.fwd;
  const int64_t m = call.m, n = call.n;
  StepStats& s = ctx_.stats.steps[t];
  if (piece.n >= 0 && !piece.first) return ComputePiece(call, qside, t, piece);
  s.units += static_cast<int64_t>(call.ops.size());
  const UnitPairs* masked = MaskedPairs();
  for (int i : call.ops) {
    const ComputeOp& op = ctx_.steps()[t].computes[i];
    // 4·B·Hq·D FLOPs per visible pair (a masked plan: pairs under its documents and window).
    s.flops += (fwd ? 1.0 : 2.5) *
               (masked != nullptr
                    ? 4.0 * shape.batch * shape.q_heads * shape.head_dim *
                          (*masked)(op.q_rows, op.kv_rows)
                    : ForwardFlops(shape.batch, shape.q_heads, shape.head_dim, op.q_rows.begin,
                                   op.q_rows.size(), op.kv_rows.begin, op.kv_rows.size(),
                                   ctx_.plan.mask()));
  }
  // A call whose rows see none of its keys (masked plans) costs nothing: its partials (made
  // below, sent as the plan says) stay empty, its owned rows are finished as empty rows.
  const bool empty =
      masked != nullptr && call.mask == MaskKind::kIntervals &&
      (*masked)({call.q_row0, call.q_row0 + m}, {call.kv_row0, call.kv_row0 + n}) <= 0;
  if (piece.n >= 0) return ComputePiece(call, qside, t, piece);
  // Key/value side.
  TensorView k, v, dk, dv;
  if (Buffer* kvbuf = kvside.buffer; kvbuf == nullptr) {
    const int64_t local = call.kv.local;
    k = st->k().Slice(local, n);
    v = st->v().Slice(local, n);
    dk = st->dk_acc().Slice(local, n);
    dv = st->dv_acc().Slice(local, n);
  } else {
    const int64_t off = call.kv.local, tot = kvbuf->rows.size();
    const Component c = Components(PlanTensor::kKV, shape)[0];
    k = ComponentView(kvbuf->parts[0]->get(), c, shape, tot, off, n);
    v = ComponentView(kvbuf->parts[1]->get(), c, shape, tot, off, n);
    if (!fwd) {
      ASSIGN_OR_RETURN(Buffer * p, buffers_.Partial(PlanTensor::kDkvPartial, kvbuf->rows));
      const Component c32 = Components(PlanTensor::kDkvPartial, shape)[0];
      dk = ComponentView(p->parts[0]->get(), c32, shape, tot, off, n);
      dv = ComponentView(p->parts[1]->get(), c32, shape, tot, off, n);
    }
  }
  // Query side.
  Buffer* qbuf = qside.buffer;
  Buffer* qpart = nullptr;
  const int64_t qlocal = call.q.local;
  const int64_t qoff = call.q.local, qtot = qbuf != nullptr ? qbuf->rows.size() : 0;
  if (qbuf != nullptr) {
    ASSIGN_OR_RETURN(qpart, buffers_.Partial(fwd ? PlanTensor::kOutPartial : PlanTensor::kDqPartial,
                                             qbuf->rows));
  }
  const PlanTensor q_kind = fwd ? PlanTensor::kQ : PlanTensor::kGradIn;
  const std::vector<Component> qc = Components(q_kind, shape);
  const Component q32{DType::kF32, shape.q_heads, false};
  if (empty) return absl::OkStatus();
  if (fwd) {
    ForwardArgs a;
    a.scale = ctx_.scale;
    a.mask = call.mask;
    a.intervals = ctx_.options.mask_intervals;
    a.q_row0 = call.q_row0;
    a.kv_row0 = call.kv_row0;
    a.k = k;
    a.v = v;
    a.accumulate = true;
    a.stream = ctx_.stream;
    if (qbuf == nullptr) {
      // Streamed inputs: query blocks, each with the keys up to its last query (causal: the
      // rest are masked for all of its rows), once those rows have arrived (StreamInBlocks).
      const bool blocks = StreamInBlocks(call, qside, kvside);
      const int64_t block =
          blocks ? std::max(kMinStreamBlock, (m + kStreamBlocks - 1) / kStreamBlocks) : m;
      for (int64_t off = 0; off < m; off += block) {
        const int64_t len = std::min(block, m - off);
        const int64_t nk = blocks ? std::min(n, call.q_row0 + off + len - call.kv_row0) : n;
        if (blocks) {
          RETURN_IF_ERROR(ctx_.WaitInput(InputTensor::kK, {call.kv_row0, call.kv_row0 + nk}));
          RETURN_IF_ERROR(ctx_.WaitInput(InputTensor::kV, {call.kv_row0, call.kv_row0 + nk}));
          RETURN_IF_ERROR(ctx_.WaitInput(InputTensor::kQ,
                                         {call.q_row0 + off, call.q_row0 + off + len}));
        }
        ForwardArgs b = a;
        bool fresh = false;
        RETURN_IF_ERROR(acc_.PrepareRows(qlocal + off, len, &fresh));
        b.accumulate = !fresh;
        b.q = st->q().Slice(qlocal + off, len);
        b.q_row0 = call.q_row0 + off;
        b.k = k.Slice(0, nk);
        b.v = v.Slice(0, nk);
        b.out = acc_.out().Slice(qlocal + off, len);
        b.lse = st->lse().Slice(qlocal + off, len);
        RETURN_IF_ERROR(Launch(&s.forward_launches, ctx_.backend->Forward(b)));
      }
      return absl::OkStatus();
    } else {
      a.q = ComponentView(qbuf->parts[0]->get(), qc[0], shape, qtot, qoff, m);
      a.out = ComponentView(qpart->parts[0]->get(), q32, shape, qtot, qoff, m);
      a.lse = StatView(qpart->parts[1]->get(), shape, qtot, qoff, m);
    }
    return Launch(&s.forward_launches, ctx_.backend->Forward(a));
  }
  BackwardArgs a;
  a.scale = ctx_.scale;
  a.mask = call.mask;
  a.intervals = ctx_.options.mask_intervals;
  a.q_row0 = call.q_row0;
  a.kv_row0 = call.kv_row0;
  a.k = k;
  a.v = v;
  a.dk = dk;
  a.dv = dv;
  a.stream = ctx_.stream;
  if (qbuf == nullptr) {
    RETURN_IF_ERROR(acc_.PrepareQueries({qlocal, qlocal + m}));
    a.q = st->q().Slice(qlocal, m);
    a.dout = st->dout().Slice(qlocal, m);
    a.lse = st->lse().Slice(qlocal, m);
    a.delta = st->delta().Slice(qlocal, m);
    a.dq = st->dq_acc().Slice(qlocal, m);
    // No final O: dQ's fp32 accumulator overwrote it once D was formed (session_storage.h).
    // Backends whose backward forms D themselves (cudnn) build a stand-in O from D, as they do
    // for helpers' rows (no O travels).
  } else {
    a.q = ComponentView(qbuf->parts[0]->get(), qc[0], shape, qtot, qoff, m);
    a.dout = ComponentView(qbuf->parts[1]->get(), qc[1], shape, qtot, qoff, m);
    a.lse = StatView(qbuf->parts[2]->get(), shape, qtot, qoff, m);
    a.delta = StatView(qbuf->parts[3]->get(), shape, qtot, qoff, m);
    a.dq = ComponentView(qpart->parts[0]->get(), q32, shape, qtot, qoff, m);
  }
  return Launch(&s.backward_launches, ctx_.backend->Backward(a));
}


absl::Status StepCompute::ComputePiece(const FusedCall& call, const Side& qside, int t,
                                       const KeyPiece& piece) {
  SessionStorage* st = ctx_.storage;
  const AttentionShape& shape = ctx_.shape;
  StepStats& s = ctx_.stats.steps[t];
  const int64_t kl = call.kv.local + piece.off;
  BackwardArgs a;
  a.scale = ctx_.scale;
  a.mask = call.mask;
  a.intervals = ctx_.options.mask_intervals;
  a.kv_row0 = call.kv_row0 + piece.off;
  a.k = st->k().Slice(kl, piece.n);
  a.v = st->v().Slice(kl, piece.n);
  RETURN_IF_ERROR(acc_.ChunkViews(piece.chunk, kl, piece.n, &a.dk, &a.dv));
  a.stream = ctx_.stream;
  // Query rows: a causal piece skips the rows before its first key (they see none of it).
  int64_t skip = 0;
  if (call.mask == MaskKind::kCausal) {
    skip = std::clamp<int64_t>(a.kv_row0 - call.q_row0, 0, call.m);
  }
  const int64_t m = call.m - skip;
  Buffer* qbuf = qside.buffer;
  // A received query block's dQ partial exists once any of its calls ran (the plan sends it),
  // also when this piece sees none of its rows.
  Buffer* qpart = nullptr;
  if (qbuf != nullptr) {
    ASSIGN_OR_RETURN(qpart, buffers_.Partial(PlanTensor::kDqPartial, qbuf->rows));
  }
  if (m <= 0 || piece.n <= 0) return absl::OkStatus();
  a.q_row0 = call.q_row0 + skip;
  if (qbuf == nullptr) {
    const int64_t ql = call.q.local + skip;
    RETURN_IF_ERROR(acc_.PrepareQueries({ql, ql + m}));
    a.q = st->q().Slice(ql, m);
    a.dout = st->dout().Slice(ql, m);
    a.lse = st->lse().Slice(ql, m);
    a.delta = st->delta().Slice(ql, m);
    a.dq = st->dq_acc().Slice(ql, m);
  } else {
    const std::vector<Component> qc = Components(PlanTensor::kGradIn, shape);
    const Component q32{DType::kF32, shape.q_heads, false};
    const int64_t qoff = call.q.local + skip, qtot = qbuf->rows.size();
    a.q = ComponentView(qbuf->parts[0]->get(), qc[0], shape, qtot, qoff, m);
    a.dout = ComponentView(qbuf->parts[1]->get(), qc[1], shape, qtot, qoff, m);
    a.lse = StatView(qbuf->parts[2]->get(), shape, qtot, qoff, m);
    a.delta = StatView(qbuf->parts[3]->get(), shape, qtot, qoff, m);
    a.dq = ComponentView(qpart->parts[0]->get(), q32, shape, qtot, qoff, m);
  }
  return Launch(&s.backward_launches, ctx_.backend->Backward(a));
}

}  // namespace dfa::executor_internal
