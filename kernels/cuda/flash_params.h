// The plain parameter structs that are all the fused attention kernels see, and the launcher
// entry points (one per dtype x head dim, defined in the flash_{fwd,bwd}_*.cu files).
// Host code fills these from validated ForwardArgs/BackwardArgs (cuda_backend.cc); every
// stride is in elements, every pointer is device memory aligned to 16 bytes.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/kernel_dispatch.h"

namespace dfa::cuda {

// MaskKind::kIntervals (kernels/attention_backend.h MaskIntervals): int32 device arrays of
// [batch * seq], indexed b * seq + global position. Query p sees keys [q_lo, q_hi), key p is
// seen by queries [k_lo, k_hi); lo and hi are non-decreasing in p. Read only when `on`.
struct IntervalParams {
  const int32_t* q_lo = nullptr;
  const int32_t* q_hi = nullptr;
  const int32_t* k_lo = nullptr;
  const int32_t* k_hi = nullptr;
  int64_t seq = 0;
  bool on = false;
};

struct FwdParams {
  const void* q = nullptr;  // [B, m, Hq, D] bf16/f16
  const void* k = nullptr;  // [B, n, Hkv, D]
  const void* v = nullptr;
  void* out = nullptr;      // [B, m, Hq, D] fp32 or q's dtype
  float* lse = nullptr;     // [B, Hq, m], natural log
  int64_t q_batch_stride = 0, q_row_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0;
  int64_t lse_batch_stride = 0, lse_head_stride = 0;
  int batch = 0, q_heads = 0, kv_heads = 0;
  int64_t m = 0, n = 0;           // query rows, key rows of the unit
  int64_t q_row0 = 0, kv_row0 = 0;  // global positions (causal mask)
  float scale = 0.f;
  bool causal = false;
  bool out_f32 = false;
  bool accumulate = false;  // merge into an existing fp32 partial (out, lse)
  IntervalParams iv;        // the kIntervals mask (causal is then false)
};

struct BwdParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* dout = nullptr;  // q's layout and dtype
  const float* lse = nullptr;  // [B, Hq, m]
  const float* delta = nullptr;
  float* dq = nullptr;  // fp32, q's layout (own strides)
  float* dk = nullptr;  // fp32, k's layout (own strides)
  float* dv = nullptr;
  int64_t q_batch_stride = 0, q_row_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0;
  int64_t do_batch_stride = 0, do_row_stride = 0;
  int64_t dq_batch_stride = 0, dq_row_stride = 0;
  int64_t dk_batch_stride = 0, dk_row_stride = 0;
  int64_t dv_batch_stride = 0, dv_row_stride = 0;
  int64_t lse_batch_stride = 0, lse_head_stride = 0;
  int64_t delta_batch_stride = 0, delta_head_stride = 0;
  int batch = 0, q_heads = 0, kv_heads = 0;
  int64_t m = 0, n = 0;
  int64_t q_row0 = 0, kv_row0 = 0;
  float scale = 0.f;
  bool causal = false;
  IntervalParams iv;  // the kIntervals mask (causal is then false)
};

// Launchers (flash_{fwd,bwd}_*.cu, one per dtype x head dim): queue the kernel that the table
// of kernel_dispatch.h chose (ChooseForward / ChooseBackward) on `stream`; return the launch
// error (cudaSuccess when queued). Kept free of abseil so that nvcc compiles no host library
// headers.
cudaError_t LaunchFwdBf16Hdim64(const FwdParams& p, FwdKernel kernel, cudaStream_t stream);
cudaError_t LaunchFwdBf16Hdim128(const FwdParams& p, FwdKernel kernel, cudaStream_t stream);
cudaError_t LaunchFwdF16Hdim64(const FwdParams& p, FwdKernel kernel, cudaStream_t stream);
cudaError_t LaunchFwdF16Hdim128(const FwdParams& p, FwdKernel kernel, cudaStream_t stream);
cudaError_t LaunchBwdBf16Hdim64(const BwdParams& p, const BwdPlan& plan, cudaStream_t stream);
cudaError_t LaunchBwdBf16Hdim128(const BwdParams& p, const BwdPlan& plan, cudaStream_t stream);
cudaError_t LaunchBwdF16Hdim64(const BwdParams& p, const BwdPlan& plan, cudaStream_t stream);
cudaError_t LaunchBwdF16Hdim128(const BwdParams& p, const BwdPlan& plan, cudaStream_t stream);

}  // namespace dfa::cuda
