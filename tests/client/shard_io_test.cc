// Scatter/gather of shards: chunking, checksums, zigzag layouts, shared-memory blocks.
#include "client/shard_io.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "tests/client/client_test_util.h"
#include "core/wire/chunk_wire.h"
#include "core/wire/crc32c.h"

namespace dfa::client {
namespace {

using test_util::R;
using test_util::Spec;

TEST(ShardIoTest, ChunksCoverOwnedRowsExactlyAndRoundTrip) {
  auto spec = Spec(2, 40, 4, 2, 8);
  auto q = MakeTensor(spec, v1::TENSOR_Q);
  ASSERT_TRUE(q.ok()) << q.status();
  FillRandom(7, &*q);
  // A zigzag-like shard: two ranges.
  std::vector<v1::RowRange> owned = {R(0, 5), R(30, 40)};
  const int64_t row_bytes = 4 * 8 * 2;
  const int64_t chunk_bytes = 3 * row_bytes;  // 3 rows per chunk
  auto out = MakeTensor(spec, v1::TENSOR_Q);
  ASSERT_TRUE(out.ok());
  int64_t chunks = 0;
  std::map<std::pair<int, int64_t>, int> seen;
  absl::Status s = ForEachChunk(*q, v1::TENSOR_Q, owned, chunk_bytes, [&](v1::TensorChunk& c) {
    EXPECT_LE(c.rows().end() - c.rows().begin(), 3);
    EXPECT_EQ(c.crc32c(), Crc32c(c.data().data(), c.data().size()));
    for (int64_t r = c.rows().begin(); r < c.rows().end(); ++r) ++seen[{c.batch_index(), r}];
    ++chunks;
    return ApplyChunk(c, v1::TENSOR_Q, owned, &*out).status();
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(chunks, CountChunks(*q, owned, chunk_bytes));
  EXPECT_EQ(seen.size(), size_t{2 * 15});
  for (const auto& [key, n] : seen) EXPECT_EQ(n, 1);
  // Owned rows equal, the rest untouched (zero).
  for (int b = 0; b < 2; ++b) {
    for (int64_t r = 0; r < 40; ++r) {
      const size_t off = static_cast<size_t>((b * 40 + r) * row_bytes);
      const bool owned_row = r < 5 || r >= 30;
      const bool equal = std::equal(q->bytes.begin() + off, q->bytes.begin() + off + row_bytes,
                                    out->bytes.begin() + off);
      if (owned_row) {
        EXPECT_TRUE(equal) << "batch " << b << " row " << r;
      } else {
        EXPECT_TRUE(std::all_of(out->bytes.begin() + off, out->bytes.begin() + off + row_bytes,
                                [](uint8_t x) { return x == 0; }));
      }
    }
  }
}

TEST(ShardIoTest, LseChunksUseHeadsByRowsLayout) {
  auto spec = Spec(2, 16, 3, 1, 4);
  auto lse = MakeTensor(spec, v1::TENSOR_LSE);
  ASSERT_TRUE(lse.ok());
  float* p = reinterpret_cast<float*>(lse->data());
  for (int64_t i = 0; i < lse->elements(); ++i) p[i] = static_cast<float>(i);
  std::vector<v1::RowRange> owned = {R(4, 10)};
  std::vector<v1::TensorChunk> chunks;
  ASSERT_TRUE(ForEachChunk(*lse, v1::TENSOR_LSE, owned, 1 << 20, [&](v1::TensorChunk& c) {
                chunks.push_back(c);
                return absl::OkStatus();
              }).ok());
  ASSERT_EQ(chunks.size(), 2u);  // one per batch
  const auto& c = chunks[1];
  ASSERT_EQ(c.data().size(), size_t{3 * 6 * 4});
  const float* d = reinterpret_cast<const float*>(c.data().data());
  // element (h, i) of the chunk is lse[b=1, h, 4 + i]
  for (int h = 0; h < 3; ++h) {
    for (int i = 0; i < 6; ++i) EXPECT_EQ(d[h * 6 + i], p[(1 * 3 + h) * 16 + 4 + i]);
  }
}

TEST(ShardIoTest, ApplyChunkRejectsBadChunksWithoutWriting) {
  auto spec = Spec(1, 8, 2, 2, 4);
  auto t = MakeTensor(spec, v1::TENSOR_K);
  ASSERT_TRUE(t.ok());
  std::vector<v1::RowRange> owned = {R(0, 4)};
  v1::TensorChunk c;
  c.set_kind(v1::TENSOR_K);
  *c.mutable_rows() = R(0, 2);
  c.set_data(std::string(2 * 2 * 4 * 2, '\x11'));
  c.set_crc32c(Crc32c(c.data().data(), c.data().size()));
  ASSERT_TRUE(ApplyChunk(c, v1::TENSOR_K, owned, &*t).ok());

  auto bad = c;
  bad.set_crc32c(c.crc32c() ^ 1);
  EXPECT_EQ(ApplyChunk(bad, v1::TENSOR_K, owned, &*t).status().code(), absl::StatusCode::kDataLoss);
  bad = c;
  *bad.mutable_rows() = R(3, 5);
  auto s = ApplyChunk(bad, v1::TENSOR_K, owned, &*t).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("chunk.rows"), std::string::npos) << s;
  bad = c;
  bad.set_kind(v1::TENSOR_V);
  EXPECT_NE(ApplyChunk(bad, v1::TENSOR_K, owned, &*t).status().message().find("chunk.kind"),
            std::string::npos);
  bad = c;
  bad.set_batch_index(1);
  EXPECT_EQ(ApplyChunk(bad, v1::TENSOR_K, owned, &*t).status().code(),
            absl::StatusCode::kOutOfRange);
  bad = c;
  bad.set_data(c.data() + "x");
  bad.set_crc32c(Crc32c(bad.data().data(), bad.data().size()));
  s = ApplyChunk(bad, v1::TENSOR_K, owned, &*t).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("chunk.data"), std::string::npos);
  // Rows 2..3 were never written by the rejected chunks.
  EXPECT_EQ(t->bytes[2 * 2 * 4 * 2], 0);
}

// A chunk as it arrives off the wire: serialized, cut into several slices (as gRPC may deliver
// it), parsed in place.
absl::StatusOr<int64_t> ApplyFromWire(const v1::TensorChunk& c, v1::TensorKind kind,
                                      std::span<const v1::RowRange> allowed, HostTensor* t) {
  const std::string wire = c.SerializeAsString();
  const size_t a = wire.size() / 3, b = 2 * wire.size() / 3;
  grpc::Slice parts[3] = {grpc::Slice(wire.data(), a), grpc::Slice(wire.data() + a, b - a),
                          grpc::Slice(wire.data() + b, wire.size() - b)};
  grpc::ByteBuffer buffer(parts, 3);
  ChunkFrame frame;
  RETURN_IF_ERROR(frame.ParseTensorChunk(buffer));
  return ApplyWireChunk(frame.chunk(), kind, allowed, t);
}

TEST(ShardIoTest, WireChunksRoundTripLikeProtoChunks) {
  auto spec = Spec(2, 40, 4, 2, 8);
  for (v1::TensorKind kind : {v1::TENSOR_Q, v1::TENSOR_LSE}) {
    auto in = MakeTensor(spec, kind);
    ASSERT_TRUE(in.ok());
    for (size_t i = 0; i < in->bytes.size(); ++i) in->bytes[i] = static_cast<uint8_t>(i * 37 + 1);
    std::vector<v1::RowRange> owned = {R(0, 5), R(30, 40)};
    auto out = MakeTensor(spec, kind);
    ASSERT_TRUE(out.ok());
    int64_t bytes = 0;
    ASSERT_TRUE(ForEachChunk(*in, kind, owned, 3 * TransitRowBytes(*in), [&](v1::TensorChunk& c) {
                  auto n = ApplyFromWire(c, kind, owned, &*out);
                  if (n.ok()) bytes += *n;
                  return n.status();
                }).ok());
    EXPECT_EQ(bytes, 2 * 15 * TransitRowBytes(*in));
    auto expect = MakeTensor(spec, kind);
    ASSERT_TRUE(expect.ok());
    ASSERT_TRUE(ForEachChunk(*in, kind, owned, 1 << 20, [&](v1::TensorChunk& c) {
                  return ApplyChunk(c, kind, owned, &*expect).status();
                }).ok());
    EXPECT_EQ(out->bytes, expect->bytes) << TensorKindName(kind);
  }
}

TEST(ShardIoTest, WireChunkChecksNameTheField) {
  auto spec = Spec(1, 8, 2, 2, 4);
  auto t = MakeTensor(spec, v1::TENSOR_K);
  ASSERT_TRUE(t.ok());
  std::vector<v1::RowRange> owned = {R(0, 4)};
  v1::TensorChunk c;
  c.set_kind(v1::TENSOR_K);
  *c.mutable_rows() = R(0, 2);
  c.set_data(std::string(2 * 2 * 4 * 2, '\x11'));
  c.set_crc32c(Crc32c(c.data().data(), c.data().size()));
  ASSERT_TRUE(ApplyFromWire(c, v1::TENSOR_K, owned, &*t).ok());
  EXPECT_EQ(t->bytes[0], 0x11);
  auto bad = c;
  bad.set_crc32c(c.crc32c() ^ 1);
  EXPECT_EQ(ApplyFromWire(bad, v1::TENSOR_K, owned, &*t).status().code(),
            absl::StatusCode::kDataLoss);
  bad = c;
  *bad.mutable_rows() = R(3, 5);
  auto s = ApplyFromWire(bad, v1::TENSOR_K, owned, &*t).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("chunk.rows"), std::string::npos) << s;
  bad = c;
  bad.set_kind(v1::TENSOR_V);
  EXPECT_NE(ApplyFromWire(bad, v1::TENSOR_K, owned, &*t).status().message().find("chunk.kind"),
            std::string::npos);
  bad = c;
  bad.set_data(c.data() + "x");
  bad.set_crc32c(Crc32c(bad.data().data(), bad.data().size()));
  s = ApplyFromWire(bad, v1::TENSOR_K, owned, &*t).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("chunk.data"), std::string::npos);
  EXPECT_EQ(t->bytes[2 * 2 * 4 * 2], 0);  // rows 2..3 never written
}

