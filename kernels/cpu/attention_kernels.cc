// The CPU attention kernels: blocked online-softmax forward and FlashAttention-2 backward over
// packed fp32 buffers (see kernel_params.h). This file is compiled once per ISA with
// -DDFA_ISA=0 (x86-64 baseline), 1 (AVX2+FMA) or 2 (AVX-512F); each build exports one
// KernelTable and kernel_dispatch.cc picks one at run time. Everything here has internal
// linkage and uses no std:: templates, so no ISA-specific copy of a shared inline function can
// reach code that runs on a CPU without that ISA.
//
// The vector code uses GCC vector extensions of width kW floats; one register-blocked
// micro-kernel (kMR rows x kNV vectors of accumulators) does every block product.
#include <cstdint>

#include "kernels/cpu/kernel_params.h"

#if !defined(DFA_ISA)
#error "compile with -DDFA_ISA=0|1|2"
#elif DFA_ISA == 2
#define DFA_ISA_NS avx512
#define DFA_ISA_TABLE kKernelsAvx512
#define DFA_ISA_NAME "avx512"
#define DFA_VEC_FLOATS 16
#define DFA_TILE_VECS 4
#elif DFA_ISA == 1
#define DFA_ISA_NS avx2
#define DFA_ISA_TABLE kKernelsAvx2
#define DFA_ISA_NAME "avx2"
#define DFA_VEC_FLOATS 8
#define DFA_TILE_VECS 2
#else
#define DFA_ISA_NS baseline
#define DFA_ISA_TABLE kKernelsDefault
#define DFA_ISA_NAME "default"
#define DFA_VEC_FLOATS 4
#define DFA_TILE_VECS 2
#endif

