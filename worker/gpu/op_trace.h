// OpTrace: a timeline of one pass's device work, for finding where a short job's time goes.
// Switched on by DFA_TRACE_OPS=1 (core/trace.h) in a GPU worker (off by default: it
// records two CUDA events per backend call). PooledBackend calls Begin/End around every kernel
// call on the caller's stream and Report() after the pass's final synchronisation; Report prints
// one line per call to stderr: the call, its rows, its device time, the device gap before it
// (time the stream waited: an NCCL arrival, or the host not having enqueued it yet) and the
// host time at which it was enqueued, all relative to the first call of the pass.
// Not thread-safe: one pass at a time per backend (as the executor runs).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"

struct CUevent_st;

namespace dfa {

class OpTrace {
 public:
  // nullptr unless tracing is on (TraceOpsEnabled(), core/trace.h).
  static OpTrace* FromEnvironment();
  ~OpTrace();

  // Around one backend call on `stream` (cudaStream_t); `what` e.g. "fwd causal", rows the
  // query/key rows of the call.
  void Begin(void* stream, const char* what, int64_t rows, int64_t cols);
  void End(void* stream);
  // After the device has finished everything begun: prints the pass and forgets it.
  void Report();

 private:
  struct Op {
    const char* what;
    int64_t rows, cols;
    CUevent_st* start;
    CUevent_st* stop;
    absl::Time host_begin, host_end;
  };
  CUevent_st* NextEvent();

  std::vector<CUevent_st*> events_;  // created lazily, reused across passes
  size_t used_ = 0;
  std::vector<Op> ops_;
  int passes_ = 0;
};

}  // namespace dfa