TEST(ShardIoTest, ChunkSpansMatchChunksAndPointIntoTheTensor) {
  auto spec = Spec(2, 20, 2, 2, 4);
  auto q = MakeTensor(spec, v1::TENSOR_Q);
  ASSERT_TRUE(q.ok());
  FillRandom(5, &*q);
  std::vector<v1::RowRange> owned = {R(2, 9), R(15, 20)};
  const int64_t chunk_bytes = 3 * q->row_bytes();
  std::vector<v1::TensorChunk> chunks;
  ASSERT_TRUE(ForEachChunk(*q, v1::TENSOR_Q, owned, chunk_bytes, [&](v1::TensorChunk& c) {
                chunks.push_back(c);
                return absl::OkStatus();
              }).ok());
  size_t i = 0;
  ASSERT_TRUE(ForEachChunkSpan(*q, owned, chunk_bytes, [&](const ChunkSpan& s) {
                EXPECT_LT(i, chunks.size());
                if (i >= chunks.size()) return absl::InternalError("too many spans");
                const v1::TensorChunk& c = chunks[i++];
                EXPECT_EQ(s.batch, c.batch_index());
                EXPECT_EQ(s.row_begin, c.rows().begin());
                EXPECT_EQ(s.row_end, c.rows().end());
                const uint8_t* p = ContiguousRows(*q, s);
                EXPECT_NE(p, nullptr);
                EXPECT_EQ(std::string(reinterpret_cast<const char*>(p), c.data().size()), c.data());
                return absl::OkStatus();
              }).ok());
  EXPECT_EQ(i, chunks.size());
  auto lse = MakeTensor(spec, v1::TENSOR_LSE);
  ASSERT_TRUE(lse.ok());
  EXPECT_EQ(ContiguousRows(*lse, ChunkSpan{0, 2, 5}), nullptr);
}

