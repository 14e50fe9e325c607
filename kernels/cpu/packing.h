// Conversion of user tensors (BSHD, any dtype, any row stride) to the packed fp32 layouts the
// kernels read (kernel_params.h), and small shared row helpers. Host memory only.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/attention_backend.h"
#include "kernels/cpu/thread_pool.h"

namespace dfa::cpu {

inline int64_t RoundUp(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// Grow-only fp32 buffers reused across calls of one backend (one caller at a time).
struct Workspace {
  std::vector<float> qs, kf, kt, vf, vt, dof, out, lse, lse2, delta, dq, dk, dv;
  std::vector<std::vector<float>> scratch;  // one per pool thread
};

// Makes `v` hold at least n floats and returns its data (contents unspecified).
float* Reserve(std::vector<float>& v, int64_t n);

// dst[b][h][r][d] = t[b, r, h, d] * mul for r < t.rows, d < t.head_dim; zeros up to rows_pad
// rows and dp columns. dst holds B * H * rows_pad * dp floats.
void PackRows(const TensorView& t, float mul, int64_t rows_pad, int dp, float* dst,
              ThreadPool& pool);

// dst[b][h][blk][d][j] = t[b, blk * kBlockN + j, h, d] (zeros past t.rows / head_dim); rows_pad
// a multiple of kBlockN.
void PackTransposed(const TensorView& t, int64_t rows_pad, int dp, float* dst, ThreadPool& pool);

// Merges partial (ob, lb) into (oa, *la) over d floats: LSE-weighted, exact, NaN-free for
// -inf; both -inf leaves oa = 0 and *la = -inf.
void MergeRow(float* oa, float* la, const float* ob, float lb, int d);

}  // namespace dfa::cpu
