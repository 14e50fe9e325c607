#include "worker/gpu/device_memory_pool.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "core/gpu/cuda_status.h"

namespace dfa {

absl::StatusOr<std::unique_ptr<DeviceMemoryPool>> DeviceMemoryPool::Create(int device, size_t bytes,
                                                                           size_t headroom) {
  int count = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("device pool: device ", device, " does not exist (", count, " devices)"));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  size_t free_bytes = 0, total = 0;
  CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total));
  if (bytes == 0) {
    if (free_bytes <= headroom) {
      return absl::ResourceExhaustedError(absl::StrCat("device pool: device ", device, " has ",
                                                       free_bytes, " bytes free, headroom is ",
                                                       headroom));
    }
    bytes = (free_bytes - headroom) & ~size_t{(2 << 20) - 1};
  }
  if (bytes > free_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("device pool: asked for ", bytes,
                                                     " bytes on device ", device, ", ",
                                                     free_bytes, " free"));
  }
  void* base = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&base, bytes));
  return std::unique_ptr<DeviceMemoryPool>(
      new DeviceMemoryPool(device, static_cast<char*>(base), bytes));
}

DeviceMemoryPool::~DeviceMemoryPool() {
  cudaSetDevice(device_);
  cudaFree(base_);
}

absl::StatusOr<void*> DeviceMemoryPool::Allocate(size_t bytes) {
  absl::MutexLock lock(&mu_);
  auto off = arena_.Allocate(bytes);
  if (!off.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("device ", device_, " memory pool: ", off.status().message()));
  }
  return static_cast<void*>(base_ + *off);
}

absl::Status DeviceMemoryPool::Free(void* p) {
  char* c = static_cast<char*>(p);
  absl::MutexLock lock(&mu_);
  if (c < base_ || c >= base_ + arena_.capacity()) {
    return absl::InvalidArgumentError("device pool: pointer is not from this pool");
  }
  return arena_.Free(static_cast<size_t>(c - base_));
}

absl::Status DeviceMemoryPool::Retire(void* p) {
  char* c = static_cast<char*>(p);
  absl::MutexLock lock(&mu_);
  if (c < base_ || c >= base_ + arena_.capacity()) {
    return absl::InvalidArgumentError("device pool: pointer is not from this pool");
  }
  const size_t off = static_cast<size_t>(c - base_);
  const size_t bytes = arena_.SizeOf(off);
  if (bytes == 0) return absl::InvalidArgumentError("device pool: block is not allocated");
  retired_.push_back(off);
  retired_bytes_ += bytes;
  return absl::OkStatus();
}

size_t DeviceMemoryPool::ReclaimRetired() {
  absl::MutexLock lock(&mu_);
  const size_t before = arena_.used();
  for (size_t off : retired_) (void)arena_.Free(off);
  retired_.clear();
  retired_bytes_ = 0;
  return before - arena_.used();
}

size_t DeviceMemoryPool::retired_bytes() const {
  absl::MutexLock lock(&mu_);
  return retired_bytes_;
}

size_t DeviceMemoryPool::capacity() const {
  absl::MutexLock lock(&mu_);
  return arena_.capacity();
}
size_t DeviceMemoryPool::used() const {
  absl::MutexLock lock(&mu_);
  return arena_.used();
}
size_t DeviceMemoryPool::peak_used() const {
  absl::MutexLock lock(&mu_);
  return arena_.peak_used();
}

}  // namespace dfa
