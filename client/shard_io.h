// Scatter and gather between a client's full host tensors and the shards workers own.
//
// A worker owns one or more global token ranges (ShardPlacement.owned; zigzag layouts own
// several). On the gRPC path a tensor's owned rows travel as TensorChunks: each chunk covers
// whole tokens of one batch index inside one owned range, at most `chunk_bytes` of data (at
// least one token), with the CRC32C of its data. On the shared-memory path a range travels as
// one block laid out [batch, rows, heads, head_dim] (LSE: fp32 [batch, heads, rows]).
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
#include "kernels/status.h"
#include "worker/chunk_wire.h"

namespace dfa::client {

inline constexpr int64_t kDefaultChunkBytes = int64_t{4} << 20;

// The global token ranges a placement owns, validated against the sequence: each range
// non-empty, inside [0, seq_len), sorted and disjoint. INVALID_ARGUMENT naming the range.
absl::Status ValidateOwned(std::span<const v1::RowRange> owned, int64_t seq_len);
// Total tokens of a list of ranges.
int64_t TotalRows(std::span<const v1::RowRange> ranges);

// Bytes of one token of one batch of `t` in transit (BSHD: heads*head_dim*size; LSE: heads*4).
int64_t TransitRowBytes(const HostTensor& t);

// Cuts rows `ranges` of `t` into chunks (see above) and hands each to `emit`, in order: range by
// range, batch by batch, rows ascending. `emit` may move the chunk's data away. Stops at and
// returns the first error of `emit`.
absl::Status ForEachChunk(const HostTensor& t, v1::TensorKind kind,
                          std::span<const v1::RowRange> ranges, int64_t chunk_bytes,
                          const std::function<absl::Status(v1::TensorChunk&)>& emit);

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
                              const std::function<absl::Status(const ChunkSpan&)>& emit);
// The transit bytes of `span` inside `t` when they are one contiguous run (BSHD tensors: a
// chunk is rows of one batch), so a sender can checksum and send them in place; nullptr when
// the transit layout differs from the tensor's (LSE), then GatherRows copies them.
const uint8_t* ContiguousRows(const HostTensor& t, const ChunkSpan& span);
// Copies the transit bytes of `span` to dst ((row_end - row_begin) * TransitRowBytes bytes).
void GatherRows(const HostTensor& t, const ChunkSpan& span, uint8_t* dst);

// Number of chunks ForEachChunk would emit.
int64_t CountChunks(const HostTensor& t, std::span<const v1::RowRange> ranges, int64_t chunk_bytes);

// Writes a received chunk into `t` after checking it: kind == `kind`, batch index in range,
// rows inside one of `allowed`, data size matching its rows, CRC32C matching. Errors:
// INVALID_ARGUMENT / OUT_OF_RANGE naming the field, DATA_LOSS for a checksum mismatch.
// On error nothing is written. Returns the number of data bytes applied.
absl::StatusOr<int64_t> ApplyChunk(const v1::TensorChunk& chunk, v1::TensorKind kind,
                                   std::span<const v1::RowRange> allowed, HostTensor* t);

// ApplyChunk for a chunk parsed in place from the wire (worker/chunk_wire.h): the same checks,
// then its data pieces are copied once into `t` with the CRC32C computed in the same pass
// (blocks of the source checksummed while they are in cache). On a checksum mismatch the rows
// HAVE been written (DATA_LOSS; the caller fails the whole download); on every other error
// nothing is written.
absl::StatusOr<int64_t> ApplyWireChunk(const WireChunk& chunk, v1::TensorKind kind,
                                       std::span<const v1::RowRange> allowed, HostTensor* t);

// Shared-memory block of rows [begin, end) of `t`: its size, and copies into/out of it.
int64_t BlockBytes(const HostTensor& t, const v1::RowRange& rows);
void PackBlock(const HostTensor& t, const v1::RowRange& rows, uint8_t* dst);
void UnpackBlock(const uint8_t* src, const v1::RowRange& rows, HostTensor* t);

// Splits each range into pieces of at most `max_rows` tokens (at least 1), in order.
std::vector<v1::RowRange> SplitRanges(std::span<const v1::RowRange> ranges, int64_t max_rows);

}  // namespace dfa::client
