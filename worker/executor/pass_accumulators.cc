#include "worker/executor/pass_accumulators.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "worker/executor/output_finality.h"
#include "worker/executor/transfer_layout.h"

namespace dfa::executor_internal {

absl::Status PassAccumulators::Begin() {
  SessionStorage* st = ctx_.storage;
  const AttentionShape& shape = ctx_.shape;
  if (ctx_.fwd) {
    out_view_ = st->o();
    if (shape.dtype != DType::kF32 && !SingleWriterForward(ctx_.plan, ctx_.rank)) {
      out_view_ = st->o_acc();
      if (out_view_.data == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(
            "worker ", ctx_.rank, ": the forward merges partials but the session storage has no "
            "fp32 output accumulator (its layout was made for another plan)"));
      }
    }
    acc_ready_.clear();
    final_queries_.clear();
    return absl::OkStatus();
  }
  final_queries_.clear();
  final_keys_.clear();
  chunked_ = !st->layout().kv_accumulators;
  if (chunked_ && !ChunkedBackward(ctx_.plan, ctx_.rank)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", ctx_.rank, ": the backward needs fp32 dK, dV of all owned rows but the session "
        "storage has key chunks only (its layout was made for another plan)"));
  }
  // D = rowsum(dO * O) of the owned rows, before any grad_in leaves this worker and before dQ's
  // accumulator (over O in the work region) is zeroed. With dO still arriving, row range by
  // row range as units and sends need them (PrepareQueries).
  auto zero = [&](const TensorView& g) {
    return ctx_.backend->Memset(
        g.data, 0, static_cast<size_t>(int64_t{g.batch} * g.rows * g.heads * g.head_dim * 4),
        ctx_.stream);
  };
  lazy_queries_ = ctx_.options.inputs != nullptr;
  if (lazy_queries_) {
    const size_t linear = static_cast<size_t>(int64_t{shape.batch} * st->rows());
    delta_ready_.assign(linear, 0);
    dq_zeroed_.assign(linear, 0);
    overlay_ = std::max<int64_t>(1, 4 / DTypeSize(shape.dtype));
  } else {
    if (!ctx_.stats.steps.empty()) ++ctx_.stats.steps[0].delta_launches;
    RETURN_IF_ERROR(ctx_.backend->ComputeDelta(st->dout(), st->o(), st->delta(), ctx_.stream));
    RETURN_IF_ERROR(zero(st->dq_acc()));
  }
  if (!chunked_) {
    RETURN_IF_ERROR(zero(st->dk_acc()));
    return zero(st->dv_acc());
  }
  if (ctx_.options.step_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("step_tokens: must be >= 1, got ", ctx_.options.step_tokens));
  }
  chunk_rows_ = std::min(st->rows(), ctx_.options.step_tokens);
  chunk_done_.assign(static_cast<size_t>((st->rows() + chunk_rows_ - 1) / chunk_rows_), false);
  live_chunk_ = -1;
  const int64_t bytes = KeyChunkBytes(shape, chunk_rows_) / 2;
  ASSIGN_OR_RETURN(void* pk, ctx_.backend->Alloc(static_cast<size_t>(bytes)));
  chunk_dk_ = std::make_unique<DeviceBuffer>(ctx_.backend, pk);
  ASSIGN_OR_RETURN(void* pv, ctx_.backend->Alloc(static_cast<size_t>(bytes)));
  chunk_dv_ = std::make_unique<DeviceBuffer>(ctx_.backend, pv);
  return absl::OkStatus();
}

namespace {

// Rows [off, off + n) of a dense fp32 [B, total, heads, D] buffer.
TensorView ChunkView(void* p, const AttentionShape& shape, int64_t total, int64_t off, int64_t n) {
  TensorView v;
  v.data = p;
  v.dtype = DType::kF32;
  v.batch = shape.batch;
  v.rows = total;
  v.heads = shape.kv_heads;
  v.head_dim = shape.head_dim;
  return v.Slice(off, n);
}

// The parts of [0, total) outside `done` (disjoint ranges, any order), ascending.
std::vector<RowRange> Remaining(int64_t total, std::vector<RowRange> done) {
  std::sort(done.begin(), done.end(),
            [](const RowRange& x, const RowRange& y) { return x.begin < y.begin; });
  std::vector<RowRange> out;
  int64_t at = 0;
  for (const RowRange& r : done) {
    if (r.begin > at) out.push_back({at, r.begin});
    at = std::max(at, r.end);
  }
  if (at < total) out.push_back({at, total});
  return out;
}

}  // namespace

