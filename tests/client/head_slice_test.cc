// Scatter/gather by (rows, heads) for head-split sessions (schedule "heads"): a shard holds all
// rows of a range of the heads. Chunks, wire chunks and shared-memory blocks of a head slice
// carry exactly those heads; slices of all shards together rebuild the tensor; placements that
// hold a (token, head) twice or never are refused naming the shard.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "client/placement.h"
#include "client/shard_io.h"
#include "tests/client/client_test_util.h"
#include "core/wire/chunk_wire.h"
#include "core/wire/crc32c.h"

namespace dfa::client {
namespace {

using test_util::R;
using test_util::Spec;

HostTensor Filled(const v1::AttentionSpec& spec, v1::TensorKind kind) {
  auto t = MakeTensor(spec, kind);
  EXPECT_TRUE(t.ok()) << t.status();
  for (size_t i = 0; i < t->bytes.size(); ++i) t->bytes[i] = static_cast<uint8_t>(i * 131 + 7);
  return *std::move(t);
}

// The transit bytes of rows [r0, r1) of batch b, heads [h0, h1), computed element by element
// from the layouts in attention.proto (BSHD rows; LSE [B, H, S] -> [heads, rows]).
std::string Expected(const HostTensor& t, int b, int64_t r0, int64_t r1, int h0, int h1) {
  std::string out;
  const int64_t e = t.row_stats ? 4 : DTypeSize(t.dtype);
  auto at = [&](int64_t elem) {
    return std::string(reinterpret_cast<const char*>(t.data()) + elem * e, static_cast<size_t>(e));
  };
  if (t.row_stats) {
    for (int h = h0; h < h1; ++h) {
      for (int64_t r = r0; r < r1; ++r) out += at((int64_t{b} * t.heads + h) * t.rows + r);
    }
    return out;
  }
  for (int64_t r = r0; r < r1; ++r) {
    for (int h = h0; h < h1; ++h) {
      for (int d = 0; d < t.head_dim; ++d) {
        out += at(((int64_t{b} * t.rows + r) * t.heads + h) * t.head_dim + d);
      }
    }
  }
  return out;
}

absl::StatusOr<int64_t> ApplyFromWire(const v1::TensorChunk& c, v1::TensorKind kind,
                                      std::span<const v1::RowRange> allowed, HostTensor* t,
                                      HeadSlice heads) {
  const std::string wire = c.SerializeAsString();
  const size_t a = wire.size() / 2;
  grpc::Slice parts[2] = {grpc::Slice(wire.data(), a),
                          grpc::Slice(wire.data() + a, wire.size() - a)};
  grpc::ByteBuffer buffer(parts, 2);
  ChunkFrame frame;
  RETURN_IF_ERROR(frame.ParseTensorChunk(buffer));
  return ApplyWireChunk(frame.chunk(), kind, allowed, t, heads);
}

TEST(HeadSliceTest, ChunksCarryTheSliceAndTheSlicesRebuildTheTensor) {
  const auto spec = Spec(2, 12, 6, 3, 4);
  const std::vector<v1::RowRange> all_rows = {R(0, 12)};
  for (v1::TensorKind kind : {v1::TENSOR_Q, v1::TENSOR_K, v1::TENSOR_LSE}) {
    SCOPED_TRACE(TensorKindName(kind));
    const HostTensor in = Filled(spec, kind);
    // Unequal slices: [0, 1) and [1, H) of the tensor's heads.
    const std::vector<HeadSlice> slices = {{0, 1}, {1, in.heads}};
    HostTensor proto_out = *MakeTensor(spec, kind), wire_out = *MakeTensor(spec, kind);
    for (const HeadSlice& hs : slices) {
      const int64_t row_bytes = TransitRowBytes(in, hs);
      EXPECT_EQ(row_bytes * in.heads, TransitRowBytes(in) * hs.Count(in.heads));
      int64_t chunks = 0, bytes = 0;
      ASSERT_TRUE(ForEachChunk(
                      in, kind, all_rows, 5 * row_bytes,
                      [&](v1::TensorChunk& c) {
                        EXPECT_EQ(c.data(), Expected(in, c.batch_index(), c.rows().begin(),
                                                     c.rows().end(), hs.begin, hs.end));
                        EXPECT_EQ(c.crc32c(), Crc32c(c.data().data(), c.data().size()));
                        ++chunks;
                        auto n = ApplyChunk(c, kind, all_rows, &proto_out, hs);
                        if (!n.ok()) return n.status();
                        bytes += *n;
                        return ApplyFromWire(c, kind, all_rows, &wire_out, hs).status();
                      },
                      hs)
                      .ok());
      EXPECT_EQ(chunks, CountChunks(in, all_rows, 5 * row_bytes, hs));
      EXPECT_EQ(chunks, 2 * 3);  // 12 rows of 2 batches in chunks of 5 rows
      EXPECT_EQ(bytes, 2 * 12 * row_bytes);
    }
    EXPECT_EQ(proto_out.bytes, in.bytes);
    EXPECT_EQ(wire_out.bytes, in.bytes);
  }
}

TEST(HeadSliceTest, ApplyingOneSliceLeavesTheOtherHeadsAlone) {
  const auto spec = Spec(1, 6, 4, 4, 2);
  const HostTensor in = Filled(spec, v1::TENSOR_O);
  HostTensor out = *MakeTensor(spec, v1::TENSOR_O);
  const std::vector<v1::RowRange> rows = {R(0, 6)};
  const HeadSlice hs{2, 3};
  ASSERT_TRUE(
      ForEachChunk(
          in, v1::TENSOR_O, rows, 1 << 20,
          [&](v1::TensorChunk& c) { return ApplyChunk(c, v1::TENSOR_O, rows, &out, hs).status(); },
          hs)
          .ok());
  const int64_t e = DTypeSize(out.dtype);
  for (int64_t r = 0; r < 6; ++r) {
    for (int h = 0; h < 4; ++h) {
      const size_t off = static_cast<size_t>(((r * 4 + h) * 2) * e);
      const bool mine = h == 2;
      for (size_t i = off; i < off + static_cast<size_t>(2 * e); ++i) {
        EXPECT_EQ(out.bytes[i], mine ? in.bytes[i] : 0) << "row " << r << " head " << h;
      }
    }
  }
  // A chunk of the wrong size for the slice (all heads' bytes) is refused before writing.
  v1::TensorChunk whole;
  whole.set_kind(v1::TENSOR_O);
  *whole.mutable_rows() = R(0, 1);
  whole.set_data(Expected(in, 0, 0, 1, 0, 4));
  whole.set_crc32c(Crc32c(whole.data().data(), whole.data().size()));
  auto st = ApplyChunk(whole, v1::TENSOR_O, rows, &out, hs).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("chunk.data"), std::string::npos) << st;
}

TEST(HeadSliceTest, ContiguousOnlyForAllHeadsOrOneRow) {
  const auto spec = Spec(1, 8, 4, 2, 4);
  const HostTensor q = Filled(spec, v1::TENSOR_Q);
  const HeadSlice hs{1, 3};
  EXPECT_EQ(ContiguousRows(q, ChunkSpan{0, 2, 5}, hs), nullptr);
  EXPECT_NE(ContiguousRows(q, ChunkSpan{0, 2, 5}, HeadSlice{0, 4}), nullptr);
  const uint8_t* one = ContiguousRows(q, ChunkSpan{0, 3, 4}, hs);
  ASSERT_NE(one, nullptr);
  EXPECT_EQ(
      std::string(reinterpret_cast<const char*>(one), static_cast<size_t>(TransitRowBytes(q, hs))),
      Expected(q, 0, 3, 4, 1, 3));
  std::vector<uint8_t> gathered(static_cast<size_t>(3 * TransitRowBytes(q, hs)));
  GatherRows(q, ChunkSpan{0, 2, 5}, gathered.data(), hs);
  EXPECT_EQ(std::string(gathered.begin(), gathered.end()), Expected(q, 0, 2, 5, 1, 3));
}

TEST(HeadSliceTest, BlocksOfASliceHoldAllBatchesOfItsHeads) {
  const auto spec = Spec(3, 10, 6, 2, 4);
  for (v1::TensorKind kind : {v1::TENSOR_V, v1::TENSOR_LSE}) {
    SCOPED_TRACE(TensorKindName(kind));
    const HostTensor in = Filled(spec, kind);
    const v1::RowRange rows = R(2, 7);
    const HeadSlice hs = kind == v1::TENSOR_V ? HeadSlice{1, 2} : HeadSlice{3, 6};
    std::vector<uint8_t> block(static_cast<size_t>(BlockBytes(in, rows, hs)));
    ASSERT_EQ(block.size(), static_cast<size_t>(3 * 5 * TransitRowBytes(in, hs)));
    PackBlock(in, rows, block.data(), hs);
    std::string want;
    for (int b = 0; b < 3; ++b) want += Expected(in, b, 2, 7, hs.begin, hs.end);
    EXPECT_EQ(std::string(block.begin(), block.end()), want);
    HostTensor back = *MakeTensor(spec, kind);
    UnpackBlock(block.data(), rows, &back, hs);
    std::vector<uint8_t> again(block.size());
    PackBlock(back, rows, again.data(), hs);
    EXPECT_EQ(again, block);
  }
}

v1::ShardPlacement Shard(std::vector<v1::RowRange> owned, int kv_begin, int kv_end, int group) {
  v1::ShardPlacement s;
  for (const auto& r : owned) *s.add_owned() = r;
  if (kv_end > 0) {
    s.mutable_kv_heads()->set_begin(kv_begin);
    s.mutable_kv_heads()->set_end(kv_end);
    s.mutable_q_heads()->set_begin(kv_begin * group);
    s.mutable_q_heads()->set_end(kv_end * group);
  }
  return s;
}

TEST(HeadSliceTest, ShardHeadsPickTheKindsRangeAndTreatUnsetAsAll) {
  const v1::ShardPlacement s = Shard({R(0, 8)}, 1, 3, 2);
  EXPECT_EQ(ShardHeads(s, v1::TENSOR_K).begin, 1);
  EXPECT_EQ(ShardHeads(s, v1::TENSOR_DV).end, 3);
  EXPECT_EQ(ShardHeads(s, v1::TENSOR_Q).begin, 2);
  EXPECT_EQ(ShardHeads(s, v1::TENSOR_LSE).end, 6);
  EXPECT_EQ(ShardHeads(s, v1::TENSOR_DQ).Count(8), 4);
  const v1::ShardPlacement old = Shard({R(0, 8)}, 0, 0, 2);  // an older coordinator
  EXPECT_TRUE(ShardHeads(old, v1::TENSOR_K).empty());
  EXPECT_EQ(ShardHeads(old, v1::TENSOR_Q).Count(8), 8);
}

absl::Status Check(const v1::AttentionSpec& spec, std::vector<v1::ShardPlacement> shards) {
  v1::CreateSessionResponse info;
  for (auto& s : shards) *info.add_shards() = s;
  return ValidatePlacement(info, spec);
}

void ExpectRefused(const absl::Status& s, const std::string& text) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(text), std::string::npos) << s;
}