TEST(ShardIoTest, BlocksPackAndUnpackAllBatches) {
  auto spec = Spec(3, 10, 2, 1, 4);
  auto v = MakeTensor(spec, v1::TENSOR_V);
  ASSERT_TRUE(v.ok());
  FillRandom(3, &*v);
  const v1::RowRange rows = R(2, 7);
  std::vector<uint8_t> block(static_cast<size_t>(BlockBytes(*v, rows)));
  EXPECT_EQ(block.size(), size_t{3 * 5 * 1 * 4 * 2});
  PackBlock(*v, rows, block.data());
  auto back = MakeTensor(spec, v1::TENSOR_V);
  ASSERT_TRUE(back.ok());
  UnpackBlock(block.data(), rows, &*back);
  const int64_t rb = back->row_bytes();
  for (int b = 0; b < 3; ++b) {
    for (int64_t r = 2; r < 7; ++r) {
      const size_t off = static_cast<size_t>((b * 10 + r) * rb);
      EXPECT_TRUE(std::equal(v->bytes.begin() + off, v->bytes.begin() + off + rb,
                             back->bytes.begin() + off));
    }
  }
}

TEST(ShardIoTest, ValidateOwnedNamesTheBadRange) {
  std::vector<v1::RowRange> ok = {R(0, 4), R(8, 12)};
  EXPECT_TRUE(ValidateOwned(ok, 12).ok());
  std::vector<v1::RowRange> overlap = {R(0, 6), R(4, 8)};
  auto s = ValidateOwned(overlap, 12);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("owned[1]"), std::string::npos) << s;
  std::vector<v1::RowRange> outside = {R(10, 13)};
  EXPECT_FALSE(ValidateOwned(outside, 12).ok());
  EXPECT_EQ(TotalRows(ok), 8);
}

