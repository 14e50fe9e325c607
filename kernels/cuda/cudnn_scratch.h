// ScratchBuffer: a device buffer of the cudnn backend that only grows (staging buffers, cuDNN's
// workspace), taken from a ScratchAllocator (kernels/attention_backend.h: a GPU worker's pool)
// or, when that is empty, from cudaMalloc/cudaFree (growing then waits for the device).
// Not thread-safe; `scratch` must outlive the buffer.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "absl/strings/str_cat.h"
#include "kernels/attention_backend.h"

namespace dfa::cudnn {

class ScratchBuffer {
 public:
  // `what` names the buffer in errors ("scratch", "workspace").
  ScratchBuffer(const ScratchAllocator* scratch, const char* what) : scratch_(scratch), what_(what) {}
  ~ScratchBuffer() { Release(); }
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;

  // At least `bytes`; RESOURCE_EXHAUSTED naming the size when it cannot grow.
  absl::StatusOr<void*> Get(size_t bytes) {
    if (bytes <= size_) return p_;
    Release();
    if (scratch_->alloc) {
      absl::StatusOr<void*> p = scratch_->alloc(bytes);
      if (!p.ok()) return Exhausted(bytes, p.status().message());
      p_ = *p;
    } else {
      const cudaError_t err = cudaMalloc(&p_, bytes);
      if (err != cudaSuccess) {
        cudaGetLastError();
        p_ = nullptr;
        return Exhausted(bytes, cudaGetErrorString(err));
      }
    }
    size_ = bytes;
    return p_;
  }

 private:
  absl::Status Exhausted(size_t bytes, absl::string_view why) const {
    return absl::ResourceExhaustedError(
        absl::StrCat("cudnn backend: cannot allocate ", bytes, " bytes of ", what_, ": ", why));
  }
  void Release() {
    if (p_ == nullptr) return;
    if (scratch_->release) {
      scratch_->release(p_);  // stream-ordered: queued work may still read it
    } else {
      cudaFree(p_);
    }
    p_ = nullptr;
    size_ = 0;
  }

  const ScratchAllocator* scratch_;
  const char* what_;
  void* p_ = nullptr;
  size_t size_ = 0;
};

}  // namespace dfa::cudnn
