#include "worker/executor/pass_accumulators.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "worker/executor/transfer_layout.h"

namespace dfa::executor_internal {

absl::Status PassAccumulators::Begin() {
  SessionStorage* st = ctx_.storage;
  const AttentionShape& shape = ctx_.shape;
  if (ctx_.fwd) {
    out_view_ = st->o();
    if (shape.dtype != DType::kF32 && !SingleWriterForward()) {
      const int64_t bytes =
          int64_t{shape.batch} * st->rows() * shape.q_heads * shape.head_dim * 4;
      ASSIGN_OR_RETURN(void* p, ctx_.backend->Alloc(static_cast<size_t>(bytes)));
      out_acc_ = std::make_unique<DeviceBuffer>(ctx_.backend, p);
      out_view_.data = p;
      out_view_.dtype = DType::kF32;
    }
    acc_ready_.clear();
    return absl::OkStatus();
  }
  for (TensorView g : {st->dq(), st->dk(), st->dv()}) {
    RETURN_IF_ERROR(ctx_.backend->Memset(
        g.data, 0, static_cast<size_t>(int64_t{g.batch} * g.rows * g.heads * g.head_dim * 4),
        ctx_.stream));
  }
  // D = rowsum(dO * O) of the owned rows, before any grad_in leaves this worker.
  if (!ctx_.stats.steps.empty()) ++ctx_.stats.steps[0].delta_launches;
  return ctx_.backend->ComputeDelta(st->dout(), st->o(), st->delta(), ctx_.stream);
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

bool PassAccumulators::SingleWriterForward() const {
  const std::vector<RowRange>& owned = ctx_.storage->owned();
  std::vector<RowRange> written;
  for (const PlanStep& step : ctx_.steps()) {
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
  if (!ctx_.fwd) return absl::OkStatus();
  // Rows no call wrote (no plan leaves any): an empty output, LSE -inf.
  const int64_t rows = ctx_.storage->rows();
  bool fresh = false;
  RETURN_IF_ERROR(PrepareRows(0, rows, &fresh));
  if (fresh) RETURN_IF_ERROR(InitRows({0, rows}));
  if (out_acc_ != nullptr) {
    RETURN_IF_ERROR(ctx_.backend->Convert(out_view_, ctx_.storage->o(), ctx_.stream));
  }
  return absl::OkStatus();
}

}  // namespace dfa::executor_internal
