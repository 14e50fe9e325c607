// DeviceMemoryPool: the device memory that a GPU worker's sessions live in, taken from CUDA once
// (one cudaMalloc when the worker starts) and handed out by an ArenaAllocator. Session buffers,
// receive buffers and executor scratch come from here, so no cudaMalloc/cudaFree (each an
// implicit device synchronisation) happens inside a job, and the worker's memory limit is a
// hard bound that the coordinator can account against (RESOURCE_EXHAUSTED when it won't fit).
//
// Thread-safe. Free() makes a block reusable at once: the caller must know that no queued GPU
// work uses it any more. Retire() is the stream-ordered form: the block is quarantined and comes
// back only through ReclaimRetired(), which the caller invokes after a device-wide
// synchronisation (PooledBackend does so at the end of a pass, or when memory runs out).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "core/status.h"
#include "worker/gpu/arena_allocator.h"

namespace dfa {

class DeviceMemoryPool {
 public:
  // Reserves `bytes` on `device`. bytes == 0: all free memory but `headroom` bytes (left for
  // NCCL's buffers, cuBLAS/cuDNN workspaces and the CUDA context). RESOURCE_EXHAUSTED when the
  // device cannot provide it; INVALID_ARGUMENT for a bad device.
  static absl::StatusOr<std::unique_ptr<DeviceMemoryPool>> Create(int device, size_t bytes,
                                                                 size_t headroom = size_t{4} << 30);
  ~DeviceMemoryPool();  // returns the arena to CUDA; outstanding blocks become invalid

  // A device pointer aligned to 256 bytes. RESOURCE_EXHAUSTED naming the sizes when full.
  absl::StatusOr<void*> Allocate(size_t bytes);
  // INVALID_ARGUMENT for a pointer that this pool did not hand out.
  absl::Status Free(void* p);
  // Quarantines a block that queued GPU work may still use (no synchronisation here).
  absl::Status Retire(void* p);
  // Makes every retired block reusable. Call only once all GPU work queued before the blocks
  // were retired has finished (e.g. after cudaDeviceSynchronize). Returns the bytes reclaimed.
  size_t ReclaimRetired();
  size_t retired_bytes() const;

  int device() const { return device_; }
  size_t capacity() const;
  size_t used() const;
  size_t peak_used() const;

 private:
  DeviceMemoryPool(int device, char* base, size_t bytes) : device_(device), base_(base), arena_(bytes) {}
  int device_;
  char* base_;
  mutable absl::Mutex mu_;
  ArenaAllocator arena_ ABSL_GUARDED_BY(mu_);
  std::vector<size_t> retired_ ABSL_GUARDED_BY(mu_);  // offsets
  size_t retired_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace dfa
