// Plain data seen by the per-ISA CPU attention kernels (attention_kernels.cc), and the table
// of entry points each ISA build exports.
//
// The driver (cpu_forward.cc, cpu_backward.cc) packs Q, K, V, dO into fp32 buffers with padded
// head dim (kDimAlign) and rows padded to the block sizes (zeros), then runs one task per
// (batch, head, query block) for forward and per (batch, kv head, kv chunk) for backward.
// Packed layouts (all fp32, dense):
//   qs   [B][Hq][m_pad][dp]    Q * scale * log2(e) (scores come out in the log2 domain)
//   kf   [B][Hkv][n_pad][dp]   K;  vf the same for V
//   kt   [B][Hkv][n_pad/kBlockN][dp][kBlockN]   K transposed per key block; vt the same for V
//   per-row stats [B][Hq][m_pad]
// This header holds no inline functions on purpose: it is included by translation units
// compiled with different -m flags, where a shared inline function could leak an AVX-512 copy
// into code that runs on any x86-64.
#pragma once

#include <cstdint>

namespace dfa::cpu {

inline constexpr int kBlockM = 64;    // query rows per block
inline constexpr int kBlockN = 64;    // key rows per block
inline constexpr int kDimAlign = 16;  // packed head dim is a multiple of this (one AVX-512 vector)

// MaskKind::kIntervals (kernels/attention_backend.h MaskIntervals): per global position of one
// batch row, query p sees keys [q_lo, q_hi) and key p is seen by queries [k_lo, k_hi); row b
// starts at b * seq. Null arrays: the dense mask of `causal`.
struct IntervalParams {
  const int32_t* q_lo;
  const int32_t* q_hi;
  const int32_t* k_lo;
  const int32_t* k_hi;
  int64_t seq;
};

struct ForwardParams {
  const float* qs;
  const float* kt;
  const float* vf;
  float* out;  // [B][Hq][m_pad][dp]: normalised output of the unit (0 for rows seeing no key)
  float* lse;  // [B][Hq][m_pad]: natural-log LSE (-inf for rows seeing no key)
  int batch, q_heads, kv_heads, dp;
  int64_t m, n, m_pad, n_pad, q_row0, kv_row0;
  int causal;
  IntervalParams iv;  // used when iv.q_lo != nullptr (then `causal` is not read)
};

struct BackwardParams {
  const float* qs;
  const float* kf;
  const float* kt;
  const float* vt;
  const float* dof;    // dO packed like qs (unscaled)
  const float* lse2;   // final LSE * log2(e); +inf for padded rows and rows seeing no key
  const float* delta;  // D = rowsum(dO * O); 0 for padded rows
  // Outputs (caller zeroes them). dq_acc holds `chunks` copies [chunks][B][Hq][m_pad][dp]
  // (chunk c of every kv head writes copy c only); dk_acc/dv_acc [B][Hkv][n_pad][dp] are
  // written block by block by the one task that owns the key block. Unscaled: the driver
  // multiplies dq by scale and dk by ln(2).
  float* dq_acc;
  float* dk_acc;
  float* dv_acc;
  int batch, q_heads, kv_heads, dp;
  int64_t m, n, m_pad, n_pad, q_row0, kv_row0;
  int causal;
  IntervalParams iv;  // used when iv.q_lo != nullptr (then `causal` is not read)
  int chunks;  // key blocks of one kv head are dealt round-robin to this many tasks
};

// Entry points of one ISA build. Tasks are independent and may run concurrently; `scratch`
// is private to the calling thread and holds at least *_scratch_floats(dp) floats.
struct KernelTable {
  const char* isa;
  int64_t (*forward_scratch_floats)(int dp);
  // task in [0, B * Hq * (m_pad / kBlockM)).
  void (*forward_task)(const ForwardParams& p, int64_t task, float* scratch);
  int64_t (*backward_scratch_floats)(int dp);
  // task in [0, B * Hkv * chunks).
  void (*backward_task)(const BackwardParams& p, int64_t task, float* scratch);
};

extern const KernelTable kKernelsDefault;  // x86-64 baseline (SSE2)
extern const KernelTable kKernelsAvx2;     // AVX2 + FMA (x86-64 builds only)
extern const KernelTable kKernelsAvx512;   // AVX-512F (x86-64 builds only)

// The widest table this CPU supports; DFA_CPU_ISA=default|avx2|avx512 in the environment caps it
// (kernel_dispatch.cc).
const KernelTable& SelectKernels();

}  // namespace dfa::cpu
