// Scatter and gather between a client's full host tensors and the shards workers own.
//
// A worker owns one or more global token ranges (ShardPlacement.owned; zigzag layouts own
// several) of a range of the heads (ShardPlacement.q_heads / kv_heads: all heads unless the
// plan splits heads, schedule "heads"). On the gRPC path a tensor's owned rows travel as
// TensorChunks: each chunk covers whole tokens of one batch index inside one owned range, at
// most `chunk_bytes` of data (at least one token), with the CRC32C of its data; a chunk's data
// is [rows, heads in the slice, head_dim] (LSE: fp32 [heads in the slice, rows]). On the
// shared-memory path a range travels as one block laid out [batch, rows, heads in the slice,
// head_dim] (LSE: fp32 [batch, heads in the slice, rows]).
//
// Head slices: every function below takes the HeadSlice of the tensor's heads the shard holds
// (default: all heads). A slice of a BSHD row is contiguous only when it is all heads (or one
// row), so other slices are gathered/scattered by copies; an LSE slice is contiguous per head.
// A slice must lie inside [0, t.heads) (ValidatePlacement in client.cc checks placements).
//
// All functions are pure (no I/O) and thread-compatible: concurrent calls on disjoint rows of
// the same tensor are safe.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "client/host_tensor.h"
#include "dfa/v1/attention.pb.h"
#include "dfa/v1/coordinator.pb.h"
#include "core/status.h"
#include "core/wire/chunk_wire.h"

namespace dfa::client {

inline constexpr int64_t kDefaultChunkBytes = int64_t{4} << 20;

// Heads [begin, end) of a tensor; empty (end <= begin: the default) = all of its heads.
struct HeadSlice {
  int begin = 0;
  int end = 0;
  bool empty() const { return end <= begin; }
  // The first head and the number of heads of the slice in a tensor of `heads` heads.
  int First() const { return empty() ? 0 : begin; }
  int Count(int heads) const { return empty() ? heads : end - begin; }
  bool IsAll(int heads) const { return Count(heads) == heads; }
};

// The heads of `kind` a placement holds: kv_heads for K, V, dK, dV; q_heads for the others
// (Q, O, dO, dQ, LSE). An unset range (end == 0: a coordinator that predates head splits) is
// all heads.
HeadSlice ShardHeads(const v1::ShardPlacement& shard, v1::TensorKind kind);
bool IsKvKind(v1::TensorKind kind);

// The global token ranges a placement owns, validated against the sequence: each range
// non-empty, inside [0, seq_len), sorted and disjoint. INVALID_ARGUMENT naming the range.
absl::Status ValidateOwned(std::span<const v1::RowRange> owned, int64_t seq_len);
// Total tokens of a list of ranges.
int64_t TotalRows(std::span<const v1::RowRange> ranges);

// Bytes of one token of one batch of `t` in transit (BSHD: heads*head_dim*size; LSE: heads*4),
// heads of the slice.
int64_t TransitRowBytes(const HostTensor& t, HeadSlice heads = {});

// Cuts rows `ranges` of `t` into chunks (see above) and hands each to `emit`, in order: range by
// range, batch by batch, rows ascending. `emit` may move the chunk's data away. Stops at and
// returns the first error of `emit`.
absl::Status ForEachChunk(const HostTensor& t, v1::TensorKind kind,
                          std::span<const v1::RowRange> ranges, int64_t chunk_bytes,
                          const std::function<absl::Status(v1::TensorChunk&)>& emit,
                          HeadSlice heads = {});

// Where one chunk lies: rows [row_begin, row_end) of batch `batch`, inside one range.
struct ChunkSpan {
  int batch = 0;
  int64_t row_begin = 0;
  int64_t row_end = 0;
};
// The chunks ForEachChunk would emit, in the same order, without touching data: `emit` gets
// each span. Stops at and returns the first error of `emit`.
absl::Status ForEachChunkSpan(const HostTensor& t, std::span<const v1::RowRange> ranges,
                              int64_t chunk_bytes,
                              const std::function<absl::Status(const ChunkSpan&)>& emit,
                              HeadSlice heads = {});
// The transit bytes of `span` inside `t` when they are one contiguous run (BSHD tensors: a
// chunk is rows of one batch, all heads or one row), so a sender can checksum and send them in
// place; nullptr when the transit layout differs from the tensor's (LSE, a head slice of
// several rows), then GatherRows copies them.
const uint8_t* ContiguousRows(const HostTensor& t, const ChunkSpan& span, HeadSlice heads = {});
// Copies the transit bytes of `span` to dst ((row_end - row_begin) * TransitRowBytes bytes).
void GatherRows(const HostTensor& t, const ChunkSpan& span, uint8_t* dst, HeadSlice heads = {});

// Number of chunks ForEachChunk would emit.
int64_t CountChunks(const HostTensor& t, std::span<const v1::RowRange> ranges, int64_t chunk_bytes,
                    HeadSlice heads = {});

// Writes a received chunk into `t` after checking it: kind == `kind`, batch index in range,
// rows inside one of `allowed`, data size matching its rows, CRC32C matching. Errors:
// INVALID_ARGUMENT / OUT_OF_RANGE naming the field, DATA_LOSS for a checksum mismatch.
// On error nothing is written. Returns the number of data bytes applied.
absl::StatusOr<int64_t> ApplyChunk(const v1::TensorChunk& chunk, v1::TensorKind kind,
                                   std::span<const v1::RowRange> allowed, HostTensor* t,
                                   HeadSlice heads = {});

// ApplyChunk for a chunk parsed in place from the wire (worker/chunk_wire.h): the same checks,
// then its data pieces are copied once into `t` with the CRC32C computed in the same pass
// (blocks of the source checksummed while they are in cache). On a checksum mismatch the rows
// HAVE been written (DATA_LOSS; the caller fails the whole download); on every other error
// nothing is written. Chunks that are not contiguous in `t` (LSE, head slices) are staged and
// checked first: nothing is written on any error.
absl::StatusOr<int64_t> ApplyWireChunk(const WireChunk& chunk, v1::TensorKind kind,
                                       std::span<const v1::RowRange> allowed, HostTensor* t,
                                       HeadSlice heads = {});

// Shared-memory block of rows [begin, end) of `t`: its size, and copies into/out of it.
int64_t BlockBytes(const HostTensor& t, const v1::RowRange& rows, HeadSlice heads = {});
void PackBlock(const HostTensor& t, const v1::RowRange& rows, uint8_t* dst, HeadSlice heads = {});
void UnpackBlock(const uint8_t* src, const v1::RowRange& rows, HostTensor* t, HeadSlice heads = {});

// Splits each range into pieces of at most `max_rows` tokens (at least 1), in order.
std::vector<v1::RowRange> SplitRanges(std::span<const v1::RowRange> ranges, int64_t max_rows);

}  // namespace dfa::client
