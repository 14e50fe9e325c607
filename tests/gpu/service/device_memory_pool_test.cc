// DeviceMemoryPool and PooledBackend on a real GPU (skipped without one).
#include "worker/gpu/device_memory_pool.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <vector>

#include "tests/gpu/service/gpu_test_util.h"
#include "worker/gpu/pooled_backend.h"

namespace dfa {
namespace {

TEST(DeviceMemoryPoolTest, HandsOutDisjointUsableDeviceMemory) {
  SKIP_UNLESS_GPUS(1);
  auto pool = DeviceMemoryPool::Create(0, size_t{64} << 20);
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto a = (*pool)->Allocate(10 << 20);
  auto b = (*pool)->Allocate(10 << 20);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*a) % 256, 0u);
  ASSERT_EQ(cudaMemset(*a, 1, 10 << 20), cudaSuccess);
  ASSERT_EQ(cudaMemset(*b, 2, 10 << 20), cudaSuccess);
  std::vector<uint8_t> host(10 << 20);
  ASSERT_EQ(cudaMemcpy(host.data(), *a, host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host.front(), 1);
  EXPECT_EQ(host.back(), 1);  // b did not overwrite a
  EXPECT_EQ((*pool)->used(), size_t{20} << 20);
  auto c = (*pool)->Allocate(60 << 20);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE((*pool)->Free(*a).ok());
  EXPECT_EQ((*pool)->Free(*a).code(), absl::StatusCode::kInvalidArgument);
  int on_host = 0;
  EXPECT_EQ((*pool)->Free(&on_host).code(), absl::StatusCode::kInvalidArgument);
}

TEST(DeviceMemoryPoolTest, TooLargeARequestIsResourceExhausted) {
  SKIP_UNLESS_GPUS(1);
  auto pool = DeviceMemoryPool::Create(0, size_t{1} << 50);
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kResourceExhausted) << pool.status();
  EXPECT_EQ(DeviceMemoryPool::Create(VisibleGpus(), 1 << 20).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A backend that only counts calls: the wrapper must forward kernels and serve memory itself.
class CountingBackend : public AttentionBackend {
 public:
  std::string_view Name() const override { return "counting"; }
  absl::Status Forward(const ForwardArgs&) override { return Count(); }
  absl::Status Backward(const BackwardArgs&) override { return Count(); }
  absl::Status Merge(const MergeArgs&) override { return Count(); }
  absl::Status ComputeDelta(const TensorView&, const TensorView&, const RowStatView&,
                            void*) override {
    return Count();
  }
  absl::Status Convert(const TensorView&, const TensorView&, void*) override { return Count(); }
  absl::StatusOr<void*> Alloc(size_t) override {
    return absl::InternalError("inner Alloc must not be called");
  }
  void Free(void*) override { ++inner_frees; }
  absl::Status Copy(void*, const void*, size_t, CopyKind, void*) override { return Count(); }
  absl::Status Memset(void*, int, size_t, void*) override { return Count(); }
  absl::Status Synchronize(void*) override { return Count(); }
  int calls = 0;
  int inner_frees = 0;

 private:
  absl::Status Count() {
    ++calls;
    return absl::OkStatus();
  }
};

TEST(PooledBackendTest, KernelsForwardAndMemoryComesFromThePool) {
  SKIP_UNLESS_GPUS(1);
  auto pool = DeviceMemoryPool::Create(0, size_t{16} << 20);
  ASSERT_TRUE(pool.ok()) << pool.status();
  std::shared_ptr<DeviceMemoryPool> shared(std::move(*pool));
  auto inner = std::make_unique<CountingBackend>();
  CountingBackend* counting = inner.get();
  PooledBackend backend(std::move(inner), shared);
  auto p = backend.Alloc(1 << 20);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(shared->used(), size_t{1} << 20);
  cudaPointerAttributes attr;
  ASSERT_EQ(cudaPointerGetAttributes(&attr, *p), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
  EXPECT_TRUE(backend.Forward(ForwardArgs{}).ok());
  EXPECT_TRUE(backend.Synchronize(nullptr).ok());
  EXPECT_EQ(counting->calls, 2);  // Forward + Synchronize
  // Free is stream-ordered: the block is retired, reusable only after Synchronize.
  backend.Free(*p);
  EXPECT_EQ(shared->used(), size_t{1} << 20);
  EXPECT_EQ(shared->retired_bytes(), size_t{1} << 20);
  EXPECT_TRUE(backend.Synchronize(nullptr).ok());
  EXPECT_EQ(shared->used(), 0u);
  EXPECT_EQ(shared->retired_bytes(), 0u);
  EXPECT_EQ(counting->inner_frees, 0);
  // A full pool reclaims retired blocks by itself.
  auto big = backend.Alloc(16 << 20);
  ASSERT_TRUE(big.ok()) << big.status();
  backend.Free(*big);
  auto again = backend.Alloc(16 << 20);
  EXPECT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(backend.Name(), "counting");
}

}  // namespace
}  // namespace dfa
