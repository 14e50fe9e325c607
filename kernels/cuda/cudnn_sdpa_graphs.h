// cuDNN SDPA graphs (forward and backward) built once per problem and cached; the only code that
// sees the cuDNN frontend (a heavy header-only library: kept out of every other translation unit).
//
// libcudnn is not linked: Create() loads it at run time (dlopen of $DFA_CUDNN_LIBRARY, else
// "libcudnn.so.9" from the loader's search path), so binaries built with this code run (and the
// "cudnn" backend answers UNAVAILABLE) where cuDNN is missing. The frontend then also loads the
// CUDA runtime library (libcudart.so.13, or $CUDNN_FRONTEND_CUDART_LIB_NAME) for its own calls.
//
// Thread safety: one thread at a time (like the AttentionBackend that owns it). The workspace is
// owned here and only grows; growing frees the old one (cudaFree waits for the device).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "kernels/attention_backend.h"
#include "core/status.h"

namespace dfa::cudnn {

// One SDPA call. Tensors are BSHD with element strides (head stride == head_dim, d stride 1);
// LSE ("Stats": natural log, scale included) is fp32 BHS. dtype: 2 bf16, 3 f16 (dfa::DType).
struct SdpaProblem {
  bool backward = false;
  int dtype = 2;
  int64_t batch = 1, q_heads = 0, kv_heads = 0, head_dim = 0, q_rows = 0, kv_rows = 0;
  int64_t right_bound = -1;  // -1 no mask; else key c visible to row r iff c <= r + right_bound
  float scale = 0.f;
  // {batch stride, row stride} of q, k, v, o, dout, dq, dk, dv; {batch, head} of lse.
  int64_t q_s[2] = {}, k_s[2] = {}, v_s[2] = {}, o_s[2] = {}, do_s[2] = {}, dq_s[2] = {}, dk_s[2] = {},
          dv_s[2] = {}, lse_s[2] = {};
};

// Device pointers. Forward reads q, k, v and writes o, lse. Backward reads q, k, v, o, dout, lse
// and overwrites dq, dk, dv (the problem's dtype).
struct SdpaPointers {
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
  const void* dout = nullptr;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;
};

class SdpaGraphs {
 public:
  // UNAVAILABLE when libcudnn cannot be loaded or a handle cannot be created on `device`.
  // `scratch` (optional, must outlive this object): where the workspace comes from; null or
  // empty: cudaMalloc.
  static absl::StatusOr<std::unique_ptr<SdpaGraphs>> Create(int device,
                                                            const ScratchAllocator* scratch = nullptr);
  ~SdpaGraphs();
  SdpaGraphs(const SdpaGraphs&) = delete;
  SdpaGraphs& operator=(const SdpaGraphs&) = delete;

  // Builds the graph for `p` on first use (tens of ms), then enqueues it on `stream`.
  // UNIMPLEMENTED when cuDNN has no engine for `p` (remembered: later calls fail fast), so the
  // caller can fall back to another kernel; INTERNAL for execution errors.
  absl::Status Run(const SdpaProblem& p, const SdpaPointers& ptrs, cudaStream_t stream);

  // "9.19.0" etc. of the loaded library.
  std::string LibraryVersion() const;
  int64_t cached_graphs() const;

 private:
  struct Impl;
  explicit SdpaGraphs(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dfa::cudnn
