#include "client/shard_io.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/crc32c.h"

namespace dfa::client {
namespace {

std::string RangeStr(const v1::RowRange& r) {
  return absl::StrCat("[", r.begin(), ", ", r.end(), ")");
}

// Copies rows [r0, r1) of batch b of `t` into dst (transit layout), or back when `to_tensor`.
void CopyRows(HostTensor* t, int b, int64_t r0, int64_t r1, uint8_t* buf, bool to_tensor) {
  const int64_t n = r1 - r0;
  if (t->row_stats) {
    // LSE: tensor [B, H, S] fp32; transit [H, n] fp32.
    for (int h = 0; h < t->heads; ++h) {
      float* row = reinterpret_cast<float*>(t->data()) + (int64_t{b} * t->heads + h) * t->rows + r0;
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
  const size_t bytes = static_cast<size_t>(n * t->row_bytes());
  if (to_tensor) {
    std::memcpy(base, buf, bytes);
  } else {
    std::memcpy(buf, base, bytes);
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

int64_t TransitRowBytes(const HostTensor& t) {
  return t.row_stats ? int64_t{t.heads} * 4 : t.row_bytes();
}

absl::Status ForEachChunkSpan(const HostTensor& t, std::span<const v1::RowRange> ranges,
                              int64_t chunk_bytes,
                              const std::function<absl::Status(const ChunkSpan&)>& emit) {
  const int64_t row_bytes = TransitRowBytes(t);
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

const uint8_t* ContiguousRows(const HostTensor& t, const ChunkSpan& span) {
  if (t.row_stats) return nullptr;
  return t.data() + (int64_t{span.batch} * t.rows + span.row_begin) * t.row_bytes();
}

void GatherRows(const HostTensor& t, const ChunkSpan& span, uint8_t* dst) {
  CopyRows(const_cast<HostTensor*>(&t), span.batch, span.row_begin, span.row_end, dst,
           /*to_tensor=*/false);  // read direction only
}

absl::Status ForEachChunk(const HostTensor& t, v1::TensorKind kind,
                          std::span<const v1::RowRange> ranges, int64_t chunk_bytes,
                          const std::function<absl::Status(v1::TensorChunk&)>& emit) {
  const int64_t row_bytes = TransitRowBytes(t);
  v1::TensorChunk chunk;
  return ForEachChunkSpan(t, ranges, chunk_bytes, [&](const ChunkSpan& span) {
    chunk.Clear();
    chunk.set_kind(kind);
    chunk.mutable_rows()->set_begin(span.row_begin);
    chunk.mutable_rows()->set_end(span.row_end);
    chunk.set_batch_index(span.batch);
    std::string* data = chunk.mutable_data();
    data->resize(static_cast<size_t>((span.row_end - span.row_begin) * row_bytes));
    GatherRows(t, span, reinterpret_cast<uint8_t*>(data->data()));
    chunk.set_crc32c(Crc32c(data->data(), data->size()));
    return emit(chunk);
  });
}

int64_t CountChunks(const HostTensor& t, std::span<const v1::RowRange> ranges,
                    int64_t chunk_bytes) {
  const int64_t rows_per_chunk =
      std::max<int64_t>(1, chunk_bytes / std::max<int64_t>(1, TransitRowBytes(t)));
  int64_t n = 0;
  for (const auto& r : ranges) n += (r.end() - r.begin() + rows_per_chunk - 1) / rows_per_chunk;
  return n * t.batch;
}

namespace {

// The checks every received chunk passes before any byte is written; returns its data size.
absl::StatusOr<int64_t> CheckChunkHeader(v1::TensorKind got_kind, int32_t batch_index,
                                         const v1::RowRange& rows, int64_t data_size,
                                         v1::TensorKind kind, std::span<const v1::RowRange> allowed,
                                         const HostTensor& t) {
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
  const int64_t expected = (rows.end() - rows.begin()) * TransitRowBytes(t);
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
                                   std::span<const v1::RowRange> allowed, HostTensor* t) {
  ASSIGN_OR_RETURN(const int64_t expected,
                   CheckChunkHeader(chunk.kind(), chunk.batch_index(), chunk.rows(),
                                    static_cast<int64_t>(chunk.data().size()), kind, allowed, *t));
  const v1::RowRange& rows = chunk.rows();
  const uint32_t crc = Crc32c(chunk.data().data(), chunk.data().size());
  if (crc != chunk.crc32c()) return CrcMismatch(kind, rows, chunk.batch_index());
  CopyRows(t, chunk.batch_index(), rows.begin(), rows.end(),
           reinterpret_cast<uint8_t*>(const_cast<char*>(chunk.data().data())), /*to_tensor=*/true);
  return expected;
}

absl::StatusOr<int64_t> ApplyWireChunk(const WireChunk& chunk, v1::TensorKind kind,
                                       std::span<const v1::RowRange> allowed, HostTensor* t) {
  v1::RowRange rows;
  rows.set_begin(chunk.row_begin);
  rows.set_end(chunk.row_end);
  ASSIGN_OR_RETURN(const int64_t expected, CheckChunkHeader(chunk.kind, chunk.batch_index, rows,
                                                            chunk.data_size, kind, allowed, *t));
  if (t->row_stats) {
    // LSE: transit [H, n] differs from the tensor's [B, H, S]; small, so staged.
    if (chunk.DataCrc32c() != chunk.crc32c) return CrcMismatch(kind, rows, chunk.batch_index);
    std::vector<uint8_t> staged(static_cast<size_t>(expected));
    chunk.CopyDataTo(staged.data());
    CopyRows(t, chunk.batch_index, rows.begin(), rows.end(), staged.data(), /*to_tensor=*/true);
    return expected;
  }
  uint8_t* dst = t->data() + (int64_t{chunk.batch_index} * t->rows + rows.begin()) * t->row_bytes();
  if (CopyWithCrc32c(chunk.data, dst) != chunk.crc32c) {
    return CrcMismatch(kind, rows, chunk.batch_index);
  }
  return expected;
}

int64_t BlockBytes(const HostTensor& t, const v1::RowRange& rows) {
  return int64_t{t.batch} * (rows.end() - rows.begin()) * TransitRowBytes(t);
}

void PackBlock(const HostTensor& t, const v1::RowRange& rows, uint8_t* dst) {
  const int64_t per_batch = (rows.end() - rows.begin()) * TransitRowBytes(t);
  HostTensor* mut = const_cast<HostTensor*>(&t);  // read direction only
  for (int b = 0; b < t.batch; ++b) {
    CopyRows(mut, b, rows.begin(), rows.end(), dst + b * per_batch, /*to_tensor=*/false);
  }
}

void UnpackBlock(const uint8_t* src, const v1::RowRange& rows, HostTensor* t) {
  const int64_t per_batch = (rows.end() - rows.begin()) * TransitRowBytes(*t);
  for (int b = 0; b < t->batch; ++b) {
    CopyRows(t, b, rows.begin(), rows.end(), const_cast<uint8_t*>(src) + b * per_batch,
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
