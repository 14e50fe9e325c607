#include "worker/session_input_gate.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"

namespace dfa {
namespace {

// How often a waiting unit looks at the cancel flag (CancelJob also notifies).
constexpr auto kCancelPoll = std::chrono::milliseconds(20);
constexpr int kMaxListedRanges = 4;

const char* TensorName(InputTensor t) {
  switch (t) {
    case InputTensor::kQ: return "TENSOR_Q";
    case InputTensor::kK: return "TENSOR_K";
    case InputTensor::kV: return "TENSOR_V";
    case InputTensor::kDout: return "TENSOR_DO";
  }
  return "?";
}

RowCoverage* CoverageOf(WorkerSession* s, InputTensor t) {
  switch (t) {
    case InputTensor::kQ: return &s->q_rows;
    case InputTensor::kK: return &s->k_rows;
    case InputTensor::kV: return &s->v_rows;
    case InputTensor::kDout: return &s->dout_rows;
  }
  return nullptr;
}

// The rows of `rows` (global; local row `local` on) that have not arrived, as "batch b rows
// [x, y)" runs, the first few.
std::string Missing(const RowCoverage& c, int batch, int64_t storage_rows, int64_t local,
                    const RowRange& rows) {
  std::string out;
  int listed = 0, more = 0;
  for (int b = 0; b < batch; ++b) {
    int64_t i = 0;
    const int64_t base = b * storage_rows + local;
    while (i < rows.size()) {
      if (c.ArrivedAll(base + i, 1)) {
        ++i;
        continue;
      }
      int64_t j = i;
      while (j < rows.size() && !c.ArrivedAll(base + j, 1)) ++j;
      if (listed < kMaxListedRanges) {
        absl::StrAppend(&out, out.empty() ? "" : ", ", "batch ", b, " rows [", rows.begin + i,
                        ", ", rows.begin + j, ")");
        ++listed;
      } else {
        ++more;
      }
      i = j;
    }
  }
  if (more > 0) absl::StrAppend(&out, " and ", more, " more ranges");
  return out;
}

}  // namespace

absl::Status SessionInputGate::WaitRows(InputTensor t, const RowRange& rows,
                                        absl::Duration timeout, const std::atomic<bool>* cancel) {
  ASSIGN_OR_RETURN(const int64_t local, s_->storage->LocalRow(rows));
  const int batch = s_->spec.batch();
  const int64_t storage_rows = s_->storage->rows();
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  std::unique_lock<std::mutex> l(s_->mu);
  RowCoverage* c = CoverageOf(s_, t);
  auto arrived = [&] {
    for (int b = 0; b < batch; ++b) {
      if (!c->ArrivedAll(b * storage_rows + local, rows.size())) return false;
    }
    return true;
  };
  while (!arrived()) {
    if (cancel != nullptr && cancel->load()) {
      return absl::CancelledError(absl::StrCat("job cancelled while waiting for ", TensorName(t),
                                               " rows [", rows.begin, ", ", rows.end, ")"));
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "inputs_streaming: %s rows have not arrived within %s (the worker's step timeout): "
          "missing %s",
          TensorName(t), absl::FormatDuration(timeout),
          Missing(*c, batch, storage_rows, local, rows)));
    }
    s_->rows_arrived.wait_for(l, std::min<std::chrono::steady_clock::duration>(deadline - now,
                                                                                kCancelPoll));
  }
  return absl::OkStatus();
}

}  // namespace dfa
