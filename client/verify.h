// Verification of service results against single-device attention on the full tensors,
// computed in-process by the CPU backend (fp32 arithmetic).
//
// Tolerance rule (as flash-attention's tests do it): the service's error against the fp32
// reference may be at most twice the error the reference itself makes when rounded to the
// client's dtype (plus a small floor for fp32), both as relative L2 norm and as max abs error.
// A service bug (a missing or doubled unit, a wrong mask, a bad merge) gives errors of order 1.
#pragma once

#include <string>

#include "client/host_tensor.h"
#include "dfa/v1/attention.pb.h"
#include "core/mask.h"
#include "core/status.h"

namespace dfa::client {

// The spec's whole mask for a host (cpu backend) call over the whole sequence: its kind and,
// when it has documents or a window, its interval arrays (host memory).
struct HostMask {
  explicit HostMask(const v1::AttentionSpec& spec);
  MaskKind kind = MaskKind::kCausal;
  MaskIntervalArrays arrays;  // empty when dense
  MaskIntervals intervals() const;
};

// fp32 results of the single-device computation.
struct ReferenceResult {
  HostTensor o, lse;       // forward
  HostTensor dq, dk, dv;   // backward (empty when no dO was given)
};

// Runs the whole sequence as one unit on a CPU backend with `threads` threads (0: the usable
// CPUs), under the spec's whole mask (causal, documents, window: MaskSpecOf).
// `dout` may be null (forward only). Errors: the backend's (e.g. UNIMPLEMENTED if absent).
absl::StatusOr<ReferenceResult> ComputeReference(const v1::AttentionSpec& spec,
                                                 const HostTensor& q, const HostTensor& k,
                                                 const HostTensor& v, const HostTensor* dout,
                                                 int threads);

struct Comparison {
  std::string name;
  double max_abs_err = 0;
  double rel_l2_err = 0;
  double max_abs_tol = 0;
  double rel_l2_tol = 0;
  bool ok = false;
  std::string ToString() const;
};

// Compares `got` (any dtype, same shape) with an fp32 `ref`, tolerances for `got`'s dtype.
// Non-finite values in `got` fail the comparison.
Comparison Compare(const std::string& name, const HostTensor& got, const HostTensor& ref);

}  // namespace dfa::client
