#include "client/shard_io.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/wire/crc32c.h"

namespace dfa::client {
namespace {

std::string RangeStr(const v1::RowRange& r) {
  return absl::StrCat("[", r.begin(), ", ", r.end(), ")");
}

// Copies rows [r0, r1) of batch b of `t`, heads `heads`, into buf (transit layout), or back when
// `to_tensor`.
void CopyRows(HostTensor* t, HeadSlice heads, int b, int64_t r0, int64_t r1, uint8_t* buf,
              bool to_tensor) {
  const int64_t n = r1 - r0;
  const int h0 = heads.First(), nh = heads.Count(t->heads);
  if (t->row_stats) {
    // LSE: tensor [B, H, S] fp32; transit [nh, n] fp32: one run per head.
    for (int h = 0; h < nh; ++h) {
      float* row =
          reinterpret_cast<float*>(t->data()) + (int64_t{b} * t->heads + h0 + h) * t->rows + r0;
      uint8_t* piece = buf + int64_t{h} * n * 4;
      if (to_tensor) {
        std::memcpy(row, piece, static_cast<size_t>(n) * 4);
      } else {
        std::memcpy(piece, row, static_cast<size_t>(n) * 4);
      }
    }
    return;
  }
  uint8_t* base = t->data() + (int64_t{b} * t->rows + r0) * t->row_bytes();
  if (nh == t->heads) {
    const size_t bytes = static_cast<size_t>(n * t->row_bytes());
    if (to_tensor) {
      std::memcpy(base, buf, bytes);
    } else {
      std::memcpy(buf, base, bytes);
    }
    return;
  }
  // A head slice: one run of nh heads per row, rows strided by all heads.
  const int64_t head_bytes = int64_t{t->head_dim} * DTypeSize(t->dtype);
  const size_t run = static_cast<size_t>(nh * head_bytes);
  base += h0 * head_bytes;
  for (int64_t r = 0; r < n; ++r) {
    uint8_t* row = base + r * t->row_bytes();
    uint8_t* piece = buf + r * static_cast<int64_t>(run);
    if (to_tensor) {
      std::memcpy(row, piece, run);
    } else {
      std::memcpy(piece, row, run);
    }
  }
}

}  // namespace

absl::Status ValidateOwned(std::span<const v1::RowRange> owned, int64_t seq_len) {
  int64_t prev_end = 0;
  for (size_t i = 0; i < owned.size(); ++i) {
    const v1::RowRange& r = owned[i];
    if (r.begin() < 0 || r.end() > seq_len || r.begin() >= r.end()) {
      return absl::InvalidArgumentError(absl::StrCat("owned[", i, "] = ", RangeStr(r),
                                                     " is empty or outside [0, ", seq_len, ")"));
    }
    if (i > 0 && r.begin() < prev_end) {
      return absl::InvalidArgumentError(absl::StrCat("owned[", i, "] = ", RangeStr(r),
                                                     " overlaps or precedes owned[", i - 1, "]"));
    }
    prev_end = r.end();
  }
  return absl::OkStatus();
}

int64_t TotalRows(std::span<const v1::RowRange> ranges) {
  int64_t n = 0;
  for (const auto& r : ranges) n += r.end() - r.begin();
  return n;
}

bool IsKvKind(v1::TensorKind kind) {
  return kind == v1::TENSOR_K || kind == v1::TENSOR_V || kind == v1::TENSOR_DK ||
         kind == v1::TENSOR_DV;
}

HeadSlice ShardHeads(const v1::ShardPlacement& shard, v1::TensorKind kind) {
  const v1::HeadRange& r = IsKvKind(kind) ? shard.kv_heads() : shard.q_heads();
  if (r.end() == 0) return HeadSlice{};  // unset: all heads
  return HeadSlice{r.begin(), r.end()};
}

int64_t TransitRowBytes(const HostTensor& t, HeadSlice heads) {
  const int64_t nh = heads.Count(t.heads);
  return t.row_stats ? nh * 4 : nh * t.head_dim * DTypeSize(t.dtype);
}

absl::Status ForEachChunkSpan(const HostTensor& t, std::span<const v1::RowRange> ranges,
                              int64_t chunk_bytes,
                              const std::function<absl::Status(const ChunkSpan&)>& emit,
                              HeadSlice heads) {
  const int64_t row_bytes = TransitRowBytes(t, heads);
  const int64_t rows_per_chunk =
      std::max<int64_t>(1, chunk_bytes / std::max<int64_t>(1, row_bytes));
  for (const auto& range : ranges) {
    for (int b = 0; b < t.batch; ++b) {
      for (int64_t r0 = range.begin(); r0 < range.end(); r0 += rows_per_chunk) {
        RETURN_IF_ERROR(emit(ChunkSpan{b, r0, std::min(range.end(), r0 + rows_per_chunk)}));
      }
    }
  }
  return absl::OkStatus();
}

const uint8_t* ContiguousRows(const HostTensor& t, const ChunkSpan& span, HeadSlice heads) {
  if (t.row_stats) return nullptr;
  if (!heads.IsAll(t.heads) && span.row_end - span.row_begin > 1) return nullptr;
  const int64_t head_bytes = int64_t{t.head_dim} * DTypeSize(t.dtype);
  return t.data() + (int64_t{span.batch} * t.rows + span.row_begin) * t.row_bytes() +
         heads.First() * head_bytes;
}

void GatherRows(const HostTensor& t, const ChunkSpan& span, uint8_t* dst, HeadSlice heads) {
  CopyRows(const_cast<HostTensor*>(&t), heads, span.batch, span.row_begin, span.row_end, dst,
           /*to_tensor=*/false);  // read direction only
}

absl::Status ForEachChunk(const HostTensor& t, v1::TensorKind kind,
                          std::span<const v1::RowRange> ranges, int64_t chunk_bytes,
                          const std::function<absl::Status(v1::TensorChunk&)>& emit,
                          HeadSlice heads) {
  const int64_t row_bytes = TransitRowBytes(t, heads);
  v1::TensorChunk chunk;
  return ForEachChunkSpan(
      t, ranges, chunk_bytes,
      [&](const ChunkSpan& span) {
        chunk.Clear();
        chunk.set_kind(kind);
        chunk.mutable_rows()->set_begin(span.row_begin);
        chunk.mutable_rows()->set_end(span.row_end);
        chunk.set_batch_index(span.batch);
        std::string* data = chunk.mutable_data();
        data->resize(static_cast<size_t>((span.row_end - span.row_begin) * row_bytes));
        GatherRows(t, span, reinterpret_cast<uint8_t*>(data->data()), heads);
        chunk.set_crc32c(Crc32c(data->data(), data->size()));
        return emit(chunk);
      },
      heads);
}

int64_t CountChunks(const HostTensor& t, std::span<const v1::RowRange> ranges, int64_t chunk_bytes,
                    HeadSlice heads) {
  const int64_t rows_per_chunk =
      std::max<int64_t>(1, chunk_bytes / std::max<int64_t>(1, TransitRowBytes(t, heads)));
  int64_t n = 0;
  for (const auto& r : ranges) n += (r.end() - r.begin() + rows_per_chunk - 1) / rows_per_chunk;
  return n * t.batch;
}

namespace {

// The checks every received chunk passes before any byte is written; returns its data size.
absl::StatusOr<int64_t> CheckChunkHeader(v1::TensorKind got_kind, int32_t batch_index,
                                         const v1::RowRange& rows, int64_t data_size,
                                         v1::TensorKind kind, std::span<const v1::RowRange> allowed,
                                         const HostTensor& t, HeadSlice heads) {
  if (got_kind != kind) {
    return absl::InvalidArgumentError(absl::StrCat("chunk.kind: expected ", TensorKindName(kind),
                                                   ", got ", TensorKindName(got_kind)));
  }
  if (batch_index < 0 || batch_index >= t.batch) {
    return absl::OutOfRangeError(
        absl::StrCat("chunk.batch_index ", batch_index, " outside [0, ", t.batch, ")"));
  }
  bool inside = false;
  for (const auto& a : allowed) {
    if (a.begin() <= rows.begin() && rows.end() <= a.end()) inside = true;
  }
  if (rows.begin() >= rows.end() || !inside) {
    return absl::OutOfRangeError(
        absl::StrCat("chunk.rows ", RangeStr(rows), " empty or outside the shard's rows"));
  }
  const int64_t expected = (rows.end() - rows.begin()) * TransitRowBytes(t, heads);
  if (data_size != expected) {
    return absl::InvalidArgumentError(absl::StrCat("chunk.data: ", data_size, " bytes for rows ",
                                                   RangeStr(rows), ", expected ", expected));
  }
  return expected;
}

absl::Status CrcMismatch(v1::TensorKind kind, const v1::RowRange& rows, int32_t batch_index) {
  return absl::DataLossError(absl::StrCat("chunk.crc32c mismatch for ", TensorKindName(kind),
                                          " rows ", RangeStr(rows), " batch ", batch_index));
}

// Copies the pieces to dst and returns their CRC32C: each block is checksummed and copied
// while it sits in L1, so the source is read from memory once.
uint32_t CopyWithCrc32c(const std::vector<BytePiece>& pieces, uint8_t* dst) {
  constexpr size_t kBlock = 16 << 10;
  uint32_t crc = 0;
  for (const BytePiece& p : pieces) {
    for (size_t off = 0; off < p.size; off += kBlock) {
      const size_t n = std::min(kBlock, p.size - off);
      crc = Crc32cExtend(crc, p.data + off, n);
      std::memcpy(dst, p.data + off, n);
      dst += n;
    }
  }
  return crc;
}

}  // namespace

absl::StatusOr<int64_t> ApplyChunk(const v1::TensorChunk& chunk, v1::TensorKind kind,
                                   std::span<const v1::RowRange> allowed, HostTensor* t,
                                   HeadSlice heads) {
  ASSIGN_OR_RETURN(
      const int64_t expected,
      CheckChunkHeader(chunk.kind(), chunk.batch_index(), chunk.rows(),
                       static_cast<int64_t>(chunk.data().size()), kind, allowed, *t, heads));
  const v1::RowRange& rows = chunk.rows();
  const uint32_t crc = Crc32c(chunk.data().data(), chunk.data().size());
  if (crc != chunk.crc32c()) return CrcMismatch(kind, rows, chunk.batch_index());
  CopyRows(t, heads, chunk.batch_index(), rows.begin(), rows.end(),
           reinterpret_cast<uint8_t*>(const_cast<char*>(chunk.data().data())), /*to_tensor=*/true);
  return expected;
}

absl::StatusOr<int64_t> ApplyWireChunk(const WireChunk& chunk, v1::TensorKind kind,
                                       std::span<const v1::RowRange> allowed, HostTensor* t,
                                       HeadSlice heads) {
  v1::RowRange rows;
  rows.set_begin(chunk.row_begin);
  rows.set_end(chunk.row_end);
  ASSIGN_OR_RETURN(const int64_t expected,
                   CheckChunkHeader(chunk.kind, chunk.batch_index, rows, chunk.data_size, kind,
                                    allowed, *t, heads));
  const ChunkSpan span{chunk.batch_index, chunk.row_begin, chunk.row_end};
  if (ContiguousRows(*t, span, heads) == nullptr) {
    // LSE (transit [H, n] vs the tensor's [B, H, S]) or a head slice of several rows: staged,
    // then scattered.
    if (chunk.DataCrc32c() != chunk.crc32c) return CrcMismatch(kind, rows, chunk.batch_index);
    std::vector<uint8_t> staged(static_cast<size_t>(expected));
    chunk.CopyDataTo(staged.data());
    CopyRows(t, heads, chunk.batch_index, rows.begin(), rows.end(), staged.data(),
             /*to_tensor=*/true);
    return expected;
  }
  uint8_t* dst = const_cast<uint8_t*>(ContiguousRows(*t, span, heads));
  if (CopyWithCrc32c(chunk.data, dst) != chunk.crc32c) {
    return CrcMismatch(kind, rows, chunk.batch_index);
  }
  return expected;
}

int64_t BlockBytes(const HostTensor& t, const v1::RowRange& rows, HeadSlice heads) {
  return int64_t{t.batch} * (rows.end() - rows.begin()) * TransitRowBytes(t, heads);
}

void PackBlock(const HostTensor& t, const v1::RowRange& rows, uint8_t* dst, HeadSlice heads) {
  const int64_t per_batch = (rows.end() - rows.begin()) * TransitRowBytes(t, heads);
  HostTensor* mut = const_cast<HostTensor*>(&t);  // read direction only
  for (int b = 0; b < t.batch; ++b) {
    CopyRows(mut, heads, b, rows.begin(), rows.end(), dst + b * per_batch, /*to_tensor=*/false);
  }
}

void UnpackBlock(const uint8_t* src, const v1::RowRange& rows, HostTensor* t, HeadSlice heads) {
  const int64_t per_batch = (rows.end() - rows.begin()) * TransitRowBytes(*t, heads);
  for (int b = 0; b < t->batch; ++b) {
    CopyRows(t, heads, b, rows.begin(), rows.end(), const_cast<uint8_t*>(src) + b * per_batch,
             /*to_tensor=*/true);
  }
}

std::vector<v1::RowRange> SplitRanges(std::span<const v1::RowRange> ranges, int64_t max_rows) {
  max_rows = std::max<int64_t>(1, max_rows);
  std::vector<v1::RowRange> out;
  for (const auto& r : ranges) {
    for (int64_t b = r.begin(); b < r.end(); b += max_rows) {
      v1::RowRange piece;
      piece.set_begin(b);
      piece.set_end(std::min(r.end(), b + max_rows));
      out.push_back(piece);
    }
  }
  return out;
}

}  // namespace dfa::client
