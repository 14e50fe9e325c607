// The client data plane's chunks on the wire without the protobuf copy of their data.
//
// A dfa.v1.TensorChunk (attention.proto) or an UploadRequest carrying one is read straight out
// of the grpc::ByteBuffer gRPC received (ChunkFrame: the data field becomes a list of pieces
// pointing into the buffer's slices, so it is copied once, into its destination) and written
// as a small serialized prefix followed by a data slice the sender filled in place
// (EncodeChunkPrefix + FrameBuffer). The bytes are ordinary protobuf wire format: peers using
// the generated message classes read and write the same messages.
//
// Threads: thread-compatible (one ChunkFrame per thread). Errors: INVALID_ARGUMENT naming the
// malformed field ("chunk.rows: truncated", ...). Nothing here checks values against a shard.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "dfa/v1/attention.pb.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace dfa {

struct BytePiece {
  const uint8_t* data;
  size_t size;
};

// A TensorChunk's fields; `data` points into the ChunkFrame that parsed it.
struct WireChunk {
  v1::TensorKind kind = v1::TENSOR_KIND_UNSPECIFIED;
  int64_t row_begin = 0;
  int64_t row_end = 0;
  int32_t batch_index = 0;
  uint32_t crc32c = 0;
  int64_t data_size = 0;
  std::vector<BytePiece> data;  // in order; sizes sum to data_size

  // CRC32C of the data (over the pieces, no copy).
  uint32_t DataCrc32c() const;
  // Copies the data_size bytes to dst.
  void CopyDataTo(uint8_t* dst) const;
};

class ChunkFrame {
 public:
  // Parses `buffer` as a serialized dfa.v1.UploadRequest (session_id, client_id, chunk).
  absl::Status ParseUploadRequest(const grpc::ByteBuffer& buffer);
  // Parses `buffer` as a serialized dfa.v1.TensorChunk.
  absl::Status ParseTensorChunk(const grpc::ByteBuffer& buffer);

  const std::string& session_id() const { return session_id_; }
  const std::string& client_id() const { return client_id_; }
  bool has_chunk() const { return has_chunk_; }
  const WireChunk& chunk() const { return chunk_; }

 private:
  absl::Status Load(const grpc::ByteBuffer& buffer);

  std::vector<grpc::Slice> slices_;  // keeps the pieces alive
  std::string session_id_, client_id_;
  bool has_chunk_ = false;
  WireChunk chunk_;
};

// Serialized TensorChunk fields kind, rows, batch_index, crc32c, then the tag and length of
// `data`: appending data_size bytes of data makes a complete TensorChunk.
std::string EncodeChunkPrefix(v1::TensorKind kind, int64_t row_begin, int64_t row_end,
                              int32_t batch_index, uint32_t crc32c, int64_t data_size);
// The same chunk inside an UploadRequest (session_id / client_id written when non-empty).
std::string EncodeUploadPrefix(const std::string& session_id, const std::string& client_id,
                               v1::TensorKind kind, int64_t row_begin, int64_t row_end,
                               int32_t batch_index, uint32_t crc32c, int64_t data_size);
// One message of `prefix` followed by `data` (the data slice is referenced, not copied).
grpc::ByteBuffer FrameBuffer(const std::string& prefix, grpc::Slice data);
// A writable slice of `bytes` bytes (the sender fills it, then hands it to FrameBuffer).
grpc::Slice NewDataSlice(size_t bytes, uint8_t** data);

}  // namespace dfa
