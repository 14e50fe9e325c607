// The client's CUDA IPC request building for head-split shards (pure; runs without a GPU): a
// shard holding heads [b, e) of rows [r0, r1) gets a ref that starts at (r0, b), has
// heads = e - b and keeps the full tensor's strides (rows strided over all heads).
#include <gtest/gtest.h>

#include "client/cuda_tensor_io.h"
#include "tests/client/client_test_util.h"

namespace dfa::client {
namespace {

v1::AttentionSpec Spec() {
  v1::AttentionSpec s;
  s.set_batch(2);
  s.set_seq_len(64);
  s.set_q_heads(6);
  s.set_kv_heads(3);
  s.set_head_dim(8);
  s.set_dtype(v1::DTYPE_BF16);
  return s;
}

using test_util::R;

TEST(CudaRequestTest, HeadSliceRefStartsAtItsFirstHeadWithFullStrides) {
  const auto spec = Spec();
  const DeviceTensor q = DeviceTensor::Dense(nullptr, DType::kBF16, {2, 64, 6, 8});
  auto req = MakeDeviceTransferRequest(spec, v1::TENSOR_Q, q, std::string(64, '\0'), 1024, 0,
                                       R(16, 48), true, "host", HeadSlice{2, 6});
  ASSERT_TRUE(req.ok()) << req.status();
  const v1::DeviceTensorRef& t = req->tensor();
  // Element (0, 16, 2, 0): (16 * 6 + 2) * 8 elements of 2 bytes past the base.
  EXPECT_EQ(t.offset(), 1024 + (16 * 6 + 2) * 8 * 2);
  EXPECT_EQ(std::vector<int64_t>(t.shape().begin(), t.shape().end()),
            (std::vector<int64_t>{2, 32, 4, 8}));
  EXPECT_EQ(std::vector<int64_t>(t.strides().begin(), t.strides().end()),
            (std::vector<int64_t>{64 * 6 * 8, 6 * 8, 8, 1}));
  // All heads (default) is the old request.
  auto all = MakeDeviceTransferRequest(spec, v1::TENSOR_Q, q, std::string(64, '\0'), 1024, 0,
                                       R(16, 48), true, "host");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->tensor().offset(), 1024 + 16 * 6 * 8 * 2);
  EXPECT_EQ(all->tensor().shape(2), 6);
}

TEST(CudaRequestTest, LseSliceIsRowsOfItsHeads) {
  const auto spec = Spec();
  const DeviceTensor lse = DeviceTensor::Dense(nullptr, DType::kF32, {2, 6, 64});
  auto req = MakeDeviceTransferRequest(spec, v1::TENSOR_LSE, lse, std::string(64, '\0'), 0, 0,
                                       R(0, 64), false, "host", HeadSlice{4, 6});
  ASSERT_TRUE(req.ok()) << req.status();
  EXPECT_EQ(req->tensor().offset(), 4 * 64 * 4);
  EXPECT_EQ(req->tensor().shape(1), 2);
  EXPECT_EQ(req->tensor().strides(1), 64);
  EXPECT_EQ(req->tensor().strides(0), 6 * 64);
}

TEST(CudaRequestTest, SliceOutsideTheTensorsHeadsIsRefused) {
  const DeviceTensor k = DeviceTensor::Dense(nullptr, DType::kBF16, {2, 64, 3, 8});
  auto req = MakeDeviceTransferRequest(Spec(), v1::TENSOR_K, k, std::string(64, '\0'), 0, 0,
                                       R(0, 64), true, "host", HeadSlice{2, 4});
  EXPECT_EQ(req.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(req.status().message().find("tensor.shape[2]"), std::string::npos) << req.status();
}

}  // namespace
}  // namespace dfa::client
