// ValidateSpec: one message per field, "spec.<field>: <what>, got <value>", with the limits of
// whoever checks; AttentionShape::Validate words the same fields the same (without "spec.");
// ShapeOf carries the spec's per-token shape.
#include "core/spec_validation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace dfa {
namespace {

v1::AttentionSpec GoodSpec() {
  v1::AttentionSpec s;
  s.set_batch(2);
  s.set_q_heads(8);
  s.set_kv_heads(2);
  s.set_head_dim(64);
  s.set_seq_len(1024);
  s.set_causal(true);
  s.set_dtype(v1::DTYPE_BF16);
  return s;
}

void AddDoc(v1::AttentionSpec& s, const std::vector<int64_t>& offsets) {
  v1::DocOffsets* row = s.add_doc_offsets();
  for (int64_t o : offsets) row->add_offsets(o);
}

SpecLimits SmallLimits() {
  SpecLimits l;
  l.max_seq_len = 4096;
  l.max_batch = 4;
  l.max_heads = 16;
  l.max_head_dim = 256;
  l.max_documents = 100;
  return l;
}

struct BadCase {
  const char* name;
  std::function<void(v1::AttentionSpec&)> mutate;
  const char* message;  // the whole message
};

class ValidateSpecTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(ValidateSpecTest, NamesTheFieldTheLimitAndTheValue) {
  v1::AttentionSpec spec = GoodSpec();
  GetParam().mutate(spec);
  const absl::Status s = ValidateSpec(spec, SmallLimits());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), GetParam().message);
}