namespace {

// Batch b of a view, as a view of one batch.
TensorView BatchOf(TensorView v, int b) {
  v.data = static_cast<char*>(v.data) + b * v.BatchStride() * DTypeSize(v.dtype);
  v.batch = 1;
  return v;
}
RowStatView BatchOf(RowStatView v, int b) {
  v.data += b * v.BatchStride();
  v.batch = 1;
  return v;
}

}  // namespace

absl::Status PassAccumulators::EnsureDelta(int64_t first, int64_t end) {
  SessionStorage* st = ctx_.storage;
  const int64_t rows = st->rows();
  end = std::min<int64_t>(end, static_cast<int64_t>(delta_ready_.size()));
  StepStats unattributed;
  StepStats& counts = ctx_.cur != nullptr ? *ctx_.cur : unattributed;
  int64_t i = first;
  while (i < end) {
    if (delta_ready_[static_cast<size_t>(i)]) {
      ++i;
      continue;
    }
    // A run of rows without D inside one batch and one owned range.
    const int b = static_cast<int>(i / rows);
    const int64_t l0 = i % rows;
    int64_t range_end = 0;
    for (const RowRange& o : st->owned()) {
      range_end += o.size();
      if (l0 < range_end) break;
    }
    int64_t j = i;
    const int64_t stop = std::min(end, int64_t{b} * rows + range_end);
    while (j < stop && !delta_ready_[static_cast<size_t>(j)]) ++j;
    const int64_t n = j - i;
    RETURN_IF_ERROR(ctx_.WaitInput(InputTensor::kDout, GlobalRows(st->owned(), {l0, l0 + n})));
    ++counts.delta_launches;
    RETURN_IF_ERROR(ctx_.backend->ComputeDelta(BatchOf(st->dout(), b).Slice(l0, n),
                                               BatchOf(st->o(), b).Slice(l0, n),
                                               BatchOf(st->delta(), b).Slice(l0, n), ctx_.stream));
    std::fill(delta_ready_.begin() + i, delta_ready_.begin() + j, 1);
    i = j;
  }
  return absl::OkStatus();
}

absl::Status PassAccumulators::PrepareQueries(const RowRange& local) {
  if (!lazy_queries_ || ctx_.fwd || local.size() <= 0) return absl::OkStatus();
  SessionStorage* st = ctx_.storage;
  const int64_t rows = st->rows();
  const TensorView dq = st->dq_acc();
  const int64_t row_bytes = dq.RowStride() * 4;
  StepStats unattributed;
  StepStats& counts = ctx_.cur != nullptr ? *ctx_.cur : unattributed;
  for (int b = 0; b < ctx_.shape.batch; ++b) {
    const int64_t first = int64_t{b} * rows + local.begin, end = int64_t{b} * rows + local.end;
    RETURN_IF_ERROR(EnsureDelta(first, end));  // the rows' own D (units, grad_in sends)
    int64_t i = first;
    while (i < end) {
      if (dq_zeroed_[static_cast<size_t>(i)]) {
        ++i;
        continue;
      }
      int64_t j = i;
      while (j < end && !dq_zeroed_[static_cast<size_t>(j)]) ++j;
      // dQ rows [i, j) lie over O rows [overlay i, overlay j): their D first.
      RETURN_IF_ERROR(EnsureDelta(overlay_ * i, overlay_ * j));
      RETURN_IF_ERROR(
          Launch(&counts.other_launches,
                 ctx_.backend->Memset(static_cast<char*>(dq.data) + i * row_bytes, 0,
                                      static_cast<size_t>((j - i) * row_bytes), ctx_.stream)));
      std::fill(dq_zeroed_.begin() + i, dq_zeroed_.begin() + j, 1);
      i = j;
    }
  }
  return absl::OkStatus();
}

