#include "worker/gpu/op_trace.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/trace.h"

namespace dfa {

OpTrace* OpTrace::FromEnvironment() {
  return TraceOpsEnabled() ? new OpTrace() : nullptr;
}

OpTrace::~OpTrace() {
  for (CUevent_st* e : events_) cudaEventDestroy(e);
}

CUevent_st* OpTrace::NextEvent() {
  if (used_ == events_.size()) {
    cudaEvent_t e = nullptr;
    if (cudaEventCreate(&e) != cudaSuccess) return nullptr;
    events_.push_back(e);
  }
  return events_[used_++];
}

void OpTrace::Begin(void* stream, const char* what, int64_t rows, int64_t cols) {
  Op op{what, rows, cols, NextEvent(), nullptr, absl::Now(), absl::InfinitePast()};
  if (op.start) cudaEventRecord(op.start, static_cast<cudaStream_t>(stream));
  ops_.push_back(op);
}

void OpTrace::End(void* stream) {
  if (ops_.empty()) return;
  Op& op = ops_.back();
  op.stop = NextEvent();
  if (op.stop) cudaEventRecord(op.stop, static_cast<cudaStream_t>(stream));
  op.host_end = absl::Now();
}

void OpTrace::Report() {
  if (ops_.empty()) return;
  ++passes_;
  const Op& first = ops_.front();
  double busy = 0, gaps = 0, prev_end = 0;
  std::string lines;
  for (size_t i = 0; i < ops_.size(); ++i) {
    const Op& op = ops_[i];
    float start_ms = 0, stop_ms = 0;
    if (op.start == nullptr || op.stop == nullptr ||
        cudaEventElapsedTime(&start_ms, first.start, op.start) != cudaSuccess ||
        cudaEventElapsedTime(&stop_ms, first.start, op.stop) != cudaSuccess) {
      absl::StrAppendFormat(&lines, "  %3d %-18s (no device time)\n", i, op.what);
      continue;
    }
    const double gap = i == 0 ? 0.0 : start_ms - prev_end;
    busy += stop_ms - start_ms;
    gaps += gap > 0 ? gap : 0;
    prev_end = stop_ms;
    absl::StrAppendFormat(
        &lines, "  %3d %-18s %6d x %-6d device %8.3f ms  at %8.3f  gap %7.3f  host %8.3f..%8.3f\n",
        i, op.what, op.rows, op.cols, stop_ms - start_ms, start_ms, gap,
        absl::ToDoubleMilliseconds(op.host_begin - first.host_begin),
        absl::ToDoubleMilliseconds(op.host_end - first.host_begin));
  }
  const double host_span = absl::ToDoubleMilliseconds(ops_.back().host_end - first.host_begin);
  const double host_done = absl::ToDoubleMilliseconds(absl::Now() - first.host_begin);
  absl::FPrintF(stderr,
                "op trace, pass %d: %d calls, device %.3f ms busy + %.3f ms gaps = %.3f ms; host "
                "enqueued them in %.3f ms, saw the pass done at %.3f ms\n%s",
                passes_, ops_.size(), busy, gaps, prev_end, host_span, host_done, lines);
  ops_.clear();
  used_ = 0;
}

}  // namespace dfa
