// core/wire/chunk_wire.h: chunks written by the raw encoder parse with the generated protobuf
// classes and vice versa, over any split of the message into slices; malformed bytes (every
// truncation of a valid message, random garbage, lengths past the end) are INVALID_ARGUMENT,
// never a crash or a read past the buffer.
#include "core/wire/chunk_wire.h"

#include <random>
#include <string>
#include <vector>

#include "dfa/v1/worker.pb.h"
#include "gtest/gtest.h"
#include "core/wire/crc32c.h"

namespace dfa {
namespace {

// `bytes` as a ByteBuffer cut into slices at the given (ascending) offsets.
grpc::ByteBuffer Buffer(const std::string& bytes, const std::vector<size_t>& cuts = {}) {
  std::vector<grpc::Slice> slices;
  size_t prev = 0;
  for (size_t c : cuts) {
    slices.emplace_back(bytes.data() + prev, c - prev);
    prev = c;
  }
  slices.emplace_back(bytes.data() + prev, bytes.size() - prev);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Flatten(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::string out;
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

std::string Data(size_t n) {
  std::string d(n, '\0');
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<char>(i * 37 + 11);
  return d;
}

TEST(ChunkWireTest, RawUploadRequestParsesWithProtobufAndBack) {
  const std::string data = Data(1000);
  const uint32_t crc = Crc32c(data.data(), data.size());
  uint8_t* p;
  grpc::Slice slice = NewDataSlice(data.size(), &p);
  std::memcpy(p, data.data(), data.size());
  const grpc::ByteBuffer raw = FrameBuffer(
      EncodeUploadPrefix("sess", "cli", v1::TENSOR_K, 300, 310, 2, crc, 1000), std::move(slice));
  v1::UploadRequest m;
  ASSERT_TRUE(m.ParseFromString(Flatten(raw)));
  EXPECT_EQ(m.session_id(), "sess");
  EXPECT_EQ(m.client_id(), "cli");
  EXPECT_EQ(m.chunk().kind(), v1::TENSOR_K);
  EXPECT_EQ(m.chunk().rows().begin(), 300);
  EXPECT_EQ(m.chunk().rows().end(), 310);
  EXPECT_EQ(m.chunk().batch_index(), 2);
  EXPECT_EQ(m.chunk().crc32c(), crc);
  EXPECT_EQ(m.chunk().data(), data);

  // Generated serialisation -> ChunkFrame, whatever the slice boundaries.
  const std::string bytes = m.SerializeAsString();
  for (std::vector<size_t> cuts : std::vector<std::vector<size_t>>{
           {}, {1}, {5, 6, 7}, {bytes.size() / 2}, {20, 21, 500, 900, bytes.size() - 1}}) {
    ChunkFrame f;
    ASSERT_TRUE(f.ParseUploadRequest(Buffer(bytes, cuts)).ok());
    EXPECT_EQ(f.session_id(), "sess");
    EXPECT_EQ(f.client_id(), "cli");
    ASSERT_TRUE(f.has_chunk());
    const WireChunk& c = f.chunk();
    EXPECT_EQ(c.kind, v1::TENSOR_K);
    EXPECT_EQ(c.row_begin, 300);
    EXPECT_EQ(c.row_end, 310);
    EXPECT_EQ(c.batch_index, 2);
    EXPECT_EQ(c.crc32c, crc);
    ASSERT_EQ(c.data_size, 1000);
    EXPECT_EQ(c.DataCrc32c(), crc);
    std::string copy(1000, '\0');
    c.CopyDataTo(reinterpret_cast<uint8_t*>(copy.data()));
    EXPECT_EQ(copy, data);
  }
}

TEST(ChunkWireTest, TensorChunkRoundTripAndHeaderOnlyRequest) {
  const std::string data = Data(64);
  const std::string prefix =
      EncodeChunkPrefix(v1::TENSOR_LSE, 0, 16, 0, Crc32c(data.data(), data.size()), 64);
  v1::TensorChunk c;
  ASSERT_TRUE(c.ParseFromString(prefix + data));
  EXPECT_EQ(c.kind(), v1::TENSOR_LSE);
  EXPECT_EQ(c.data(), data);
  ChunkFrame f;
  ASSERT_TRUE(f.ParseTensorChunk(Buffer(prefix + data, {3})).ok());
  EXPECT_EQ(f.chunk().data_size, 64);

  v1::UploadRequest header_only;
  header_only.set_session_id("s");
  ASSERT_TRUE(f.ParseUploadRequest(Buffer(header_only.SerializeAsString())).ok());
  EXPECT_FALSE(f.has_chunk());
  EXPECT_EQ(f.session_id(), "s");
}

TEST(ChunkWireTest, EveryTruncationAndGarbageIsAnErrorNotACrash) {
  v1::UploadRequest m;
  m.set_session_id("session");
  m.set_client_id("client");
  m.mutable_chunk()->set_kind(v1::TENSOR_Q);
  m.mutable_chunk()->mutable_rows()->set_begin(5);
  m.mutable_chunk()->mutable_rows()->set_end(9);
  m.mutable_chunk()->set_data(Data(200));
  m.mutable_chunk()->set_crc32c(7);
  const std::string bytes = m.SerializeAsString();
  ChunkFrame f;
  for (size_t n = 1; n < bytes.size(); ++n) {
    const absl::Status st = f.ParseUploadRequest(Buffer(bytes.substr(0, n), {n / 2}));
    // A prefix can end exactly after a complete field; then it is a valid, shorter message.
    if (st.ok()) continue;
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << n << ": " << st;
  }
  std::mt19937 rng(1);
  int errors = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string junk(1 + rng() % 64, '\0');
    for (char& ch : junk) ch = static_cast<char>(rng());
    const absl::Status st = f.ParseUploadRequest(Buffer(junk));
    if (!st.ok()) {
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
      ++errors;
    }
  }
  EXPECT_GT(errors, 1000);
  // A data length far past the end, and a chunk appearing twice, name their field.
  const std::string huge = EncodeUploadPrefix("s", "c", v1::TENSOR_Q, 0, 1, 0, 0, int64_t{1} << 40);
  absl::Status st = f.ParseUploadRequest(Buffer(huge + "xy"));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("chunk"), std::string::npos) << st;
  const std::string one = EncodeUploadPrefix("", "", v1::TENSOR_Q, 0, 1, 0, 0, 2) + "ab";
  st = f.ParseUploadRequest(Buffer(one + one));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("appears twice"), std::string::npos) << st;
}

}  // namespace
}  // namespace dfa
