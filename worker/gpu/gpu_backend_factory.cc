#include "worker/gpu/gpu_backend_factory.h"

#include "worker/gpu/device_memory_pool.h"
#include "worker/gpu/pooled_backend.h"

namespace dfa {

absl::StatusOr<BackendFactory> MakePooledCudaBackendFactory(
    const BackendOptions& options, size_t pool_bytes, size_t headroom_bytes,
    std::shared_ptr<DeviceMemoryPool>* pool_out, std::string name) {
  // Probe first so that "no GPU" reads as the backend's own UNAVAILABLE.
  ASSIGN_OR_RETURN(auto probe, CreateBackend(name, options));
  probe.reset();
  ASSIGN_OR_RETURN(auto pool, DeviceMemoryPool::Create(options.device, pool_bytes, headroom_bytes));
  std::shared_ptr<DeviceMemoryPool> shared(std::move(pool));
  if (pool_out != nullptr) *pool_out = shared;
  // The backend's own scratch (cuDNN's workspace and staging buffers) comes from the pool too.
  BackendOptions pooled = options;
  pooled.scratch = PoolScratchAllocator(shared);
  return BackendFactory(
      [pooled, shared, name]() -> absl::StatusOr<std::unique_ptr<AttentionBackend>> {
        ASSIGN_OR_RETURN(auto inner, CreateBackend(name, pooled));
        return std::unique_ptr<AttentionBackend>(new PooledBackend(std::move(inner), shared));
      });
}

}  // namespace dfa
