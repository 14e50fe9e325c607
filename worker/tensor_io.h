// Moving client tensors in and out of a session's storage (the client data plane): the chunk
// layouts of dfa.v1.TensorChunk and SharedMemoryTransferRequest, checked against the shard.
//
// Transit layouts (attention.proto): one chunk is rows [r0, r1) of ONE batch:
// [rows, heads, head_dim] in the spec's dtype, or fp32 [heads, rows] for LSE. A shared-memory
// block is rows [r0, r1) of ALL batches: [batch, rows, heads, head_dim] (LSE [batch, heads,
// rows]). "heads" are the heads this worker holds: all, or its range of a head-split plan
// (TransitHeads). Gradients are held in fp32 and converted to the spec's dtype on the way out.
// Every function expects the caller to hold session->mu. Errors name the request field:
// INVALID_ARGUMENT (bad kind, size), OUT_OF_RANGE (rows or batch outside the shard),
// FAILED_PRECONDITION (an output that was never computed).
#pragma once

#include <cstdint>
#include <string>

#include "dfa/v1/attention.pb.h"
#include "core/wire/chunk_wire.h"
#include "worker/session_tensors.h"
#include "worker/worker_session.h"

namespace dfa {

// The global heads a transit row of `kind` covers: the session's q_heads or kv_heads (all of
// the spec's unless the plan splits heads).
HeadRange TransitHeads(const WorkerSession& s, v1::TensorKind kind);
// Bytes of one transit row of `kind`: the heads this worker holds (TransitHeads), not the
// spec's, when the plan splits heads.
int64_t TransitRowBytes(const WorkerSession& s, v1::TensorKind kind);

// Checks and stores one uploaded chunk (Q, K, V or dO only). `field` prefixes error messages
// (e.g. "chunk"). Marks the rows covered and invalidates results computed from older inputs.
// Does NOT check the CRC (the caller does, before).
absl::Status WriteChunk(WorkerSession* s, const v1::TensorChunk& chunk);

// WriteChunk for a chunk read straight off the wire (core/wire/chunk_wire.h): the same checks,
// and the data pieces are copied into the session's storage without an intermediate buffer.
absl::Status WriteWireChunk(WorkerSession* s, const WireChunk& chunk);

// Rows [range.begin, range.end) of batch b of `kind` in transit layout into out[0, n), where
// n = range.size() * TransitRowBytes (one pass; fp32 gradients converted on the way).
absl::Status ReadRowsTo(WorkerSession* s, v1::TensorKind kind, int b, const RowRange& range,
                        uint8_t* out);

// Rows [range.begin, range.end) of batch b of `kind` in transit layout, appended to *out.
// The range must lie inside one owned range.
absl::Status ReadRows(WorkerSession* s, v1::TensorKind kind, int b, const RowRange& range,
                      std::string* out);

// Checks that `kind` may be downloaded now (worker/session_tensors.h).
using session_tensors::CheckReadable;

// Validates `rows` (field name `field`) against the shard and splits it into pieces, each
// inside one owned range. Empty rows (begin == end == 0) select everything owned.
absl::StatusOr<std::vector<RowRange>> ResolveRows(const WorkerSession& s, const v1::RowRange& rows,
                                                  const char* field);

// Shared-memory block of all batches of `rows` (inside one owned range): bytes of the block.
int64_t BlockBytes(const WorkerSession& s, v1::TensorKind kind, const RowRange& rows);
// Copies a block from `src` into the session (upload) or from the session into `dst`.
absl::Status WriteBlock(WorkerSession* s, v1::TensorKind kind, const RowRange& rows,
                        const uint8_t* src);
absl::Status ReadBlock(WorkerSession* s, v1::TensorKind kind, const RowRange& rows, uint8_t* dst);

// Fills Q, K, V (and dO) of the shard with SyntheticValue(seed, ...) of their global rows.
absl::Status GenerateSynthetic(WorkerSession* s, uint64_t seed, bool with_grad_output);

}  // namespace dfa
