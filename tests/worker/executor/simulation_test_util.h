// Helpers shared by the tests that run plans in the simulator and compare them with the fp64
// reference (executor_simulation_test, mask_simulation_test, tests/core/mixed_passes_test,
// tests/core/document_plan_simulation_test).
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/mask.h"
#include "gtest/gtest.h"
#include "kernels/attention_backend.h"
#include "kernels/reference/reference_attention.h"
#include "worker/executor/simulator.h"

namespace dfa::testing_util {

// n values from N(0, 1).
inline std::vector<float> Random(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// A dense fp32 [batch, rows, heads, dim] view of host data.
inline TensorView HostView(std::vector<float>& v, int batch, int64_t rows, int heads, int dim) {
  TensorView t;
  t.data = v.data();
  t.dtype = DType::kF32;
  t.batch = batch;
  t.rows = rows;
  t.heads = heads;
  t.head_dim = dim;
  return t;
}

// Max |a - b| / (atol + rtol |b|) over the elements (equal infinities count as exact); <= 1 passes.
inline double WorstError(const std::vector<float>& got, const std::vector<double>& want,
                         double atol, double rtol) {
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i]) && got[i] == want[i]) continue;
    worst = std::max(worst, std::abs(got[i] - want[i]) / (atol + rtol * std::abs(want[i])));
  }
  return worst;
}

// The fp64 reference problem of the simulation inputs `in` (`batch` rows of `seq` tokens) under
// `mask` (kIntervals: set spec and seq on the result), scaled by 1 / sqrt(head_dim).
inline reference::Problem ReferenceProblem(SimulationInputs& in, const AttentionShape& shape,
                                           int batch, int64_t seq, MaskKind mask) {
  reference::Problem pr;
  pr.q = HostView(in.q, batch, seq, shape.q_heads, shape.head_dim);
  pr.k = HostView(in.k, batch, seq, shape.kv_heads, shape.head_dim);
  pr.v = HostView(in.v, batch, seq, shape.kv_heads, shape.head_dim);
  pr.mask = mask;
  pr.scale = 1.0 / std::sqrt(double(shape.head_dim));
  return pr;
}

// The simulated forward and backward of one batch row of `seq` tokens under `mask` against the
// fp64 reference (output and LSE within 1e-5 + 1e-4 relative, gradients 1e-4 + 1e-3).
inline void ExpectMatchesMaskedReference(const SimulationResult& sim, SimulationInputs& in,
                                         const AttentionShape& shape, const MaskSpec& mask,
                                         int64_t seq) {
  reference::Problem pr = ReferenceProblem(in, shape, 1, seq, MaskKind::kIntervals);
  pr.spec = &mask;
  pr.seq = seq;
  absl::StatusOr<reference::ForwardResult> ref = reference::Forward(pr);
  ASSERT_TRUE(ref.ok()) << ref.status();
  absl::StatusOr<reference::Gradients> grads =
      reference::Backward(pr, HostView(in.dout, 1, seq, shape.q_heads, shape.head_dim));
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_LE(WorstError(sim.out, ref->out, 1e-5, 1e-4), 1.0) << "output";
  EXPECT_LE(WorstError(sim.lse, ref->lse, 1e-5, 1e-4), 1.0) << "lse";
  EXPECT_LE(WorstError(sim.dq, grads->dq, 1e-4, 1e-3), 1.0) << "dq";
  EXPECT_LE(WorstError(sim.dk, grads->dk, 1e-4, 1e-3), 1.0) << "dk";
  EXPECT_LE(WorstError(sim.dv, grads->dv, 1e-4, 1e-3), 1.0) << "dv";
}

}  // namespace dfa::testing_util
