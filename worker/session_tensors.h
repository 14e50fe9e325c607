// A session's tensors by their wire kind: the storage behind each kind, the row coverage that
// uploads mark, and whether a kind may be read now. One definition for every data path (gRPC
// chunks and shared memory in tensor_io, CUDA IPC in gpu/device_transfer, NCCL client groups);
// header-only so that dfa_worker_gpu_service, which dfa_worker links, uses it too.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "worker/worker_session.h"

namespace dfa::session_tensors {

inline std::string KindName(v1::TensorKind k) { return v1::TensorKind_Name(k); }

inline bool IsKnownKind(v1::TensorKind k) { return k >= v1::TENSOR_Q && k <= v1::TENSOR_DV; }
// INVALID_ARGUMENT naming `kind` when it is none of the tensor kinds.
inline absl::Status CheckKnownKind(v1::TensorKind kind) {
  if (IsKnownKind(kind)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("kind = ", static_cast<int>(kind), " is not a tensor kind"));
}

// The kinds a client uploads.
inline bool IsUploadKind(v1::TensorKind k) {
  return k == v1::TENSOR_Q || k == v1::TENSOR_K || k == v1::TENSOR_V || k == v1::TENSOR_DO;
}

inline bool IsGradient(v1::TensorKind k) {
  return k == v1::TENSOR_DQ || k == v1::TENSOR_DK || k == v1::TENSOR_DV;
}

// The storage tensor behind a BSHD kind (gradients live in the memory of Q, K and V); a view
// with null data for LSE and unknown kinds.
inline TensorView ViewOf(const WorkerSession& s, v1::TensorKind kind) {
  const SessionStorage& st = *s.storage;
  switch (kind) {
    case v1::TENSOR_Q: return st.q();
    case v1::TENSOR_K: return st.k();
    case v1::TENSOR_V: return st.v();
    case v1::TENSOR_O: return st.o();
    case v1::TENSOR_DO: return st.dout();
    case v1::TENSOR_DQ: return st.dq();
    case v1::TENSOR_DK: return st.dk();
    case v1::TENSOR_DV: return st.dv();
    default: return TensorView{};
  }
}

// The coverage an upload of `kind` marks; nullptr for kinds that are not uploaded.
inline RowCoverage* CoverageOf(WorkerSession* s, v1::TensorKind kind) {
  switch (kind) {
    case v1::TENSOR_Q: return &s->q_rows;
    case v1::TENSOR_K: return &s->k_rows;
    case v1::TENSOR_V: return &s->v_rows;
    case v1::TENSOR_DO: return &s->dout_rows;
    default: return nullptr;
  }
}

// OK when an upload of `kind` may be written now: no job runs, or the running job streams its
// inputs (RunJobRequest.inputs_streaming) and `kind` is one of them (TENSOR_Q, _K, _V for a
// forward, TENSOR_DO for a backward); FAILED_PRECONDITION naming the job otherwise. A row
// written twice while the job runs may be read in either version: a client uploads each input
// row once per streaming job. Call with s.mu held.
inline absl::Status CheckUploadable(const WorkerSession& s, v1::TensorKind kind) {
  if (!s.job_running) return absl::OkStatus();
  const bool input = s.running_kind == v1::JOB_FORWARD
                         ? (kind == v1::TENSOR_Q || kind == v1::TENSOR_K || kind == v1::TENSOR_V)
                         : kind == v1::TENSOR_DO;
  if (s.inputs_streaming && input) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "session_id = '", s.id, "' is running job '", s.running_job_id, "'",
      s.inputs_streaming ? absl::StrCat(", which streams other inputs than ", KindName(kind))
                         : std::string(),
      "; try again after it"));
}

// OK when `kind` may be downloaded now; INVALID_ARGUMENT for an unknown kind,
// FAILED_PRECONDITION before its job ran or after the backward consumed it.
inline absl::Status CheckReadable(const WorkerSession& s, v1::TensorKind kind) {
  RETURN_IF_ERROR(CheckKnownKind(kind));
  const bool input = kind == v1::TENSOR_Q || kind == v1::TENSOR_K || kind == v1::TENSOR_V;
  if (s.inputs_consumed && (kind == v1::TENSOR_O || input)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "kind = ", KindName(kind), ": consumed by the backward job (its memory holds the "
        "gradients: download O after the forward; upload q/k/v again for the next forward)"));
  }
  if (kind == v1::TENSOR_LSE && s.inputs_consumed && s.backward_done) return absl::OkStatus();
  if ((kind == v1::TENSOR_O || kind == v1::TENSOR_LSE) && !s.forward_done) {
    return absl::FailedPreconditionError(
        absl::StrCat("kind = ", KindName(kind), ": no forward job has run on the current inputs"));
  }
  if (IsGradient(kind) && !s.backward_done) {
    return absl::FailedPreconditionError(
        absl::StrCat("kind = ", KindName(kind), ": no backward job has run on the current inputs"));
  }
  return absl::OkStatus();
}

}  // namespace dfa::session_tensors