namespace dfa::cpu {
namespace DFA_ISA_NS {
namespace {

constexpr int kW = DFA_VEC_FLOATS;  // floats per vector
constexpr int kMR = 4;              // rows per micro-tile
constexpr int kNV = DFA_TILE_VECS;  // vectors per micro-tile row
constexpr float kNegInf = -__builtin_inff();
constexpr float kLn2 = 0.69314718055994530942f;

static_assert(kBlockM % kMR == 0 && kBlockN % kMR == 0, "blocks must hold whole micro-tiles");
static_assert(kBlockN % kW == 0 && kDimAlign % kW == 0, "rows must hold whole vectors");

typedef float vf __attribute__((vector_size(kW * 4)));
typedef int32_t vi __attribute__((vector_size(kW * 4)));

inline vf Load(const float* p) {
  vf v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
inline void Store(float* p, vf v) { __builtin_memcpy(p, &v, sizeof v); }
// x - 0 == x for every x (also -0), so this folds to a plain broadcast (vf{} + x does not).
inline vf Splat(float x) { return x - vf{}; }
inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }
inline float MaxF(float a, float b) { return a > b ? a : b; }
inline int64_t RoundUp(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// 2^x for x <= 0 (x = -inf gives exactly 0). Cephes exp2f polynomial on [-0.5, 0.5].
inline vf Exp2(vf x) {
  x = x < -127.f ? Splat(-127.f) : x;
  x = x > 127.f ? Splat(127.f) : x;
  const vf t = x + 128.5f;                                    // in [1.5, 255.5]
  const vi n = __builtin_convertvector(t, vi);                // floor (t > 0) = round(x) + 128
  const vf f = x - (__builtin_convertvector(n, vf) - 128.f);  // in [-0.5, 0.5]
  vf p = Splat(1.535336188319500e-4f);
  p = p * f + 1.339887440266574e-3f;
  p = p * f + 9.618437357674640e-3f;
  p = p * f + 5.550332471162809e-2f;
  p = p * f + 2.402264791363012e-1f;
  p = p * f + 6.931472028550421e-1f;
  p = p * f + 1.f;
  const vi bits = (n - 1) << 23;  // 2^(n-128) as float bits; n = 1 -> 0.0
  vf scale;
  __builtin_memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

inline float HorizontalMax(vf v) {
  float m = v[0];
  for (int i = 1; i < kW; ++i) m = MaxF(m, v[i]);
  return m;
}
inline float HorizontalSum(vf v) {
  float s = 0.f;
  for (int i = 0; i < kW; ++i) s += v[i];
  return s;
}

// C[MR x NV*kW] (+)= A[MR x K] * B[K x NV*kW]; A(i, k) = a[i * ars + k * acs].
template <int MR, int NV, bool kAccumulate>
inline void Tile(int64_t K, const float* a, int64_t ars, int64_t acs, const float* b, int64_t ldb,
                 float* c, int64_t ldc) {
  vf acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[i][v] = kAccumulate ? Load(c + i * ldc + v * kW) : vf{};
  }
  for (int64_t k = 0; k < K; ++k) {
    vf bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = Load(b + k * ldb + v * kW);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const vf av = Splat(a[i * ars + k * acs]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[i][v] += av * bv[v];
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) Store(c + i * ldc + v * kW, acc[i][v]);
  }
}

// C[M x N] (+)= A[M x K] * B[K x N], B and C row-major; M a multiple of kMR, N of kW.
template <bool kAccumulate>
void Gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t ars, int64_t acs, const float* b,
          int64_t ldb, float* c, int64_t ldc) {
  for (int64_t i = 0; i < M; i += kMR) {
    const float* ai = a + i * ars;
    float* ci = c + i * ldc;
    int64_t j = 0;
    for (; j + kNV * kW <= N; j += kNV * kW) {
      Tile<kMR, kNV, kAccumulate>(K, ai, ars, acs, b + j, ldb, ci + j, ldc);
    }
    for (; j < N; j += kW) Tile<kMR, 1, kAccumulate>(K, ai, ars, acs, b + j, ldb, ci + j, ldc);
  }
}

// Sets the scores of keys a query row may not see to -inf. Row i of the block is query
// position q_first + i; column j is key position k_first + j; valid_n keys exist.
inline void MaskRow(float* srow, int64_t q_pos, int64_t k_first, int64_t valid_n, bool causal) {
  int64_t limit = valid_n;
  if (causal) limit = Min(limit, q_pos - k_first + 1);
  if (limit < 0) limit = 0;
  for (int64_t j = limit; j < kBlockN; ++j) srow[j] = kNegInf;
}

inline int64_t Max(int64_t a, int64_t b) { return a > b ? a : b; }

// kIntervals: keeps columns [c_lo, c_hi) of a score row (key positions relative to the block's
// first key; the block holds valid_n keys) and sets the others to -inf.
inline void MaskRowRange(float* srow, int64_t c_lo, int64_t c_hi, int64_t valid_n) {
  c_lo = Max(c_lo, 0);
  c_hi = Min(c_hi, valid_n);
  if (c_hi < c_lo) c_hi = c_lo;
  for (int64_t j = 0; j < Min(c_lo, kBlockN); ++j) srow[j] = kNegInf;
  for (int64_t j = c_hi; j < kBlockN; ++j) srow[j] = kNegInf;
}

// kIntervals, the tile of query positions [q_first, q_first + rows) x key positions
// [k_first, k_first + valid_n): 0 = no visible pair (skipped), 1 = partly visible (masked
// per element), 2 = every pair visible of a whole block (no mask). Rows' intervals are
// non-decreasing, so the first and last rows bound the rest.
inline int TileVisibility(const int32_t* lo, const int32_t* hi, int64_t q_first, int64_t rows,
                          int64_t k_first, int64_t valid_n) {
  const int64_t q_last = q_first + rows - 1, k_end = k_first + valid_n;
  if (lo[q_first] >= k_end || hi[q_last] <= k_first) return 0;
  if (valid_n == kBlockN && rows == kBlockM && lo[q_last] <= k_first && hi[q_first] >= k_end) {
    return 2;
  }
  for (int64_t r = q_first; r <= q_last; ++r) {
    if (Max(lo[r], k_first) < Min(hi[r], k_end)) return 1;
  }
  return 0;
}

// kIntervals: the blocks [*begin, *end) of `count` blocks of `block` rows starting at
// position row0 that intersect positions [lo, hi).
inline void BlockRange(int64_t lo, int64_t hi, int64_t row0, int64_t rows, int64_t block,
                       int64_t* begin, int64_t* end) {
  const int64_t a = Max(lo, row0) - row0, e = Min(hi, row0 + rows) - row0;
  if (e <= a) {
    *begin = *end = 0;
    return;
  }
  *begin = a / block;
  *end = (e + block - 1) / block;
}

int64_t ForwardScratchFloats(int dp) {
  return int64_t{kBlockM} * kBlockN + int64_t{kBlockM} * dp + 2 * kBlockM;
}

void ForwardTask(const ForwardParams& p, int64_t task, float* scratch) {
  const int64_t dp = p.dp;
  const int64_t nqb = p.m_pad / kBlockM;
  const int64_t qb = nqb - 1 - task % nqb;  // late (heavier under causal) blocks first
  const int64_t bh = task / nqb;
  const int64_t b = bh / p.q_heads, h = bh % p.q_heads;
  const int64_t bkv = b * p.kv_heads + h / (p.q_heads / p.kv_heads);
  const float* q = p.qs + (bh * p.m_pad + qb * kBlockM) * dp;
  const float* kt = p.kt + bkv * p.n_pad * dp;
  const float* v = p.vf + bkv * p.n_pad * dp;

  float* s = scratch;
  float* o = s + kBlockM * kBlockN;
  float* row_max = o + kBlockM * dp;
  float* row_sum = row_max + kBlockM;
  const int64_t rows = Min(kBlockM, p.m - qb * kBlockM);
  const int64_t mr = RoundUp(rows, kMR);
  for (int64_t i = 0; i < mr * dp; ++i) o[i] = 0.f;
  for (int64_t i = 0; i < mr; ++i) row_max[i] = kNegInf, row_sum[i] = 0.f;

  const int64_t q_first = p.q_row0 + qb * kBlockM;
  const int64_t q_last = q_first + rows - 1;
  const bool iv = p.iv.q_lo != nullptr;
  const int32_t* iv_lo = iv ? p.iv.q_lo + b * p.iv.seq : nullptr;
  const int32_t* iv_hi = iv ? p.iv.q_hi + b * p.iv.seq : nullptr;
  int64_t kb_begin = 0, kb_end = p.n_pad / kBlockN;
  if (iv) {
    BlockRange(iv_lo[q_first], iv_hi[q_last], p.kv_row0, p.n, kBlockN, &kb_begin, &kb_end);
  } else if (p.causal) {
    kb_end = q_last < p.kv_row0 ? 0 : Min(kb_end, (q_last - p.kv_row0) / kBlockN + 1);
  }

  for (int64_t kb = kb_begin; kb < kb_end; ++kb) {
    const int64_t k_first = p.kv_row0 + kb * kBlockN;
    const int64_t valid_n = Min(kBlockN, p.n - kb * kBlockN);
    bool need_mask = valid_n < kBlockN || (p.causal && k_first + valid_n - 1 > q_first);
    if (iv) {
      const int vis = TileVisibility(iv_lo, iv_hi, q_first, rows, k_first, valid_n);
      if (vis == 0) continue;  // no visible pair: costs nothing
      need_mask = vis == 1;
    }
    Gemm<false>(mr, kBlockN, dp, q, dp, 1, kt + kb * kBlockN * dp, kBlockN, s, kBlockN);
    for (int64_t i = 0; i < mr; ++i) {
      float* srow = s + i * kBlockN;
      if (need_mask && iv) {
        if (i < rows) {
          MaskRowRange(srow, iv_lo[q_first + i] - k_first, iv_hi[q_first + i] - k_first,
                       valid_n);
        } else {
          MaskRowRange(srow, 0, 0, valid_n);  // padding rows see nothing
        }
      } else if (need_mask) {
        MaskRow(srow, q_first + i, k_first, valid_n, p.causal);
      }
      vf mx = Splat(kNegInf);
      for (int j = 0; j < kBlockN; j += kW) {
        const vf x = Load(srow + j);
        mx = x > mx ? x : mx;
      }
      const float m_new = MaxF(row_max[i], HorizontalMax(mx));
      if (m_new == kNegInf) {  // nothing visible yet: contributes nothing
        for (int j = 0; j < kBlockN; ++j) srow[j] = 0.f;
        continue;
      }
      const float alpha = Exp2(Splat(row_max[i] - m_new))[0];
      vf sum = vf{};
      for (int j = 0; j < kBlockN; j += kW) {
        const vf e = Exp2(Load(srow + j) - m_new);
        Store(srow + j, e);
        sum += e;
      }
      row_sum[i] = row_sum[i] * alpha + HorizontalSum(sum);
      row_max[i] = m_new;
      if (alpha != 1.f) {
        float* orow = o + i * dp;
        for (int64_t d = 0; d < dp; d += kW) Store(orow + d, Load(orow + d) * alpha);
      }
    }
    Gemm<true>(mr, dp, kBlockN, s, kBlockN, 1, v + kb * kBlockN * dp, dp, o, dp);
  }

  float* out = p.out + (bh * p.m_pad + qb * kBlockM) * dp;
  float* lse = p.lse + bh * p.m_pad + qb * kBlockM;
  for (int64_t i = 0; i < kBlockM; ++i) {
    const bool seen = i < rows && row_sum[i] > 0.f;
    const float inv = seen ? 1.f / row_sum[i] : 0.f;
    for (int64_t d = 0; d < dp; d += kW) {
      Store(out + i * dp + d, seen ? Load(o + i * dp + d) * inv : vf{});
    }
    lse[i] = seen ? (row_max[i] + __builtin_log2f(row_sum[i])) * kLn2 : kNegInf;
  }
}

int64_t BackwardScratchFloats(int dp) {
  return 2 * int64_t{kBlockM} * kBlockN + 2 * int64_t{kBlockN} * dp;
}

void BackwardTask(const BackwardParams& p, int64_t task, float* scratch) {
  const int64_t dp = p.dp;
  const int64_t chunk = task % p.chunks;
  const int64_t bkv = task / p.chunks;
  const int64_t b = bkv / p.kv_heads, hkv = bkv % p.kv_heads;
  const int64_t group = p.q_heads / p.kv_heads;
  const int64_t nkb = p.n_pad / kBlockN, nqb = p.m_pad / kBlockM;
  const float* kf = p.kf + bkv * p.n_pad * dp;
  const float* kt = p.kt + bkv * p.n_pad * dp;
  const float* vt = p.vt + bkv * p.n_pad * dp;
  float* pm = scratch;                 // P, [kBlockM][kBlockN]
  float* ds = pm + kBlockM * kBlockN;  // dP, then dS
  float* dk = ds + kBlockM * kBlockN;  // [kBlockN][dp]
  float* dv = dk + kBlockN * dp;

  const bool iv = p.iv.q_lo != nullptr;
  const int32_t* iv_lo = iv ? p.iv.q_lo + b * p.iv.seq : nullptr;
  const int32_t* iv_hi = iv ? p.iv.q_hi + b * p.iv.seq : nullptr;
  for (int64_t kb = chunk; kb < nkb; kb += p.chunks) {
    const int64_t k_first = p.kv_row0 + kb * kBlockN;
    const int64_t valid_n = Min(kBlockN, p.n - kb * kBlockN);
    int64_t qb_begin = 0, qb_end = nqb;
    if (iv) {  // the queries that see any key of the block
      BlockRange(p.iv.k_lo[b * p.iv.seq + k_first], p.iv.k_hi[b * p.iv.seq + k_first + valid_n - 1],
                 p.q_row0, p.m, kBlockM, &qb_begin, &qb_end);
    }
    for (int64_t i = 0; i < kBlockN * dp; ++i) dk[i] = 0.f, dv[i] = 0.f;
    for (int64_t h = hkv * group; h < (hkv + 1) * group; ++h) {
      const int64_t bh = b * p.q_heads + h;
      for (int64_t qb = qb_begin; qb < qb_end; ++qb) {
        const int64_t q_first = p.q_row0 + qb * kBlockM;
        const int64_t rows = Min(kBlockM, p.m - qb * kBlockM);
        int vis = 1;
        if (iv) {
          vis = TileVisibility(iv_lo, iv_hi, q_first, rows, k_first, valid_n);
          if (vis == 0) continue;  // no visible pair: costs nothing
        } else if (p.causal && q_first + rows - 1 < k_first) {
          continue;  // sees none of these keys
        }
        const int64_t mr = RoundUp(rows, kMR);
        const int64_t row0 = bh * p.m_pad + qb * kBlockM;
        const float* q = p.qs + row0 * dp;
        const float* dout = p.dof + row0 * dp;
        const float* lse2 = p.lse2 + row0;
        const float* delta = p.delta + row0;
        float* dq = p.dq_acc + (chunk * p.batch * p.q_heads * p.m_pad + row0) * dp;

        Gemm<false>(mr, kBlockN, dp, q, dp, 1, kt + kb * kBlockN * dp, kBlockN, pm, kBlockN);
        const bool need_mask =
            iv ? vis == 1 : valid_n < kBlockN || (p.causal && k_first + valid_n - 1 > q_first);
        for (int64_t i = 0; i < mr; ++i) {
          float* prow = pm + i * kBlockN;
          if (need_mask && iv) {
            if (i < rows) {
              MaskRowRange(prow, iv_lo[q_first + i] - k_first, iv_hi[q_first + i] - k_first,
                           valid_n);
            } else {
              MaskRowRange(prow, 0, 0, valid_n);
            }
          } else if (need_mask) {
            MaskRow(prow, q_first + i, k_first, valid_n, p.causal);
          }
          for (int j = 0; j < kBlockN; j += kW) Store(prow + j, Exp2(Load(prow + j) - lse2[i]));
        }
        // dV += P^T dO
        Gemm<true>(kBlockN, dp, mr, pm, 1, kBlockN, dout, dp, dv, dp);
        // dP = dO V^T, then dS = P * (dP - D)
        Gemm<false>(mr, kBlockN, dp, dout, dp, 1, vt + kb * kBlockN * dp, kBlockN, ds, kBlockN);
        for (int64_t i = 0; i < mr; ++i) {
          float* drow = ds + i * kBlockN;
          const float* prow = pm + i * kBlockN;
          for (int j = 0; j < kBlockN; j += kW) {
            Store(drow + j, Load(prow + j) * (Load(drow + j) - delta[i]));
          }
        }
        // dK += dS^T Qs (times ln 2 later); dQ += dS K (times scale later)
        Gemm<true>(kBlockN, dp, mr, ds, 1, kBlockN, q, dp, dk, dp);
        Gemm<true>(mr, dp, kBlockN, ds, kBlockN, 1, kf + kb * kBlockN * dp, dp, dq, dp);
      }
    }
    float* dk_out = p.dk_acc + (bkv * p.n_pad + kb * kBlockN) * dp;
    float* dv_out = p.dv_acc + (bkv * p.n_pad + kb * kBlockN) * dp;
    for (int64_t i = 0; i < kBlockN * dp; ++i) dk_out[i] = dk[i], dv_out[i] = dv[i];
  }
}

}  // namespace
}  // namespace DFA_ISA_NS

extern const KernelTable DFA_ISA_TABLE = {
    DFA_ISA_NAME,
    &DFA_ISA_NS::ForwardScratchFloats,
    &DFA_ISA_NS::ForwardTask,
    &DFA_ISA_NS::BackwardScratchFloats,
    &DFA_ISA_NS::BackwardTask,
};

}  // namespace dfa::cpu
