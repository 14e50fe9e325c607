#include "worker/gpu/gpu_backend_factory.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "core/gpu/cuda_status.h"
#include "worker/gpu/device_memory_pool.h"
#include "worker/gpu/pooled_backend.h"

namespace dfa {

absl::StatusOr<size_t> DevicePoolBytes(int device, int64_t bytes, double fraction) {
  if (bytes <= 0 && fraction <= 0) return size_t{0};
  int count = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("device = ", device, " does not exist (", count, " devices)"));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  size_t free_bytes = 0, total = 0;
  CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total));
  size_t want = bytes > 0 ? static_cast<size_t>(bytes)
                          : static_cast<size_t>(fraction * static_cast<double>(total));
  want &= ~size_t{(2 << 20) - 1};  // whole 2 MiB pages
  if (want == 0) {
    return absl::InvalidArgumentError("device_memory_limit rounds to 0 bytes (minimum 2M)");
  }
  if (want > free_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "device_memory_limit: ", want, " bytes asked on device ", device, " (total ", total,
        "), ", free_bytes, " free"));
  }
  return want;
}

absl::StatusOr<std::string> DeviceUuid(int device) {
  cudaDeviceProp prop{};
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
  const auto* b = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    absl::StrAppend(&out, absl::Hex(b[i], absl::kZeroPad2));
  }
  return out;
}

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
