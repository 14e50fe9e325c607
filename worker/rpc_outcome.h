// What every handler of the Worker service shares: the check that a session's data may change
// (no job is running on it) and the answer an absl::Status becomes on the wire, with every
// answer counted in dfa_worker_requests_total{rpc, code} and every non-OK one also in
// dfa_grpc_errors_total{component="worker"}.
// Threads: thread-safe (the caller holds the session's mutex for CheckIdle).
#pragma once

#include "absl/status/status.h"
#include "grpcpp/support/status.h"
#include "worker/worker_metrics.h"
#include "worker/worker_session.h"

namespace dfa {

// FAILED_PRECONDITION naming the running job when `s` has one. Call with s.mu held.
absl::Status CheckIdle(const WorkerSession& s);

// `st` as a grpc::Status, counted under `method` (e.g. "Upload") and its code's name when
// `metrics` is set.
grpc::Status AnswerRpc(WorkerMetrics* metrics, const char* method, const absl::Status& st);

}  // namespace dfa
