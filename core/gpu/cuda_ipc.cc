#include "core/gpu/cuda_ipc.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "core/gpu/cuda_status.h"

namespace dfa {
namespace {

// cuMemGetAddressRange through the runtime's driver entry point, so that nothing links
// libcuda directly (programs built here must start on machines without a driver).
using AddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

absl::Status AddressRange(const void* p, void** base, size_t* bytes) {
  static AddressRangeFn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      f = nullptr;
    }
    return reinterpret_cast<AddressRangeFn>(f);
  }();
  if (fn == nullptr) return absl::UnavailableError("cuda ipc: cuMemGetAddressRange unavailable");
  CUdeviceptr b = 0;
  size_t n = 0;
  if (fn(&b, &n, reinterpret_cast<CUdeviceptr>(p)) != CUDA_SUCCESS) {
    return absl::InvalidArgumentError("cuda ipc: pointer is not in a device allocation");
  }
  *base = reinterpret_cast<void*>(b);
  *bytes = n;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> HostBootId() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (!(f >> id) || id.empty()) {
    return absl::UnavailableError("cannot read /proc/sys/kernel/random/boot_id (host identity)");
  }
  return id;
}

absl::StatusOr<CudaIpcBuffer> ExportCudaIpc(const void* device_ptr) {
  cudaPointerAttributes attr;
  CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&attr, device_ptr));
  if (attr.type != cudaMemoryTypeDevice) {
    return absl::InvalidArgumentError("cuda ipc: pointer is not device memory");
  }
  // The allocation's device and its primary context current on this thread while asking: the
  // driver's cuMemGetAddressRange needs a current context, and a thread that has made no
  // runtime call binding one (the Python binding's helper threads) has none, whatever
  // cudaGetDevice says. cudaSetDevice makes the primary context current.
  int previous = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous));
  CUDA_RETURN_IF_ERROR(cudaSetDevice(attr.device));
  void* base = nullptr;
  size_t bytes = 0;
  absl::Status st = AddressRange(device_ptr, &base, &bytes);
  // The handle of the BASE of the allocation: caching allocators (PyTorch's) hand out
  // sub-ranges of larger cudaMalloc blocks, and a handle names a whole allocation.
  cudaIpcMemHandle_t h;
  if (st.ok()) st = CudaStatus(cudaIpcGetMemHandle(&h, base), "cudaIpcGetMemHandle");
  if (previous != attr.device) cudaSetDevice(previous);
  RETURN_IF_ERROR(st);
  CudaIpcBuffer out;
  out.handle.assign(h.reserved, sizeof(h.reserved));
  out.offset = static_cast<const char*>(device_ptr) - static_cast<const char*>(base);
  out.allocation_bytes = bytes;
  out.device = attr.device;
  return out;
}

size_t CudaIpcImporter::mapped() const {
  absl::MutexLock lock(&mu_);
  return mapped_.size();
}

CudaIpcImporter::~CudaIpcImporter() {
  absl::MutexLock lock(&mu_);
  if (mapped_.empty()) return;
  cudaSetDevice(device_);
  for (auto& [h, m] : mapped_) cudaIpcCloseMemHandle(m.base);
}

absl::StatusOr<void*> CudaIpcImporter::Map(const std::string& handle, int64_t offset,
                                           size_t bytes) {
  if (handle.size() != CUDA_IPC_HANDLE_SIZE) {
    return absl::InvalidArgumentError(absl::StrCat("tensor.cuda_ipc_handle must be ",
                                                   CUDA_IPC_HANDLE_SIZE, " bytes, got ",
                                                   handle.size()));
  }
  if (offset < 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor.offset must be >= 0, got ", offset));
  }
  absl::MutexLock lock(&mu_);
  auto it = mapped_.find(handle);
  if (it == mapped_.end()) {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    cudaIpcMemHandle_t h;
    std::memcpy(h.reserved, handle.data(), sizeof(h.reserved));
    void* p = nullptr;
    cudaError_t err = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess) {
      // Not retryable: the same handle fails the same way on a new session.
      return absl::FailedPreconditionError(absl::StrCat(
          "tensor.cuda_ipc_handle cannot be opened by this worker (a handle of another host, of "
          "this worker's own process, of freed memory, or not a handle): ",
          CudaStatus(err, "cudaIpcOpenMemHandle").message()));
    }
    Mapping m;
    m.base = p;
    void* base = nullptr;
    absl::Status st = AddressRange(p, &base, &m.bytes);
    if (!st.ok()) {
      cudaIpcCloseMemHandle(p);
      return st;
    }
    if (mapped_.size() >= kMaxMapped) {  // close the least recently used
      auto oldest = mapped_.begin();
      for (auto j = mapped_.begin(); j != mapped_.end(); ++j) {
        if (j->second.last_use < oldest->second.last_use) oldest = j;
      }
      cudaIpcCloseMemHandle(oldest->second.base);
      mapped_.erase(oldest);
    }
    it = mapped_.emplace(handle, m).first;
  }
  Mapping& m = it->second;
  m.last_use = ++uses_;
  if (static_cast<size_t>(offset) > m.bytes || bytes > m.bytes - static_cast<size_t>(offset)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor.offset = ", offset, " + the tensor's ", bytes,
                     " bytes lie past the end of the allocation behind tensor.cuda_ipc_handle (",
                     m.bytes, " bytes)"));
  }
  return static_cast<void*>(static_cast<char*>(m.base) + offset);
}

absl::Status CudaIpcImporter::Copy(const std::string& handle, int64_t offset, void* local,
                                   size_t bytes, bool to_local, void* stream) {
  ASSIGN_OR_RETURN(void* remote, Map(handle, offset, bytes));
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(to_local ? local : remote, to_local ? remote : local, bytes,
                                       cudaMemcpyDeviceToDevice,
                                       static_cast<cudaStream_t>(stream)));
  return absl::OkStatus();
}

}  // namespace dfa
