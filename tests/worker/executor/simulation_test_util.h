// Helpers shared by the tests that run plans in the simulator and compare them with the fp64
// reference (executor_simulation_test, tests/coordinator/mixed_passes_test).
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/attention_backend.h"

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

}  // namespace dfa::testing_util
