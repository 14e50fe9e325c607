#include <cmath>
#include <limits>

#include "kernels/cpu/cpu_attention.h"

namespace dfa::cpu {

namespace {
constexpr float kLog2e = 1.4426950408889634f;
}

void RunForward(const ForwardArgs& a, const KernelTable& kernels, ThreadPool& pool, Workspace& ws) {
  const int batch = a.q.batch, hq = a.q.heads, hkv = a.k.heads, dim = a.q.head_dim;
  const int dp = static_cast<int>(RoundUp(dim, kDimAlign));
  const int64_t m_pad = RoundUp(a.q.rows, kBlockM), n_pad = RoundUp(a.k.rows, kBlockN);

  ForwardParams p{};
  float* qs = Reserve(ws.qs, int64_t{batch} * hq * m_pad * dp);
  float* kt = Reserve(ws.kt, int64_t{batch} * hkv * n_pad * dp);
  float* vf = Reserve(ws.vf, int64_t{batch} * hkv * n_pad * dp);
  PackRows(a.q, a.scale * kLog2e, m_pad, dp, qs, pool);
  PackTransposed(a.k, n_pad, dp, kt, pool);
  PackRows(a.v, 1.f, n_pad, dp, vf, pool);
  p.qs = qs;
  p.kt = kt;
  p.vf = vf;
  p.out = Reserve(ws.out, int64_t{batch} * hq * m_pad * dp);
  p.lse = Reserve(ws.lse, int64_t{batch} * hq * m_pad);
  p.batch = batch;
  p.q_heads = hq;
  p.kv_heads = hkv;
  p.dp = dp;
  p.m = a.q.rows;
  p.n = a.k.rows;
  p.m_pad = m_pad;
  p.n_pad = n_pad;
  p.q_row0 = a.q_row0;
  p.kv_row0 = a.kv_row0;
  p.causal = a.mask == MaskKind::kCausal;
  p.iv = {};
  if (a.mask == MaskKind::kIntervals) {
    p.iv = {a.intervals.q_lo, a.intervals.q_hi, a.intervals.k_lo, a.intervals.k_hi,
            a.intervals.seq};
  }

  const int64_t scratch = kernels.forward_scratch_floats(dp);
  ws.scratch.resize(pool.size());
  for (auto& s : ws.scratch) Reserve(s, scratch);
  pool.ParallelFor(int64_t{batch} * hq * (m_pad / kBlockM), [&](int64_t task, int thread) {
    kernels.forward_task(p, task, ws.scratch[thread].data());
  });

  // Write back (or merge into) the caller's output, one (batch, head) per task.
  const TensorView& out = a.out;
  pool.ParallelFor(int64_t{batch} * hq, [&](int64_t bh, int) {
    const int b = static_cast<int>(bh / hq), h = static_cast<int>(bh % hq);
    for (int64_t r = 0; r < a.q.rows; ++r) {
      const float* src = p.out + (bh * m_pad + r) * dp;
      const float lse = p.lse[bh * m_pad + r];
      float* lse_dst = a.lse.data + b * a.lse.BatchStride() + h * a.lse.HeadStride() + r;
      const int64_t base = b * out.BatchStride() + r * out.RowStride() + int64_t{h} * dim;
      if (a.accumulate) {
        MergeRow(static_cast<float*>(out.data) + base, lse_dst, src, lse, dim);
        continue;
      }
      for (int d = 0; d < dim; ++d) StoreFromFloat(out.data, out.dtype, base + d, src[d]);
      *lse_dst = lse;
    }
  });
}

}  // namespace dfa::cpu
