// Bad arguments are rejected with INVALID_ARGUMENT naming the field, and nothing is written.
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "kernels/attention_backend.h"
#include "tests/kernels/attention_test_util.h"

namespace dfa {
namespace {

using testing::HostStats;
using testing::HostTensor;

class CpuArgsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = CreateBackend("cpu", BackendOptions{2, 0});
    ASSERT_TRUE(b.ok());
    be_ = std::move(b).value();
    std::mt19937 rng(1);
    for (HostTensor* t : {&q_, &k_, &v_, &dout_}) t->Randomize(rng);
    for (int64_t i = 0; i < out_.size(); ++i) out_.set(i, 7.f);
  }

  ForwardArgs GoodForward() {
    ForwardArgs a;
    a.scale = 0.125f;
    a.q = q_.view();
    a.k = k_.view();
    a.v = v_.view();
    a.out = out_.view();
    a.lse = lse_.view();
    return a;
  }
  BackwardArgs GoodBackward() {
    BackwardArgs a;
    a.scale = 0.125f;
    a.q = q_.view();
    a.k = k_.view();
    a.v = v_.view();
    a.dout = dout_.view();
    a.lse = lse_.view();
    a.delta = delta_.view();
    a.dq = dq_.view();
    a.dk = dk_.view();
    a.dv = dv_.view();
    return a;
  }

  // Expects INVALID_ARGUMENT mentioning `field`, and the output left untouched.
  void ExpectRejected(const ForwardArgs& a, const std::string& field) {
    const absl::Status s = be_->Forward(a);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field << ": " << s;
    EXPECT_NE(std::string(s.message()).find(field), std::string::npos) << s;
    for (int64_t i = 0; i < out_.size(); ++i) ASSERT_EQ(out_.get(i), 7.f) << "out was written";
    for (float x : lse_.v) ASSERT_EQ(x, 5.f) << "lse was written";
  }
  void ExpectRejected(const BackwardArgs& a, const std::string& field) {
    const absl::Status s = be_->Backward(a);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field << ": " << s;
    EXPECT_NE(std::string(s.message()).find(field), std::string::npos) << s;
    for (int64_t i = 0; i < dq_.size(); ++i) ASSERT_EQ(dq_.get(i), 0.f) << "dq was written";
  }

  std::unique_ptr<AttentionBackend> be_;
  HostTensor q_{DType::kBF16, 1, 20, 4, 16}, k_{DType::kBF16, 1, 30, 2, 16},
      v_{DType::kBF16, 1, 30, 2, 16}, out_{DType::kF32, 1, 20, 4, 16},
      dout_{DType::kBF16, 1, 20, 4, 16}, dq_{DType::kF32, 1, 20, 4, 16},
      dk_{DType::kF32, 1, 30, 2, 16}, dv_{DType::kF32, 1, 30, 2, 16};
  HostStats lse_{1, 4, 20, 5.f}, delta_{1, 4, 20};
};

TEST_F(CpuArgsTest, GoodArgumentsAreAccepted) {
  EXPECT_TRUE(be_->Forward(GoodForward()).ok());
  EXPECT_TRUE(be_->Backward(GoodBackward()).ok());
}

TEST_F(CpuArgsTest, ForwardRejectsBadArguments) {
  ForwardArgs a = GoodForward();
  a.v.rows = 29;
  ExpectRejected(a, "v shape");
  a = GoodForward();
  a.q.head_dim = 8;
  ExpectRejected(a, "head_dim");
  a = GoodForward();
  a.k.heads = a.v.heads = 3;
  ExpectRejected(a, "q.heads (4) is not a multiple of k.heads (3)");
  a = GoodForward();
  a.q.dtype = static_cast<DType>(9);
  ExpectRejected(a, "q.dtype");
  a = GoodForward();
  a.k.dtype = a.v.dtype = DType::kF16;
  ExpectRejected(a, "k and v must have q's dtype");
  a = GoodForward();
  a.k.rows = a.v.rows = 0;
  ExpectRejected(a, "k.rows");
  a = GoodForward();
  a.q.rows = 0;
  ExpectRejected(a, "q.rows");
  a = GoodForward();
  a.q.data = nullptr;
  ExpectRejected(a, "q: null data");
  a = GoodForward();
  a.lse.data = nullptr;
  ExpectRejected(a, "lse: null data");
  a = GoodForward();
  a.lse.rows = 19;
  ExpectRejected(a, "lse shape");
  a = GoodForward();
  a.scale = NAN;
  ExpectRejected(a, "scale");
  a = GoodForward();
  a.scale = 0.f;
  ExpectRejected(a, "scale");
  a = GoodForward();
  a.out.dtype = DType::kBF16;
  a.accumulate = true;
  ExpectRejected(a, "out.dtype");
  a = GoodForward();
  a.kv_row0 = -1;
  ExpectRejected(a, "kv_row0");
}

TEST_F(CpuArgsTest, BackwardRejectsBadArguments) {
  BackwardArgs a = GoodBackward();
  a.dk.rows = 29;
  ExpectRejected(a, "dk shape");
  a = GoodBackward();
  a.dq.dtype = DType::kBF16;
  ExpectRejected(a, "dq, dk and dv must be f32");
  a = GoodBackward();
  a.delta.data = nullptr;
  ExpectRejected(a, "delta: null data");
  a = GoodBackward();
  a.dout.dtype = DType::kF32;
  ExpectRejected(a, "dout must have q's dtype");
  a = GoodBackward();
  a.k.heads = a.v.heads = a.dk.heads = a.dv.heads = 3;
  ExpectRejected(a, "not a multiple of k.heads");
  a = GoodBackward();
  a.dv.data = nullptr;
  ExpectRejected(a, "dv: null data");
}

TEST_F(CpuArgsTest, MergeDeltaConvertRejectBadArguments) {
  HostTensor a(DType::kF32, 1, 20, 4, 16), b(DType::kF32, 1, 21, 4, 16);
  HostStats la(1, 4, 20), lb(1, 4, 21);
  absl::Status s = be_->Merge({a.view(), la.view(), b.view(), lb.view()});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("out_b shape"), std::string::npos) << s;
  HostTensor c(DType::kBF16, 1, 20, 4, 16);
  s = be_->Merge({a.view(), la.view(), c.view(), la.view()});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;

  HostStats bad(1, 4, 19);
  s = be_->ComputeDelta(dout_.view(), out_.view(), bad.view(), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("delta shape"), std::string::npos) << s;
  s = be_->Convert(q_.view(), k_.view(), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("dst shape"), std::string::npos) << s;
  TensorView null_src = q_.view();
  null_src.data = nullptr;
  s = be_->Convert(null_src, out_.view(), nullptr);
  EXPECT_NE(std::string(s.message()).find("src: null data"), std::string::npos) << s;
}

TEST(CpuBackendCreate, RejectsNegativeThreadsAndUnknownNames) {
  auto a = CreateBackend("cpu", BackendOptions{-1, 0});
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(a.status().message()).find("num_threads"), std::string::npos);
  auto b = CreateBackend("tpu", BackendOptions{});
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dfa
