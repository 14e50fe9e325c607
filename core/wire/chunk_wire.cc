#include "core/wire/chunk_wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/wire/crc32c.h"

namespace dfa {
namespace {

constexpr size_t kMaxIdBytes = 1024;
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLength = 2, kFixed32 = 5 };

// Reads protobuf wire format across the slices of a ByteBuffer.
class Cursor {
 public:
  explicit Cursor(const std::vector<grpc::Slice>& slices) : slices_(slices) { Settle(); }

  int64_t pos() const { return pos_; }

  bool ReadByte(uint8_t* b) {
    if (idx_ >= slices_.size()) return false;
    *b = slices_[idx_].begin()[off_];
    Advance(1);
    return true;
  }
  bool ReadVarint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      uint8_t b;
      if (!ReadByte(&b)) return false;
      *v |= uint64_t{b & 0x7fu} << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;  // more than 10 bytes
  }
  // The next n bytes as pieces (no copy); false when fewer remain.
  bool Take(uint64_t n, std::vector<BytePiece>* out) {
    while (n > 0) {
      if (idx_ >= slices_.size()) return false;
      const size_t avail = slices_[idx_].size() - off_;
      const size_t k = n < avail ? static_cast<size_t>(n) : avail;
      if (out) out->push_back({slices_[idx_].begin() + off_, k});
      Advance(k);
      n -= k;
    }
    return true;
  }
  bool Skip(uint32_t wire_type) {
    uint64_t v;
    switch (wire_type) {
      case kVarint:
        return ReadVarint(&v);
      case kFixed64:
        return Take(8, nullptr);
      case kFixed32:
        return Take(4, nullptr);
      case kLength:
        return ReadVarint(&v) && Take(v, nullptr);
      default:
        return false;  // groups are not used by dfa.v1
    }
  }

 private:
  void Advance(size_t k) {
    off_ += k;
    pos_ += static_cast<int64_t>(k);
    Settle();
  }
  void Settle() {
    while (idx_ < slices_.size() && off_ >= slices_[idx_].size()) {
      ++idx_;
      off_ = 0;
    }
  }
  const std::vector<grpc::Slice>& slices_;
  size_t idx_ = 0, off_ = 0;
  int64_t pos_ = 0;
};

absl::Status Malformed(const char* field, const char* what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what, " (malformed message)"));
}

// A length-delimited field's length, checked against what is left of the enclosing message.
absl::Status ReadLength(Cursor* c, int64_t end, const char* field, uint64_t* len) {
  if (!c->ReadVarint(len)) return Malformed(field, "truncated length");
  if (*len > static_cast<uint64_t>(end - c->pos())) return Malformed(field, "length past the end");
  return absl::OkStatus();
}

absl::Status ReadString(Cursor* c, int64_t end, const char* field, std::string* out) {
  uint64_t len;
  RETURN_IF_ERROR(ReadLength(c, end, field, &len));
  if (len > kMaxIdBytes) return Malformed(field, "longer than 1024 bytes");
  std::vector<BytePiece> pieces;
  if (!c->Take(len, &pieces)) return Malformed(field, "truncated");
  out->clear();
  for (const BytePiece& p : pieces) out->append(reinterpret_cast<const char*>(p.data), p.size);
  return absl::OkStatus();
}

absl::Status ParseRows(Cursor* c, int64_t end, WireChunk* ch) {
  while (c->pos() < end) {
    uint64_t tag, v;
    if (!c->ReadVarint(&tag)) return Malformed("chunk.rows", "truncated tag");
    const uint32_t field = static_cast<uint32_t>(tag >> 3), type = tag & 7;
    if ((field == 1 || field == 2) && type == kVarint) {
      if (!c->ReadVarint(&v)) return Malformed("chunk.rows", "truncated value");
      (field == 1 ? ch->row_begin : ch->row_end) = static_cast<int64_t>(v);
    } else if (!c->Skip(type)) {
      return Malformed("chunk.rows", "bad field");
    }
  }
  if (c->pos() != end) return Malformed("chunk.rows", "field past the end");
  return absl::OkStatus();
}

// Parses TensorChunk fields up to `end`.
absl::Status ParseChunk(Cursor* c, int64_t end, WireChunk* ch) {
  *ch = WireChunk{};
  bool have_data = false;
  while (c->pos() < end) {
    uint64_t tag, v;
    if (!c->ReadVarint(&tag)) return Malformed("chunk", "truncated tag");
    const uint32_t field = static_cast<uint32_t>(tag >> 3), type = tag & 7;
    if (type == kVarint && (field == 1 || field == 3 || field == 5)) {
      if (!c->ReadVarint(&v)) return Malformed("chunk", "truncated varint");
      if (field == 1) ch->kind = static_cast<v1::TensorKind>(static_cast<int32_t>(v));
      if (field == 3) ch->batch_index = static_cast<int32_t>(v);
      if (field == 5) ch->crc32c = static_cast<uint32_t>(v);
    } else if (type == kLength && field == 2) {
      uint64_t len;
      RETURN_IF_ERROR(ReadLength(c, end, "chunk.rows", &len));
      RETURN_IF_ERROR(ParseRows(c, c->pos() + static_cast<int64_t>(len), ch));
    } else if (type == kLength && field == 4) {
      if (have_data) return Malformed("chunk.data", "appears twice");
      uint64_t len;
      RETURN_IF_ERROR(ReadLength(c, end, "chunk.data", &len));
      if (!c->Take(len, &ch->data)) return Malformed("chunk.data", "truncated");
      ch->data_size = static_cast<int64_t>(len);
      have_data = true;
    } else if (!c->Skip(type)) {
      return Malformed("chunk", "bad field");
    }
  }
  if (c->pos() != end) return Malformed("chunk", "field past the end");
  return absl::OkStatus();
}

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
void PutTag(std::string* out, uint32_t field, uint32_t type) { PutVarint(out, field << 3 | type); }

