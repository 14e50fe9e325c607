// The "cudnn" AttentionBackend: cuDNN's fused attention (SDPA, flash kernels with Hopper's own
// instructions) behind the interface of kernels/attention_backend.h, with our CUDA kernels
// (kernels/cuda/cuda_backend.h) for everything cuDNN cannot do here.
//
// Per call: Forward and Backward units at head dim 128 on Hopper (sm 9.0) go to our kernels
// (faster there through this interface: the "cudnn" rows of the table in kernel_dispatch.h;
// KernelChoice::cudnn_forward / cudnn_backward override it), counted as own_forward /
// own_backward. Otherwise Forward and Backward go to cuDNN when it can run the unit (bf16/f16;
// head_dim a multiple of 8 up to 256; 16-byte aligned data, strides multiples of 8 elements; for
// Backward also BackwardArgs::out, the final O, since cuDNN forms D = rowsum(dO * O) itself) and cuDNN
// has an engine for it (decided once per shape, when its graph is built); otherwise to our CUDA
// kernels, counted in Counters(). Merge, ComputeDelta, Convert and memory are our CUDA backend's.
// Units at global offsets become one cuDNN call (see cudnn_unit_geometry.h). cuDNN writes bf16/f16
// O and gradients: fp32 outputs, `accumulate` (LSE merge) and the `+=` into fp32 dQ/dK/dV go
// through scratch buffers that the backend owns, allocates on first use and only grows.
//
// Threads/streams: one thread at a time. The scratch is shared by all calls; a call on another
// stream than the previous one first waits (on the device, not the host) for that stream's
// earlier work, so the caller may switch streams freely.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kernels/attention_backend.h"
#include "kernels/cuda/kernel_dispatch.h"

namespace dfa {

struct CudnnBackendCounters {
  int64_t cudnn_forward = 0, cudnn_backward = 0;        // units run by cuDNN
  int64_t fallback_forward = 0, fallback_backward = 0;  // units run by our CUDA kernels
  int64_t own_forward = 0, own_backward = 0;  // units run by our kernels by choice (faster there)
  std::string last_fallback_reason;
};

class CudnnAttentionBackend : public AttentionBackend {
 public:
  virtual CudnnBackendCounters Counters() const = 0;
  // Version of the libcudnn loaded at run time, e.g. "9.19.0".
  virtual std::string CudnnVersion() const = 0;
  // Backward without BackwardArgs::out (helpers hold dO, LSE and D but not O): false runs such
  // units on our CUDA kernels; true runs them on cuDNN with a stand-in O built from `delta`
  // (LaunchOutFromDelta in cudnn_rowops.h; as precise as a bf16-rounded real O). Default: true
  // (checked by cudnn_backend_test on the H200).
  virtual void SetOutFromDelta(bool enabled) = 0;
};

// UNAVAILABLE when there is no usable GPU or libcudnn (9.x) cannot be loaded
// ($DFA_CUDNN_LIBRARY, else libcudnn.so.9 on the loader's path). `choice` overrides the table of
// kernel_dispatch.h, for our kernels and for the own-kernel-or-cuDNN choice (benchmarks, tests);
// INVALID_ARGUMENT as CreateCudaBackend.
absl::StatusOr<std::unique_ptr<CudnnAttentionBackend>> CreateCudnnBackend(
    const BackendOptions& options, const cuda::KernelChoice& choice = {});

}  // namespace dfa
