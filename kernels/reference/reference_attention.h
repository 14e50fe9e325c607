// Plain fp64 O(m·n) attention: the ground truth that kernel tests and `dfa demo --verify`
// compare against. Deliberately simple: inputs read once into dense fp64 arrays, then the
// textbook loops (no blocking, no threads, no online softmax).
//
// Inputs are host TensorViews in the layouts of kernels/attention_backend.h (any dtype, any row
// stride; values are read exactly, so compare a backend against the reference on the same
// rounded inputs). Outputs are dense fp64 vectors: O, dQ in [B, m, Hq, D], dK, dV in
// [B, n, Hkv, D], LSE and D in [B, Hq, m]. Masks use global positions q_row0 + i and
// kv_row0 + j (kIntervals: batch row b too, under Problem::spec), GQA maps query head h to key/value head h / (Hq / Hkv), exactly as the backends.
// A query row that sees no key gets LSE = -inf and output 0. Errors: INVALID_ARGUMENT (shapes,
// as ValidateForward / ValidateBackward would report).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/attention_backend.h"

namespace dfa::reference {

struct Problem {
  TensorView q, k, v;  // q [B, m, Hq, D]; k, v [B, n, Hkv, D]
  int64_t q_row0 = 0;
  int64_t kv_row0 = 0;
  MaskKind mask = MaskKind::kCausal;
  double scale = 0.0;
  // mask == kIntervals: the MaskSpec itself (its definition, core/mask.h, read pair by pair;
  // not the interval arrays the kernels read) over a sequence of `seq` positions per batch row.
  const MaskSpec* spec = nullptr;
  int64_t seq = 0;
};

struct ForwardResult {
  std::vector<double> out;  // [B, m, Hq, D]
  std::vector<double> lse;  // [B, Hq, m]
};

struct Gradients {
  std::vector<double> dq;  // [B, m, Hq, D]
  std::vector<double> dk;  // [B, n, Hkv, D] (summed over the query heads sharing a kv head)
  std::vector<double> dv;  // [B, n, Hkv, D]
};

// Softmax attention of the problem's query rows over its key rows.
absl::StatusOr<ForwardResult> Forward(const Problem& problem);

// Gradients of sum(dout · O) for O = Forward(problem).out (the rows' own LSE and
// D = rowsum(dout · O) are computed inside). dout: [B, m, Hq, D], any dtype.
absl::StatusOr<Gradients> Backward(const Problem& problem, const TensorView& dout);

// One unit's share of a larger backward: uses the given final LSE and D of the query rows
// (dense [B, Hq, m]; from the forward over all keys), as a backend's Backward does. Summing
// BackwardUnit over a partition of the keys gives Backward over all of them.
absl::StatusOr<Gradients> BackwardUnit(const Problem& problem, const TensorView& dout,
                                       const std::vector<double>& lse,
                                       const std::vector<double>& delta);

}  // namespace dfa::reference
