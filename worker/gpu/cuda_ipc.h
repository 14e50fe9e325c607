// CUDA IPC between processes of one host: a client (a training process, or `dfa`) hands a
// device buffer to a worker by a 64-byte cudaIpcMemHandle and an offset, and the worker copies
// between it and session memory on the GPU (device to device, NVLink/PCIe peer copy when the
// buffer is on another GPU) — no copy through host memory, no socket.
//
// Wire form (worker.proto SharedMemoryTransferRequest.cuda_ipc_handle / cuda_ipc_offset):
// the handle's 64 bytes and the byte offset of the tensor inside the exported allocation
// (PyTorch: storage._share_cuda_() gives both).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "absl/synchronization/mutex.h"
#include "kernels/status.h"

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

// Worker side: maps exported allocations into this process (cached per handle, since opening
// costs milliseconds) and resolves (handle, offset, bytes) to a device pointer.
// Thread-safe. Mappings stay until the importer is destroyed (a session's lifetime); the
// exporting process must keep the memory alive until then.
class CudaIpcImporter {
 public:
  explicit CudaIpcImporter(int device) : device_(device) {}
  ~CudaIpcImporter();

  // INVALID_ARGUMENT for a malformed handle or a range past the end of the allocation;
  // UNAVAILABLE when the handle cannot be opened here (another host, or the same process).
  absl::StatusOr<void*> Map(const std::string& handle, int64_t offset, size_t bytes);

  // Copies `bytes` between the mapped buffer and `local` (a device pointer of this worker),
  // asynchronously on `stream` (cudaStream_t). to_local: buffer -> local, else local -> buffer.
  absl::Status Copy(const std::string& handle, int64_t offset, void* local, size_t bytes,
                    bool to_local, void* stream);

 private:
  struct Mapping {
    void* base = nullptr;
    size_t bytes = 0;
  };
  int device_;
  absl::Mutex mu_;
  std::map<std::string, Mapping> mapped_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dfa
