// Seeded synthetic attention inputs (GenerateInputs): every element is a pure function of
// (seed, tensor kind, batch, GLOBAL row, GLOBAL head, d), so the same seed gives the same global
// tensors whatever the sharding (by rows or by heads), and a client (or a test) can regenerate
// any part of them.
//
// Values are uniform in [-1, 1) (then rounded to the tensor's dtype). Thread-safe, no state.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace dfa {

// Element (batch, row, head, d) of tensor `kind` (the dfa.v1.TensorKind number) for `seed`.
float SyntheticValue(uint64_t seed, int kind, int64_t batch, int64_t row, int64_t head,
                     int64_t d);

// Fills a dense BSHD host buffer [batch, n_rows, heads, head_dim] of `dtype` with the values of
// global rows [row0, row0 + n_rows) and global heads [head0, head0 + heads) of tensor `kind`
// (a head-split shard holds a slice of the heads: its local head h is global head head0 + h).
void FillSynthetic(uint64_t seed, int kind, int batch, int64_t row0, int64_t n_rows, int head0,
                   int heads, int head_dim, DType dtype, void* dst);
// All heads from 0: FillSynthetic(..., /*head0=*/0, heads, ...).
void FillSynthetic(uint64_t seed, int kind, int batch, int64_t row0, int64_t n_rows, int heads,
                   int head_dim, DType dtype, void* dst);

}  // namespace dfa