absl::Status PassAccumulators::ConvertFinal(OutputSide side, const RowRange& local) {
  SessionStorage* st = ctx_.storage;
  const int64_t n = local.size();
  if (n <= 0) return absl::OkStatus();
  StepStats unattributed;
  StepStats& counts = ctx_.cur != nullptr ? *ctx_.cur : unattributed;
  auto convert = [&](const TensorView& from, const TensorView& to) {
    return Launch(&counts.other_launches,
                  ctx_.backend->Convert(from.Slice(local.begin, n), to.Slice(local.begin, n),
                                        ctx_.stream));
  };
  if (side == OutputSide::kQueries) {
    if (ctx_.fwd) {
      if (out_view_.data != st->o().data) RETURN_IF_ERROR(convert(out_view_, st->o()));
    } else {
      RETURN_IF_ERROR(convert(st->dq_acc(), st->q()));
    }
    final_queries_.push_back(local);
    return absl::OkStatus();
  }
  if (ctx_.fwd || chunked_) {
    return absl::InternalError(absl::StrCat("worker ", ctx_.rank, ": key rows ", Rows(local),
                                            " announced final outside an unchunked backward"));
  }
  RETURN_IF_ERROR(convert(st->dk_acc(), st->k()));
  RETURN_IF_ERROR(convert(st->dv_acc(), st->v()));
  final_keys_.push_back(local);
  return absl::OkStatus();
}

absl::Status PassAccumulators::ChunkViews(int64_t c, int64_t k0, int64_t n, TensorView* dk,
                                          TensorView* dv) {
  const int64_t begin = c * chunk_rows_;
  if (!chunked_ || c < 0 || c >= num_chunks() || k0 < begin || k0 + n > begin + chunk_rows_) {
    return absl::InternalError(absl::StrCat("worker ", ctx_.rank, ": key rows [", k0, ", ",
                                            k0 + n, ") are not inside key chunk ", c));
  }
  if (live_chunk_ != c) {
    if (live_chunk_ >= 0 || chunk_done_[static_cast<size_t>(c)]) {
      return absl::InternalError(absl::StrCat("worker ", ctx_.rank, ": key chunk ", c,
                                              " started while chunk ", live_chunk_,
                                              " is live, or again"));
    }
    const size_t bytes = static_cast<size_t>(KeyChunkBytes(ctx_.shape, chunk_rows_) / 2);
    RETURN_IF_ERROR(ctx_.backend->Memset(chunk_dk_->get(), 0, bytes, ctx_.stream));
    RETURN_IF_ERROR(ctx_.backend->Memset(chunk_dv_->get(), 0, bytes, ctx_.stream));
    live_chunk_ = c;
  }
  *dk = ChunkView(chunk_dk_->get(), ctx_.shape, chunk_rows_, k0 - begin, n);
  *dv = ChunkView(chunk_dv_->get(), ctx_.shape, chunk_rows_, k0 - begin, n);
  return absl::OkStatus();
}

absl::Status PassAccumulators::FinishChunk(int64_t c) {
  if (live_chunk_ != c) {
    // No call touched the chunk (no visible pair): its gradients are 0.
    TensorView dk, dv;
    RETURN_IF_ERROR(ChunkViews(c, c * chunk_rows_, 0, &dk, &dv));
  }
  SessionStorage* st = ctx_.storage;
  const int64_t begin = c * chunk_rows_;
  const int64_t n = std::min(chunk_rows_, st->rows() - begin);
  StepStats unattributed;
  StepStats& counts = ctx_.cur != nullptr ? *ctx_.cur : unattributed;
  RETURN_IF_ERROR(
      Launch(&counts.other_launches,
             ctx_.backend->Convert(ChunkView(chunk_dk_->get(), ctx_.shape, chunk_rows_, 0, n),
                                   st->k().Slice(begin, n), ctx_.stream)));
  RETURN_IF_ERROR(
      Launch(&counts.other_launches,
             ctx_.backend->Convert(ChunkView(chunk_dv_->get(), ctx_.shape, chunk_rows_, 0, n),
                                   st->v().Slice(begin, n), ctx_.stream)));
  chunk_done_[static_cast<size_t>(c)] = true;
  live_chunk_ = -1;
  return absl::OkStatus();
}

absl::Status PassAccumulators::PrepareRows(int64_t a, int64_t m, bool* fresh) {
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
    for (const RowRange& g : gaps) RETURN_IF_ERROR(InitRows(g));
  }
  for (const RowRange& g : gaps) acc_ready_.push_back(g);
  return absl::OkStatus();
}