TEST(ShardIoTest, SplitRangesKeepsOrderAndBound) {
  std::vector<v1::RowRange> in = {R(0, 5), R(10, 11)};
  auto out = SplitRanges(in, 2);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].begin(), 0);
  EXPECT_EQ(out[2].end(), 5);
  EXPECT_EQ(out[3].begin(), 10);
  EXPECT_EQ(out[3].end(), 11);
}

TEST(HostTensorTest, SpecValidationNamesTheField) {
  auto spec = Spec(1, 16, 6, 4, 8);
  auto s = ValidateSpec(spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("q_heads"), std::string::npos) << s;
  spec = Spec(0, 16, 4, 4, 8);
  EXPECT_NE(ValidateSpec(spec).message().find("spec.batch"), std::string::npos);
  spec = Spec(1, -1, 4, 4, 8);
  EXPECT_NE(ValidateSpec(spec).message().find("spec.seq_len"), std::string::npos);
  spec = Spec(1, 16, 4, 4, 8);
  spec.set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_NE(ValidateSpec(spec).message().find("spec.dtype"), std::string::npos);
}

TEST(HostTensorTest, ShapesFollowTheKind) {
  auto spec = Spec(2, 16, 8, 2, 32);
  auto k = MakeTensor(spec, v1::TENSOR_DK);
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(k->heads, 2);
  EXPECT_EQ(k->size_bytes(), 2 * 16 * 2 * 32 * 2);
  auto lse = MakeTensor(spec, v1::TENSOR_LSE);
  ASSERT_TRUE(lse.ok());
  EXPECT_TRUE(lse->row_stats);
  EXPECT_EQ(lse->size_bytes(), 2 * 8 * 16 * 4);
  // Same seed, same values; different seed, different values.
  auto a = MakeTensor(spec, v1::TENSOR_Q), b = MakeTensor(spec, v1::TENSOR_Q);
  FillRandom(1, &*a);
  FillRandom(1, &*b);
  EXPECT_EQ(a->bytes, b->bytes);
  FillRandom(2, &*b);
  EXPECT_NE(a->bytes, b->bytes);
}

}  // namespace
}  // namespace dfa::client
