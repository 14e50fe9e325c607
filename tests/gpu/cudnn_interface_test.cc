// The interface pieces the cuDNN backend added, checked where every build runs (no GPU needed):
// BackwardArgs::out validation, and CreateBackend("cudnn") answering UNAVAILABLE (never another
// error, never a crash) where no GPU / libcudnn / cuDNN build is present.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/attention_backend.h"

namespace dfa {
namespace {

TensorView View(void* p, DType t, int64_t rows, int heads) {
  TensorView v;
  v.data = p;
  v.dtype = t;
  v.rows = rows;
  v.heads = heads;
  v.head_dim = 64;
  return v;
}
RowStatView Stat(float* p, int64_t rows, int heads) {
  RowStatView s;
  s.data = p;
  s.heads = heads;
  s.rows = rows;
  return s;
}

class BackwardOutValidation : public ::testing::Test {
 protected:
  void SetUp() override {
    buf_.assign(1 << 16, 0.f);
    void* p = buf_.data();
    a_.scale = 0.125f;
    a_.q = View(p, DType::kBF16, 32, 4);
    a_.k = View(p, DType::kBF16, 48, 2);
    a_.v = a_.k;
    a_.dout = a_.q;
    a_.lse = Stat(buf_.data(), 32, 4);
    a_.delta = a_.lse;
    a_.dq = View(p, DType::kF32, 32, 4);
    a_.dk = View(p, DType::kF32, 48, 2);
    a_.dv = a_.dk;
  }
  std::vector<float> buf_;
  BackwardArgs a_;
};

TEST_F(BackwardOutValidation, OutIsOptional) { EXPECT_TRUE(ValidateBackward(a_).ok()); }

TEST_F(BackwardOutValidation, OutInQDtypeOrF32IsAccepted) {
  a_.out = View(buf_.data(), DType::kBF16, 32, 4);
  EXPECT_TRUE(ValidateBackward(a_).ok());
  a_.out.dtype = DType::kF32;
  EXPECT_TRUE(ValidateBackward(a_).ok());
}

TEST_F(BackwardOutValidation, OutWithOtherRowsIsRejectedNamingOut) {
  a_.out = View(buf_.data(), DType::kF32, 31, 4);
  const absl::Status s = ValidateBackward(a_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("out"), absl::string_view::npos) << s;
}

TEST_F(BackwardOutValidation, OutInAnotherHalfDtypeIsRejected) {
  a_.out = View(buf_.data(), DType::kF16, 32, 4);
  const absl::Status s = ValidateBackward(a_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("out"), absl::string_view::npos) << s;
}

TEST(CudnnBackendName, IsKnownAndEitherWorksOrIsUnavailable) {
  auto b = CreateBackend("cudnn", {});
  if (b.ok()) {
    EXPECT_EQ((*b)->Name(), "cudnn");
  } else {
    EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable) << b.status();
  }
}

}  // namespace
}  // namespace dfa
