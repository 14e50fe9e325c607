// CUDA IPC between processes of one host: a client (a training process, or `dfa`) hands a
// device buffer to a worker by a 64-byte cudaIpcMemHandle and an offset, and the worker copies
// between it and session memory on the GPU (device to device, NVLink/PCIe peer copy when the
// buffer is on another GPU) — no copy through host memory, no socket.
//
// Wire form (worker.proto DeviceTransferRequest.tensor, a DeviceTensorRef): the handle's 64
// bytes and the byte offset of the tensor inside the exported allocation (PyTorch:
// storage._share_cuda_() gives both). worker/gpu/device_transfer.h serves the rpc;
// client/cuda_tensor_io.h is the client side.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "absl/synchronization/mutex.h"
#include "core/status.h"

namespace dfa {

struct CudaIpcBuffer {
  std::string handle;   // cudaIpcMemHandle_t, 64 bytes
  int64_t offset = 0;   // of the exported pointer inside its allocation
  size_t allocation_bytes = 0;
  int device = 0;       // device that holds the memory
};

// Client side: the handle of the allocation that holds `device_ptr`, and its offset there.
// INVALID_ARGUMENT when the pointer is not device memory from cudaMalloc.
absl::StatusOr<CudaIpcBuffer> ExportCudaIpc(const void* device_ptr);

// This host's identity as CUDA IPC needs it: the Linux boot id (the same for every process and
// container of one running kernel). UNAVAILABLE when /proc does not tell it.
absl::StatusOr<std::string> HostBootId();

// Worker side: maps exported allocations into this process (cached per handle, since opening
// costs milliseconds) and resolves (handle, offset, bytes) to a device pointer.
// Thread-safe. Mappings stay until the importer is destroyed (a session's lifetime) or until
// more than kMaxMapped handles are mapped, when the least recently used is closed: a pointer
// from Map() stays valid until a later Map() of ANOTHER handle (callers serialise per session).
// The exporting process must keep the memory alive while it may be used.
class CudaIpcImporter {
 public:
  static constexpr size_t kMaxMapped = 64;

  explicit CudaIpcImporter(int device) : device_(device) {}
  ~CudaIpcImporter();
  CudaIpcImporter(const CudaIpcImporter&) = delete;
  CudaIpcImporter& operator=(const CudaIpcImporter&) = delete;

  int device() const { return device_; }
  // Handles mapped now (tests).
  size_t mapped() const;

  // INVALID_ARGUMENT for a malformed handle or a range past the end of the allocation;
  // FAILED_PRECONDITION (naming tensor.cuda_ipc_handle) when the handle cannot be opened here
  // (another host, the same process, freed memory): not retryable.
  absl::StatusOr<void*> Map(const std::string& handle, int64_t offset, size_t bytes);

  // Copies `bytes` between the mapped buffer and `local` (a device pointer of this worker),
  // asynchronously on `stream` (cudaStream_t). to_local: buffer -> local, else local -> buffer.
  absl::Status Copy(const std::string& handle, int64_t offset, void* local, size_t bytes,
                    bool to_local, void* stream);

 private:
  struct Mapping {
    void* base = nullptr;
    size_t bytes = 0;
    uint64_t last_use = 0;
  };
  int device_;
  mutable absl::Mutex mu_;
  uint64_t uses_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, Mapping> mapped_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dfa
