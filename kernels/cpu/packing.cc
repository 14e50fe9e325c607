#include "kernels/cpu/packing.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/kernel_params.h"

namespace dfa::cpu {

float* Reserve(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  return v.data();
}

namespace {

// Row r of head h of batch b of a BSHD view, as fp32 into out[0, head_dim).
void LoadRow(const TensorView& t, int b, int64_t r, int h, float mul, float* out) {
  const int64_t base = b * t.BatchStride() + r * t.RowStride() + int64_t{h} * t.head_dim;
  switch (t.dtype) {
    case DType::kF32: {
      const float* p = static_cast<const float*>(t.data) + base;
      for (int d = 0; d < t.head_dim; ++d) out[d] = p[d] * mul;
      break;
    }
    case DType::kBF16: {
      const uint16_t* p = static_cast<const uint16_t*>(t.data) + base;
      for (int d = 0; d < t.head_dim; ++d) out[d] = BF16ToFloat(p[d]) * mul;
      break;
    }
    case DType::kF16: {
      const uint16_t* p = static_cast<const uint16_t*>(t.data) + base;
      for (int d = 0; d < t.head_dim; ++d) out[d] = HalfToFloat(p[d]) * mul;
      break;
    }
  }
}

}  // namespace

void PackRows(const TensorView& t, float mul, int64_t rows_pad, int dp, float* dst,
              ThreadPool& pool) {
  pool.ParallelFor(int64_t{t.batch} * t.heads, [&](int64_t bh, int) {
    const int b = static_cast<int>(bh / t.heads), h = static_cast<int>(bh % t.heads);
    float* base = dst + bh * rows_pad * dp;
    for (int64_t r = 0; r < rows_pad; ++r) {
      float* row = base + r * dp;
      int d0 = 0;
      if (r < t.rows) {
        LoadRow(t, b, r, h, mul, row);
        d0 = t.head_dim;
      }
      for (int d = d0; d < dp; ++d) row[d] = 0.f;
    }
  });
}

void PackTransposed(const TensorView& t, int64_t rows_pad, int dp, float* dst, ThreadPool& pool) {
  pool.ParallelFor(int64_t{t.batch} * t.heads, [&](int64_t bh, int) {
    const int b = static_cast<int>(bh / t.heads), h = static_cast<int>(bh % t.heads);
    float row[512];  // head_dim <= 512 (validated); no allocation inside pool tasks
    float* base = dst + bh * rows_pad * dp;
    for (int64_t blk = 0; blk < rows_pad / kBlockN; ++blk) {
      float* tile = base + blk * kBlockN * dp;  // [dp][kBlockN]
      for (int64_t j = 0; j < kBlockN; ++j) {
        const int64_t r = blk * kBlockN + j;
        if (r < t.rows) {
          LoadRow(t, b, r, h, 1.f, row);
          for (int d = 0; d < t.head_dim; ++d) tile[d * kBlockN + j] = row[d];
        } else {
          for (int d = 0; d < t.head_dim; ++d) tile[d * kBlockN + j] = 0.f;
        }
      }
      for (int64_t i = int64_t{t.head_dim} * kBlockN; i < int64_t{dp} * kBlockN; ++i) tile[i] = 0.f;
    }
  });
}

void MergeRow(float* oa, float* la, const float* ob, float lb, int d) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const float a = *la;
  if (lb == kNegInf) {
    if (a == kNegInf) {
      for (int i = 0; i < d; ++i) oa[i] = 0.f;
    }
    return;
  }
  if (a == kNegInf) {
    for (int i = 0; i < d; ++i) oa[i] = ob[i];
    *la = lb;
    return;
  }
  const float mx = std::max(a, lb);
  const float wa = std::exp(a - mx), wb = std::exp(lb - mx);
  const float sum = wa + wb;  // in [1, 2]
  const float ca = wa / sum, cb = wb / sum;
  for (int i = 0; i < d; ++i) oa[i] = oa[i] * ca + ob[i] * cb;
  *la = mx + std::log(sum);
}

}  // namespace dfa::cpu
