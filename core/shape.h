// The per-token shape of an attention session: everything but the sequence length. One type for
// the planner (bytes of a plan's rows), the coordinator (admission) and the workers (storage).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/status.h"

namespace dfa {

// The largest head_dim any backend computes.
inline constexpr int kMaxHeadDim = 512;

struct AttentionShape {
  int batch = 1;
  int q_heads = 1;
  int kv_heads = 1;
  int head_dim = 128;
  DType dtype = DType::kBF16;

  // INVALID_ARGUMENT worded as ValidateSpec's (core/spec_validation.h) without the "spec."
  // prefix, "<field>: <what>, got <value>": batch/heads/head_dim < 1, q_heads % kv_heads != 0,
  // head_dim > kMaxHeadDim.
  absl::Status Validate() const;
};

// What a worker's session storage holds for `rows` owned rows (worker/executor/session_storage.h,
// docs/memory.md). Persistent: Q, K, V, dO in the session's dtype and LSE, D in fp32; and one
// *work region* that holds, in turn,
//   after a forward     O (session dtype) at offset 0;
//   during a forward    O and, when the forward merges partials (StorageLayout::
//                       forward_accumulator), O's fp32 accumulator after it;
//   during a backward   the fp32 dQ accumulator at offset 0 (over O, which the backward reads
//                       first, into D) and, unless the backward runs in key chunks
//                       (!StorageLayout::kv_accumulators), fp32 dK and dV after it.
// At the end of a backward the gradients are converted into the session dtype INTO the inputs'
// slots: dQ into Q's, dK into K's, dV into V's (the inputs are consumed).
struct StorageLayout {
  bool forward_accumulator = true;  // the forward merges into an fp32 O (dtype != f32)
  bool kv_accumulators = true;      // the backward keeps fp32 dK, dV of all owned rows
};

// Byte sizes and offsets (every block and offset a multiple of kStorageAlign).
inline constexpr int64_t kStorageAlign = 256;
struct StorageBytes {
  int64_t q = 0, kv = 0, dout = 0, stat = 0;  // one Q / one K (= V) / dO / one of LSE, D
  int64_t o = 0;                               // O in the work region, at offset 0
  int64_t o_acc_offset = -1;                   // fp32 O accumulator (-1: none)
  int64_t dq_acc = 0;                          // fp32 dQ, at offset 0
  int64_t dk_acc_offset = -1, dv_acc_offset = -1;  // fp32 dK, dV (-1: key chunks instead)
  int64_t work = 0;                            // the work region
  int64_t total = 0;                           // q + 2 kv + dout + 2 stat + work
};
StorageBytes SessionStorageLayout(const AttentionShape& shape, int64_t rows,
                                  const StorageLayout& layout);

// Bytes a worker's session storage holds for `rows` owned rows of `shape` with the widest work
// region (forward accumulator and fp32 dK, dV): SessionStorageLayout(...).total.
int64_t SessionStorageBytes(const AttentionShape& shape, int64_t rows);

// fp32 dK and dV of `rows` key rows (one key chunk of a chunked backward, all batches).
int64_t KeyChunkBytes(const AttentionShape& shape, int64_t rows);

}  // namespace dfa
