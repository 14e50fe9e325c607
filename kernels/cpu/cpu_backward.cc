#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/cpu_attention.h"

namespace dfa::cpu {

namespace {
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.69314718055994530942f;
}  // namespace

void RunBackward(const BackwardArgs& a, const KernelTable& kernels, ThreadPool& pool,
                 Workspace& ws) {
  const int batch = a.q.batch, hq = a.q.heads, hkv = a.k.heads, dim = a.q.head_dim;
  const int dp = static_cast<int>(RoundUp(dim, kDimAlign));
  const int64_t m = a.q.rows, n = a.k.rows;
  const int64_t m_pad = RoundUp(m, kBlockM), n_pad = RoundUp(n, kBlockN);
  const int64_t nkb = n_pad / kBlockN;

  // Enough tasks to keep every thread busy: split each kv head's key blocks into chunks when
  // there are few kv heads; each chunk then needs its own dQ copy (summed below). The copies
  // are capped (kMaxChunks, kMaxDqCopyBytes): with very few kv heads on many cores some
  // threads idle rather than the backend holding dozens of dQ copies.
  constexpr int64_t kMaxChunks = 8;
  constexpr int64_t kMaxDqCopyBytes = int64_t{1} << 30;
  const int64_t base_tasks = int64_t{batch} * hkv;
  const int64_t q_elems = int64_t{batch} * hq * m_pad * dp;
  int64_t chunks = 1;
  if (base_tasks < 2 * pool.size()) {
    chunks = std::min({nkb, (2 * pool.size() + base_tasks - 1) / base_tasks, kMaxChunks});
    while (chunks > 1 && chunks * q_elems * int64_t{sizeof(float)} > kMaxDqCopyBytes) --chunks;
  }

  BackwardParams p{};
  const int64_t kv_elems = int64_t{batch} * hkv * n_pad * dp;
  float* qs = Reserve(ws.qs, q_elems);
  float* dof = Reserve(ws.dof, q_elems);
  float* kf = Reserve(ws.kf, kv_elems);
  float* kt = Reserve(ws.kt, kv_elems);
  float* vt = Reserve(ws.vt, kv_elems);
  PackRows(a.q, a.scale * kLog2e, m_pad, dp, qs, pool);
  PackRows(a.dout, 1.f, m_pad, dp, dof, pool);
  PackRows(a.k, 1.f, n_pad, dp, kf, pool);
  PackTransposed(a.k, n_pad, dp, kt, pool);
  PackTransposed(a.v, n_pad, dp, vt, pool);
  float* lse2 = Reserve(ws.lse2, int64_t{batch} * hq * m_pad);
  float* delta = Reserve(ws.delta, int64_t{batch} * hq * m_pad);
  float* dq = Reserve(ws.dq, chunks * q_elems);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  pool.ParallelFor(int64_t{batch} * hq, [&](int64_t bh, int) {
    const int b = static_cast<int>(bh / hq), h = static_cast<int>(bh % hq);
    for (int64_t r = 0; r < m_pad; ++r) {
      float l = kInf, d = 0.f;
      if (r < m) {
        const float lse = a.lse.data[b * a.lse.BatchStride() + h * a.lse.HeadStride() + r];
        // A row that saw no key (LSE = -inf) has P = 0: +inf makes exp2(s - lse2) exactly 0.
        l = std::isfinite(lse) ? lse * kLog2e : kInf;
        d = a.delta.data[b * a.delta.BatchStride() + h * a.delta.HeadStride() + r];
      }
      lse2[bh * m_pad + r] = l;
      delta[bh * m_pad + r] = d;
    }
    for (int64_t c = 0; c < chunks; ++c) {
      float* z = dq + c * q_elems + bh * m_pad * dp;
      std::fill(z, z + m_pad * dp, 0.f);
    }
  });

  p.qs = qs;
  p.kf = kf;
  p.kt = kt;
  p.vt = vt;
  p.dof = dof;
  p.lse2 = lse2;
  p.delta = delta;
  p.dq_acc = dq;
  p.dk_acc = Reserve(ws.dk, kv_elems);
  p.dv_acc = Reserve(ws.dv, kv_elems);
  p.batch = batch;
  p.q_heads = hq;
  p.kv_heads = hkv;
  p.dp = dp;
  p.m = m;
  p.n = n;
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
  p.chunks = static_cast<int>(chunks);

  const int64_t scratch = kernels.backward_scratch_floats(dp);
  ws.scratch.resize(pool.size());
  for (auto& s : ws.scratch) Reserve(s, scratch);
  pool.ParallelFor(base_tasks * chunks, [&](int64_t task, int thread) {
    kernels.backward_task(p, task, ws.scratch[thread].data());
  });

  // dq += scale * sum over chunks; dk += ln2 * dk_acc (qs carried scale * log2 e); dv += dv_acc.
  const float scale = a.scale;
  pool.ParallelFor(int64_t{batch} * hq, [&](int64_t bh, int) {
    const int b = static_cast<int>(bh / hq), h = static_cast<int>(bh % hq);
    float* out = static_cast<float*>(a.dq.data);
    for (int64_t r = 0; r < m; ++r) {
      float* dst = out + b * a.dq.BatchStride() + r * a.dq.RowStride() + int64_t{h} * dim;
      for (int d = 0; d < dim; ++d) {
        float s = 0.f;
        for (int64_t c = 0; c < chunks; ++c) s += dq[c * q_elems + (bh * m_pad + r) * dp + d];
        dst[d] += scale * s;
      }
    }
  });
  pool.ParallelFor(int64_t{batch} * hkv, [&](int64_t bk, int) {
    const int b = static_cast<int>(bk / hkv), h = static_cast<int>(bk % hkv);
    float* dk = static_cast<float*>(a.dk.data);
    float* dv = static_cast<float*>(a.dv.data);
    for (int64_t r = 0; r < n; ++r) {
      const float* sk = p.dk_acc + (bk * n_pad + r) * dp;
      const float* sv = p.dv_acc + (bk * n_pad + r) * dp;
      float* tk = dk + b * a.dk.BatchStride() + r * a.dk.RowStride() + int64_t{h} * dim;
      float* tv = dv + b * a.dv.BatchStride() + r * a.dv.RowStride() + int64_t{h} * dim;
      for (int d = 0; d < dim; ++d) {
        tk[d] += kLn2 * sk[d];
        tv[d] += sv[d];
      }
    }
  });
}

}  // namespace dfa::cpu