TEST(HeadSliceTest, PlacementMustHoldEveryTokenOfEveryHeadExactlyOnce) {
  const auto spec = Spec(1, 16, 6, 3, 4);  // 2 query heads per kv head
  // Head split (2 and 1 kv heads), hybrid (heads x rows), sequence split (heads unset or set).
  EXPECT_TRUE(Check(spec, {Shard({R(0, 16)}, 0, 2, 2), Shard({R(0, 16)}, 2, 3, 2)}).ok());
  EXPECT_TRUE(Check(spec, {Shard({R(0, 5), R(12, 16)}, 0, 1, 2), Shard({R(5, 12)}, 0, 1, 2),
                           Shard({R(0, 16)}, 1, 3, 2)})
                  .ok());
  EXPECT_TRUE(Check(spec, {Shard({R(0, 9)}, 0, 0, 2), Shard({R(9, 16)}, 0, 3, 2)}).ok());
  // Two shards hold kv head 1.
  ExpectRefused(Check(spec, {Shard({R(0, 16)}, 0, 2, 2), Shard({R(0, 16)}, 1, 3, 2)}),
                "shards[1] and shards[0] both hold token 0 of kv heads [1, 2)");
  // Nobody holds kv head 2.
  ExpectRefused(Check(spec, {Shard({R(0, 16)}, 0, 2, 2)}),
                "no shard holds token 0 of kv heads [2, 3)");
  // Rows of one head group missing.
  ExpectRefused(Check(spec, {Shard({R(0, 16)}, 0, 2, 2), Shard({R(0, 10)}, 2, 3, 2)}),
                "no shard holds token 10 of kv heads [2, 3)");
  // Outside the spec's heads.
  ExpectRefused(Check(spec, {Shard({R(0, 16)}, 0, 4, 2)}), "shards[0].kv_heads = [0, 4)");
  // Query heads that are not the kv heads' groups.
  auto bad_q = Shard({R(0, 16)}, 0, 3, 2);
  bad_q.mutable_q_heads()->set_end(5);
  ExpectRefused(Check(spec, {bad_q}), "shards[0].q_heads = [0, 5)");
  // Rows outside the sequence are named as before.
  ExpectRefused(Check(spec, {Shard({R(0, 17)}, 0, 3, 2)}), "shards[0].owned[0]");
}

}  // namespace
}  // namespace dfa::client
