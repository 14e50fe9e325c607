#include "worker/gpu/pooled_backend.h"

#include <cuda_runtime_api.h>

#include "worker/gpu/cuda_status.h"

namespace dfa {
namespace {

absl::Status DeviceSync(int device) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<void*> AllocateFromPool(DeviceMemoryPool* pool, size_t bytes) {
  auto p = pool->Allocate(bytes);
  if (p.ok() || p.status().code() != absl::StatusCode::kResourceExhausted ||
      pool->retired_bytes() == 0) {
    return p;
  }
  // Full, but retired blocks wait for the device: wait once, take them back, try again.
  RETURN_IF_ERROR(DeviceSync(pool->device()));
  pool->ReclaimRetired();
  return pool->Allocate(bytes);
}

ScratchAllocator PoolScratchAllocator(std::shared_ptr<DeviceMemoryPool> pool) {
  ScratchAllocator s;
  s.alloc = [pool](size_t bytes) { return AllocateFromPool(pool.get(), bytes); };
  s.release = [pool](void* p) { (void)pool->Retire(p); };
  return s;
}

absl::StatusOr<void*> PooledBackend::Alloc(size_t bytes) { return AllocateFromPool(pool_.get(), bytes); }

void PooledBackend::Free(void* p) {
  if (p != nullptr) (void)pool_->Retire(p);
}

absl::Status PooledBackend::Synchronize(void* stream) {
  RETURN_IF_ERROR(inner_->Synchronize(stream));
  if (pool_->retired_bytes() > 0) {
    RETURN_IF_ERROR(DeviceSync(pool_->device()));
    pool_->ReclaimRetired();
  }
  return absl::OkStatus();
}

}  // namespace dfa