absl::Status PassAccumulators::InitRows(const RowRange& local) {
  const AttentionShape& shape = ctx_.shape;
  const int64_t n = local.size();
  if (n <= 0) return absl::OkStatus();
  if (out_view_.dtype != DType::kF32) {  // single-writer forward: never merges, never fills
    return absl::InternalError(absl::StrCat("worker ", ctx_.rank, ": output rows [", local.begin,
                                            ", ", local.end,
                                            ") need a merge in a single-writer pass"));
  }
  StepStats unattributed;  // only outside the steps (none exist)
  StepStats& counts = ctx_.cur != nullptr ? *ctx_.cur : unattributed;
  const TensorView out = out_view_.Slice(local.begin, n);
  const int64_t row_bytes = int64_t{shape.q_heads} * shape.head_dim * 4;
  for (int b = 0; b < shape.batch; ++b) {
    char* base = static_cast<char*>(out.data) + b * out.BatchStride() * 4;
    RETURN_IF_ERROR(Launch(&counts.other_launches,
                           ctx_.backend->Memset(base, 0, static_cast<size_t>(n * row_bytes),
                                                ctx_.stream)));
  }
  // LSE = -inf: staged through a dense device buffer, copied into the rows' strided slots.
  const int64_t count = int64_t{shape.batch} * shape.q_heads * n;
  std::vector<float> ninf(static_cast<size_t>(count), -std::numeric_limits<float>::infinity());
  ASSIGN_OR_RETURN(void* p, ctx_.backend->Alloc(static_cast<size_t>(count) * 4));
  DeviceBuffer staging(ctx_.backend, p);
  RETURN_IF_ERROR(ctx_.backend->Copy(p, ninf.data(), ninf.size() * 4,
                                     AttentionBackend::CopyKind::kHostToDevice, ctx_.stream));
  const Component stat{DType::kF32, shape.q_heads, true};
  const TensorView src = ComponentView(p, stat, shape, n, 0, n);
  const TensorView dst =
      ComponentView(ctx_.storage->lse().data, stat, shape, ctx_.storage->rows(), local.begin, n);
  return Launch(&counts.other_launches, ctx_.backend->Convert(src, dst, ctx_.stream));
}

absl::Status PassAccumulators::Finish() {
  SessionStorage* st = ctx_.storage;
  if (!ctx_.fwd) {
    // Rows no unit or partial touched still need D formed and dQ zeroed (lazy D: dO streamed).
    RETURN_IF_ERROR(PrepareQueries({0, st->rows()}));
    // The inputs are dead: the gradients go into their slots, in the session dtype.
    for (int64_t c = 0; c < num_chunks(); ++c) {
      if (!chunk_done_[static_cast<size_t>(c)]) RETURN_IF_ERROR(FinishChunk(c));
    }
    chunk_dk_.reset();
    chunk_dv_.reset();
    // Rows ConvertFinal took already are left alone (a download may be reading them).
    for (const RowRange& r : Remaining(st->rows(), final_queries_)) {
      RETURN_IF_ERROR(ctx_.backend->Convert(st->dq_acc().Slice(r.begin, r.size()),
                                            st->q().Slice(r.begin, r.size()), ctx_.stream));
    }
    if (!chunked_) {
      for (const RowRange& r : Remaining(st->rows(), final_keys_)) {
        RETURN_IF_ERROR(ctx_.backend->Convert(st->dk_acc().Slice(r.begin, r.size()),
                                              st->k().Slice(r.begin, r.size()), ctx_.stream));
        RETURN_IF_ERROR(ctx_.backend->Convert(st->dv_acc().Slice(r.begin, r.size()),
                                              st->v().Slice(r.begin, r.size()), ctx_.stream));
      }
    }
    return absl::OkStatus();
  }
  // Rows no call wrote (no plan leaves any): an empty output, LSE -inf.
  const int64_t rows = st->rows();
  bool fresh = false;
  RETURN_IF_ERROR(PrepareRows(0, rows, &fresh));
  if (fresh) RETURN_IF_ERROR(InitRows({0, rows}));
  if (out_view_.data != st->o().data) {
    for (const RowRange& r : Remaining(rows, final_queries_)) {
      RETURN_IF_ERROR(ctx_.backend->Convert(out_view_.Slice(r.begin, r.size()),
                                            st->o().Slice(r.begin, r.size()), ctx_.stream));
    }
  }
  return absl::OkStatus();
}

}  // namespace dfa::executor_internal
