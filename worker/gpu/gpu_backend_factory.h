// Session backends for a cuda worker daemon: each session gets a PooledBackend around its own
// cuda backend, all sharing ONE DeviceMemoryPool taken from the device when the factory is made.
// So a job's steps never call cudaMalloc/cudaFree, and the worker's memory is one bound.
//
// Usage (worker_daemon.cc): replace `[..]() { return CreateBackend("cuda", bo); }` by the
// function this returns. Thread-safe: the function may be called from any RPC thread.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "kernels/attention_backend.h"

namespace dfa {

class DeviceMemoryPool;

using BackendFactory = std::function<absl::StatusOr<std::unique_ptr<AttentionBackend>>()>;

// The device pool's size on `device` for a limit of `bytes` (> 0) or `fraction` (in (0, 1]) of
// the device's total memory; both 0: 0 (the pool's default, all free memory but its headroom).
// RESOURCE_EXHAUSTED naming device_memory_limit when the device has less free memory.
absl::StatusOr<size_t> DevicePoolBytes(int device, int64_t bytes, double fraction);

// The UUID of `device` as nvidia-smi prints it ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"; a
// MIG instance's own under MIG): what the worker registers as RegisterWorkerRequest.device_uuid.
absl::StatusOr<std::string> DeviceUuid(int device);

// `options`/`name`: the device backend to wrap ("cuda", or "cudnn" where the kernels offer it).
// `pool_bytes` 0: all free device memory but `headroom_bytes` (NCCL buffers, the context).
// UNAVAILABLE without a usable GPU; RESOURCE_EXHAUSTED when the pool does not fit.
absl::StatusOr<BackendFactory> MakePooledCudaBackendFactory(
    const BackendOptions& options, size_t pool_bytes, size_t headroom_bytes = size_t{8} << 30,
    std::shared_ptr<DeviceMemoryPool>* pool_out = nullptr, std::string name = "cuda");

}  // namespace dfa
