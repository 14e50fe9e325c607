// Tracing switch shared by every program: the environment variable DFA_TRACE_OPS (see
// docs/observability.md, "A job's timeline") is read here and nowhere else.
//   DFA_TRACE_OPS=1   workers print, per job, where their part of its wall time went (host
//                     clock) and, on a GPU, each backend call's device time (worker/gpu/
//                     op_trace.h); the coordinator prints, per job, its control-plane times.
// Unset, empty or "0": off (the default; tracing adds stderr lines and, on a GPU, two CUDA
// events per backend call).
#pragma once

namespace dfa {

// True when DFA_TRACE_OPS is set to a non-empty value other than "0". Read once per process
// (the first call); thread-safe.
bool TraceOpsEnabled();

}  // namespace dfa