// TensorChunk fields before the data bytes (proto3 zero values written too: parsers accept them).
std::string ChunkFields(v1::TensorKind kind, int64_t row_begin, int64_t row_end,
                        int32_t batch_index, uint32_t crc32c, int64_t data_size) {
  std::string rows;
  PutTag(&rows, 1, kVarint);
  PutVarint(&rows, static_cast<uint64_t>(row_begin));
  PutTag(&rows, 2, kVarint);
  PutVarint(&rows, static_cast<uint64_t>(row_end));
  std::string out;
  PutTag(&out, 1, kVarint);
  PutVarint(&out, static_cast<uint64_t>(static_cast<int64_t>(kind)));
  PutTag(&out, 2, kLength);
  PutVarint(&out, rows.size());
  out += rows;
  PutTag(&out, 3, kVarint);
  PutVarint(&out, static_cast<uint64_t>(static_cast<int64_t>(batch_index)));
  PutTag(&out, 5, kVarint);
  PutVarint(&out, crc32c);
  PutTag(&out, 4, kLength);
  PutVarint(&out, static_cast<uint64_t>(data_size));
  return out;
}

}  // namespace

uint32_t WireChunk::DataCrc32c() const {
  uint32_t crc = 0;
  for (const BytePiece& p : data) crc = Crc32cExtend(crc, p.data, p.size);
  return crc;
}

void WireChunk::CopyDataTo(uint8_t* dst) const {
  for (const BytePiece& p : data) {
    std::memcpy(dst, p.data, p.size);
    dst += p.size;
  }
}

absl::Status ChunkFrame::Load(const grpc::ByteBuffer& buffer) {
  slices_.clear();
  session_id_.clear();
  client_id_.clear();
  has_chunk_ = false;
  chunk_ = WireChunk{};
  if (!buffer.Valid()) return absl::InvalidArgumentError("empty message");
  grpc::Status st = buffer.Dump(&slices_);
  if (!st.ok()) return absl::InternalError("cannot read the message buffer");
  return absl::OkStatus();
}

absl::Status ChunkFrame::ParseUploadRequest(const grpc::ByteBuffer& buffer) {
  RETURN_IF_ERROR(Load(buffer));
  const int64_t end = static_cast<int64_t>(buffer.Length());
  Cursor c(slices_);
  while (c.pos() < end) {
    uint64_t tag;
    if (!c.ReadVarint(&tag)) return Malformed("UploadRequest", "truncated tag");
    const uint32_t field = static_cast<uint32_t>(tag >> 3), type = tag & 7;
    if (type == kLength && field == 1) {
      RETURN_IF_ERROR(ReadString(&c, end, "session_id", &session_id_));
    } else if (type == kLength && field == 2) {
      RETURN_IF_ERROR(ReadString(&c, end, "client_id", &client_id_));
    } else if (type == kLength && field == 3) {
      if (has_chunk_) return Malformed("chunk", "appears twice");
      uint64_t len;
      RETURN_IF_ERROR(ReadLength(&c, end, "chunk", &len));
      RETURN_IF_ERROR(ParseChunk(&c, c.pos() + static_cast<int64_t>(len), &chunk_));
      has_chunk_ = true;
    } else if (!c.Skip(type)) {
      return Malformed("UploadRequest", "bad field");
    }
  }
  if (c.pos() != end) return Malformed("UploadRequest", "field past the end");
  return absl::OkStatus();
}

absl::Status ChunkFrame::ParseTensorChunk(const grpc::ByteBuffer& buffer) {
  RETURN_IF_ERROR(Load(buffer));
  Cursor c(slices_);
  RETURN_IF_ERROR(ParseChunk(&c, static_cast<int64_t>(buffer.Length()), &chunk_));
  has_chunk_ = true;
  return absl::OkStatus();
}

std::string EncodeChunkPrefix(v1::TensorKind kind, int64_t row_begin, int64_t row_end,
                              int32_t batch_index, uint32_t crc32c, int64_t data_size) {
  return ChunkFields(kind, row_begin, row_end, batch_index, crc32c, data_size);
}

std::string EncodeUploadPrefix(const std::string& session_id, const std::string& client_id,
                               v1::TensorKind kind, int64_t row_begin, int64_t row_end,
                               int32_t batch_index, uint32_t crc32c, int64_t data_size) {
  const std::string chunk = ChunkFields(kind, row_begin, row_end, batch_index, crc32c, data_size);
  std::string out;
  if (!session_id.empty()) {
    PutTag(&out, 1, kLength);
    PutVarint(&out, session_id.size());
    out += session_id;
  }
  if (!client_id.empty()) {
    PutTag(&out, 2, kLength);
    PutVarint(&out, client_id.size());
    out += client_id;
  }
  PutTag(&out, 3, kLength);
  PutVarint(&out, chunk.size() + static_cast<uint64_t>(data_size));
  out += chunk;
  return out;
}

grpc::ByteBuffer FrameBuffer(const std::string& prefix, grpc::Slice data) {
  grpc::Slice parts[2] = {grpc::Slice(prefix), std::move(data)};
  return grpc::ByteBuffer(parts, 2);
}

grpc::Slice NewDataSlice(size_t bytes, uint8_t** data) {
  grpc::Slice s(bytes);
  *data = const_cast<uint8_t*>(s.begin());  // a fresh slice: ours alone until framed
  return s;
}

}  // namespace dfa