using S = v1::AttentionSpec;
INSTANTIATE_TEST_SUITE_P(
    EveryField, ValidateSpecTest,
    ::testing::Values(
        BadCase{"ZeroBatch", [](S& s) { s.set_batch(0); }, "spec.batch: must be >= 1, got 0"},
        BadCase{"BatchOverLimit", [](S& s) { s.set_batch(5); },
                "spec.batch: must be <= 4 (max_batch), got 5"},
        BadCase{"NegativeQHeads", [](S& s) { s.set_q_heads(-1); },
                "spec.q_heads: must be >= 1, got -1"},
        BadCase{"QHeadsOverLimit", [](S& s) { s.set_q_heads(32); },
                "spec.q_heads: must be <= 16 (max_heads), got 32"},
        BadCase{"ZeroKvHeads", [](S& s) { s.set_kv_heads(0); },
                "spec.kv_heads: must be >= 1, got 0"},
        BadCase{"KvHeadsOverLimit",
                [](S& s) {
                  s.set_q_heads(16);
                  s.set_kv_heads(17);
                },
                "spec.kv_heads: must be <= 16 (max_heads), got 17"},
        BadCase{"HeadsNotDivisible", [](S& s) { s.set_kv_heads(3); },
                "spec.q_heads: must be a multiple of kv_heads (3), got 8"},
        BadCase{"MoreKvHeadsThanQHeads", [](S& s) { s.set_kv_heads(16); },
                "spec.q_heads: must be a multiple of kv_heads (16), got 8"},
        BadCase{"ZeroHeadDim", [](S& s) { s.set_head_dim(0); },
                "spec.head_dim: must be >= 1, got 0"},
        BadCase{"HeadDimOverLimit", [](S& s) { s.set_head_dim(512); },
                "spec.head_dim: must be <= 256 (max_head_dim), got 512"},
        BadCase{"NegativeSeqLen", [](S& s) { s.set_seq_len(-64); },
                "spec.seq_len: must be >= 1, got -64"},
        BadCase{"SeqLenOverLimit", [](S& s) { s.set_seq_len(4097); },
                "spec.seq_len: must be <= 4096 (max_seq_len), got 4097"},
        BadCase{"NoDtype", [](S& s) { s.set_dtype(v1::DTYPE_UNSPECIFIED); },
                "spec.dtype: must be DTYPE_F32, DTYPE_BF16 or DTYPE_F16, got 0"},
        BadCase{"UnknownDtype", [](S& s) { s.set_dtype(static_cast<v1::DType>(42)); },
                "spec.dtype: must be DTYPE_F32, DTYPE_BF16 or DTYPE_F16, got 42"},
        BadCase{"NegativeScale", [](S& s) { s.set_softmax_scale(-1.f); },
                "spec.softmax_scale: must be finite and >= 0 (0: 1/sqrt(head_dim)), got -1"},
        BadCase{"NanScale",
                [](S& s) { s.set_softmax_scale(std::numeric_limits<float>::quiet_NaN()); },
                "spec.softmax_scale: must be finite and >= 0 (0: 1/sqrt(head_dim)), got nan"},
        BadCase{"InfiniteScale",
                [](S& s) { s.set_softmax_scale(std::numeric_limits<float>::infinity()); },
                "spec.softmax_scale: must be finite and >= 0 (0: 1/sqrt(head_dim)), got inf"},
        BadCase{"WindowLeftBelowMinusOne", [](S& s) { s.set_window_left(-2); },
                "spec.window_left: must be >= 0 (or -1: unbounded), got -2"},
        BadCase{"WindowRightBelowMinusOne", [](S& s) { s.set_window_right(-7); },
                "spec.window_right: must be >= 0 (or -1: unbounded), got -7"},
        BadCase{"DocOffsetsNotIncreasing",
                [](S& s) {
                  AddDoc(s, {0, 512, 1024});
                  AddDoc(s, {0, 80, 70, 1024});
                },
                "spec.doc_offsets[1][2]: must be greater than doc_offsets[1][1] = 80, got 70"},
        BadCase{"DocOffsetsNotFromZero",
                [](S& s) { AddDoc(s, {3, 1024}); },
                "spec.doc_offsets[0][0]: must be 0, got 3"},
        BadCase{"DocOffsetsNotToSeqLen",
                [](S& s) { AddDoc(s, {0, 100, 1000}); },
                "spec.doc_offsets[0][2]: must be seq_len = 1024, got 1000"},
        BadCase{"DocOffsetsRowsNotBatch",
                [](S& s) {
                  s.set_batch(3);
                  for (int i = 0; i < 2; ++i) AddDoc(s, {0, 1024});
                },
                "spec.doc_offsets: must have 0, 1 or batch (3) entries, got 2"},
        BadCase{"TooManyDocuments",
                [](S& s) {
                  std::vector<int64_t> o;
                  for (int64_t i = 0; i <= 1024; ++i) o.push_back(i);  // 1024 1-token docs
                  AddDoc(s, o);
                },
                "spec.doc_offsets: must hold <= 100 documents in all (max_documents), got 1024"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

TEST(ValidateSpecLimitsTest, AcceptsSpecsAtTheLimits) {
  v1::AttentionSpec spec = GoodSpec();
  spec.set_batch(4);
  spec.set_q_heads(16);
  spec.set_kv_heads(16);
  spec.set_head_dim(256);
  spec.set_seq_len(4096);
  spec.set_softmax_scale(0.125f);
  EXPECT_TRUE(ValidateSpec(spec, SmallLimits()).ok());
}

TEST(ValidateSpecLimitsTest, DefaultsAreTheCoordinatorFlagDefaults) {
  const SpecLimits d;
  EXPECT_EQ(d.max_seq_len, int64_t{1} << 22);
  EXPECT_EQ(d.max_batch, 1024);
  EXPECT_EQ(d.max_heads, 1024);
  EXPECT_EQ(d.max_head_dim, kMaxHeadDim);
  v1::AttentionSpec spec = GoodSpec();
  spec.set_head_dim(kMaxHeadDim + 1);
  EXPECT_EQ(ValidateSpec(spec, d).message(),
            "spec.head_dim: must be <= 512 (max_head_dim), got 513");
}

TEST(ValidateSpecLimitsTest, NoLimitsChecksOnlyWhatIsWrongWithAnySpec) {
  v1::AttentionSpec spec = GoodSpec();
  spec.set_batch(1 << 20);
  spec.set_q_heads(1 << 16);
  spec.set_kv_heads(1 << 16);
  spec.set_head_dim(1000);
  spec.set_seq_len(int64_t{1} << 40);
  EXPECT_TRUE(ValidateSpec(spec, kNoSpecLimits).ok());
  spec.set_batch(0);
  EXPECT_EQ(ValidateSpec(spec, kNoSpecLimits).message(), "spec.batch: must be >= 1, got 0");
}

TEST(ValidateSpecLimitsTest, FirstBadFieldInOrderIsReported) {
  v1::AttentionSpec spec = GoodSpec();
  spec.set_seq_len(0);
  spec.set_batch(0);
  EXPECT_EQ(ValidateSpec(spec, SmallLimits()).message(), "spec.batch: must be >= 1, got 0");
}

TEST(MaskSpecOfTest, CarriesTheMaskAndAcceptsDocumentsAndWindows) {
  v1::AttentionSpec spec = GoodSpec();
  MaskSpec m = MaskSpecOf(spec);
  EXPECT_TRUE(m.causal);
  EXPECT_EQ(m.window_left, -1);
  EXPECT_EQ(m.window_right, -1);
  EXPECT_TRUE(m.doc_offsets.empty());
  EXPECT_EQ(m.Kind(), MaskKind::kCausal);
  AddDoc(spec, {0, 1, 700, 1024});
  AddDoc(spec, {0, 1024});
  spec.set_window_left(64);
  spec.set_window_right(-1);
  ASSERT_TRUE(ValidateSpec(spec, SmallLimits()).ok());
  m = MaskSpecOf(spec);
  EXPECT_EQ(m.window_left, 64);
  EXPECT_EQ(m.window_right, -1);
  ASSERT_EQ(m.doc_offsets.size(), 2u);
  EXPECT_EQ(m.doc_offsets[0], (std::vector<int64_t>{0, 1, 700, 1024}));
  EXPECT_EQ(m.Kind(), MaskKind::kIntervals);
}

TEST(ShapeOfTest, CarriesEveryShapeField) {
  v1::AttentionSpec spec = GoodSpec();
  spec.set_dtype(v1::DTYPE_F16);
  const AttentionShape s = ShapeOf(spec);
  EXPECT_EQ(s.batch, 2);
  EXPECT_EQ(s.q_heads, 8);
  EXPECT_EQ(s.kv_heads, 2);
  EXPECT_EQ(s.head_dim, 64);
  EXPECT_EQ(s.dtype, DType::kF16);
  spec.set_dtype(v1::DTYPE_F32);
  EXPECT_EQ(ShapeOf(spec).dtype, DType::kF32);
  spec.set_dtype(v1::DTYPE_BF16);
  EXPECT_EQ(ShapeOf(spec).dtype, DType::kBF16);
  EXPECT_TRUE(s.Validate().ok());
}

// The shape's checks word the same fields as the spec's, without the "spec." prefix.
TEST(ShapeValidateTest, WordsTheFieldsAsValidateSpec) {
  for (auto [mutate, field] : std::initializer_list<
           std::pair<std::function<void(v1::AttentionSpec&)>, const char*>>{
           {[](S& s) { s.set_batch(0); }, "batch"},
           {[](S& s) { s.set_q_heads(0); }, "q_heads"},
           {[](S& s) { s.set_kv_heads(-2); }, "kv_heads"},
           {[](S& s) { s.set_kv_heads(3); }, "q_heads"},
           {[](S& s) { s.set_head_dim(0); }, "head_dim"},
           {[](S& s) { s.set_head_dim(kMaxHeadDim + 1); }, "head_dim"}}) {
    v1::AttentionSpec spec = GoodSpec();
    mutate(spec);
    const absl::Status from_spec = ValidateSpec(spec, SpecLimits());
    const absl::Status from_shape = ShapeOf(spec).Validate();
    ASSERT_FALSE(from_shape.ok()) << field;
    EXPECT_EQ(from_shape.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string("spec.") + std::string(from_shape.message()), from_spec.message());
    EXPECT_EQ(from_shape.message().substr(0, std::string(field).size() + 1),
              std::string(field) + ":");
  }
}

TEST(EffectiveScaleTest, ZeroMeansOneOverSqrtHeadDim) {
  v1::AttentionSpec spec = GoodSpec();
  EXPECT_FLOAT_EQ(EffectiveScale(spec), 1.f / std::sqrt(64.f));
  spec.set_softmax_scale(0.3f);
  EXPECT_FLOAT_EQ(EffectiveScale(spec), 0.3f);
}

}  // namespace
}  // namespace dfa
