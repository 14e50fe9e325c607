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

absl::StatusOr<void*> PooledBackend::Alloc(size_t bytes) {
  auto p = pool_->Allocate(bytes);
  if (p.ok() || p.status().code() != absl::StatusCode::kResourceExhausted ||
      pool_->retired_bytes() == 0) {
    return p;
  }
  // Full, but retired blocks wait for the device: wait once, take them back, try again.
  RETURN_IF_ERROR(DeviceSync(pool_->device()));
  pool_->ReclaimRetired();
  return pool_->Allocate(bytes);
}

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
