#include "worker/session_output_gate.h"

#include <algorithm>
#include <chrono>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"
#include "worker/rpc_outcome.h"
#include "worker/session_tensors.h"

namespace dfa {
namespace {

using session_tensors::KindName;

// How often a waiting download looks at gone() (its reactor also notifies).
constexpr auto kPoll = std::chrono::milliseconds(20);
// Outcomes of ended jobs a session remembers.
constexpr size_t kRememberedJobs = 8;

bool KeySide(v1::TensorKind k) { return k == v1::TENSOR_DK || k == v1::TENSOR_DV; }

bool OutputOf(v1::JobKind job, v1::TensorKind k) {
  if (job == v1::JOB_FORWARD) return k == v1::TENSOR_O || k == v1::TENSOR_LSE;
  return k == v1::TENSOR_DQ || k == v1::TENSOR_DK || k == v1::TENSOR_DV;
}

std::string RowsStr(const RowRange& r) { return absl::StrCat("[", r.begin, ", ", r.end, ")"); }

}  // namespace

void SessionOutputGate::RowsFinal(OutputSide side, const RowRange& rows) {
  std::lock_guard<std::mutex> l(s_->mu);
  absl::StatusOr<int64_t> local = s_->storage->LocalRow(rows);
  std::vector<uint8_t>& v = side == OutputSide::kKeys ? s_->outputs.keys : s_->outputs.queries;
  if (!local.ok() || *local + rows.size() > static_cast<int64_t>(v.size())) return;
  std::fill(v.begin() + *local, v.begin() + *local + rows.size(), 1);
  s_->outputs_changed.notify_all();
}

void BeginJobOutputs(WorkerSession* s, const std::string& job_id, v1::JobKind kind) {
  OutputProgress& p = s->outputs;
  p.job_id = job_id;
  p.kind = kind;
  const size_t rows = static_cast<size_t>(s->storage->rows());
  p.queries.assign(rows, 0);
  p.keys.assign(kind == v1::JOB_BACKWARD ? rows : 0, 0);
  s->outputs_changed.notify_all();
}

void EndJobOutputs(WorkerSession* s, const std::string& job_id, const absl::Status& outcome) {
  OutputProgress& p = s->outputs;
  if (p.job_id == job_id) {
    p.job_id.clear();
    p.queries.clear();
    p.keys.clear();
  }
  p.ended.emplace_back(job_id, outcome);
  while (p.ended.size() > kRememberedJobs) p.ended.pop_front();
  s->outputs_changed.notify_all();
}

absl::StatusOr<bool> OutputRowsReady(const WorkerSession& s, const std::string& job_id,
                                     v1::TensorKind kind, const RowRange& rows) {
  auto plain = [&]() -> absl::StatusOr<bool> {
    RETURN_IF_ERROR(CheckIdle(s));
    RETURN_IF_ERROR(session_tensors::CheckReadable(s, kind));
    return true;
  };
  if (job_id.empty()) return plain();
  RETURN_IF_ERROR(session_tensors::CheckKnownKind(kind));
  const OutputProgress& p = s.outputs;
  if (s.job_running && s.running_job_id == job_id) {
    if (!OutputOf(s.running_kind, kind)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kind = ", KindName(kind), " is not an output of await_job_id = '", job_id, "' (a ",
          s.running_kind == v1::JOB_FORWARD ? "forward: TENSOR_O, TENSOR_LSE"
                                            : "backward: TENSOR_DQ, TENSOR_DK, TENSOR_DV",
          ")"));
    }
    if (p.job_id != job_id) return false;
    ASSIGN_OR_RETURN(const int64_t local, s.storage->LocalRow(rows));
    const std::vector<uint8_t>& v = KeySide(kind) ? p.keys : p.queries;
    if (local + rows.size() > static_cast<int64_t>(v.size())) return false;
    return std::all_of(v.begin() + local, v.begin() + local + rows.size(),
                       [](uint8_t f) { return f != 0; });
  }
  for (auto it = p.ended.rbegin(); it != p.ended.rend(); ++it) {
    if (it->first != job_id) continue;
    const absl::Status& st = it->second;
    if (!st.ok()) {
      return absl::Status(
          st.code(), absl::StrCat("await_job_id = '", job_id, "' ended ",
                                  absl::StatusCodeToString(st.code()), " before ", KindName(kind),
                                  " rows ", RowsStr(rows), " were final: ", st.message()));
    }
    return plain();
  }
  return false;  // not started on this worker yet
}

absl::StatusOr<absl::Duration> AwaitTimeout(int64_t await_timeout_ms, absl::Duration fallback) {
  constexpr int64_t kMaxMs = int64_t{24} * 3600 * 1000;
  if (await_timeout_ms < 0 || await_timeout_ms > kMaxMs) {
    return absl::InvalidArgumentError(absl::StrCat("await_timeout_ms = ", await_timeout_ms,
                                                   " must be in [0, ", kMaxMs,
                                                   "] (0: the worker's step timeout)"));
  }
  return await_timeout_ms > 0 ? absl::Milliseconds(await_timeout_ms) : fallback;
}

absl::Status AwaitOutputRows(WorkerSession* s, const std::string& job_id, v1::TensorKind kind,
                             const RowRange& rows, absl::Duration timeout,
                             const std::function<bool()>& gone) {
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  std::unique_lock<std::mutex> l(s->mu);
  while (true) {
    ASSIGN_OR_RETURN(const bool ready, OutputRowsReady(*s, job_id, kind, rows));
    if (ready) return absl::OkStatus();
    if (gone && gone()) {
      return absl::CancelledError(absl::StrCat("client went away while awaiting ", KindName(kind),
                                               " rows ", RowsStr(rows), " of job '", job_id, "'"));
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      const bool running = s->job_running && s->running_job_id == job_id;
      return absl::DeadlineExceededError(absl::StrFormat(
          "await_job_id = '%s': %s rows %s are not final within %s (await_timeout_ms; %s)", job_id,
          KindName(kind), RowsStr(rows), absl::FormatDuration(timeout),
          running ? "the job is running" : "the job has not started on this worker"));
    }
    s->outputs_changed.wait_for(
        l, std::min<std::chrono::steady_clock::duration>(deadline - now, kPoll));
  }
}

}  // namespace dfa
