#include "worker/gpu/pooled_backend.h"

#include <cuda_runtime_api.h>

#include "core/gpu/cuda_status.h"

namespace dfa {
namespace {

absl::Status DeviceSync(int device) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<void*> AllocateFromPool(DeviceMemoryPool* pool, size_t bytes) {
  auto p = pool->Allocate(bytes);
  if (p.ok() || p.status().code() != absl::StatusCode::kResourceExhausted ||
      pool->retired_bytes() == 0) {
    return p;
  }
  // Full, but retired blocks wait for the device: wait once, take them back, try again.
  RETURN_IF_ERROR(DeviceSync(pool->device()));
  pool->ReclaimRetired();
  return pool->Allocate(bytes);
}

ScratchAllocator PoolScratchAllocator(std::shared_ptr<DeviceMemoryPool> pool) {
  ScratchAllocator s;
  s.alloc = [pool](size_t bytes) { return AllocateFromPool(pool.get(), bytes); };
  s.release = [pool](void* p) { (void)pool->Retire(p); };
  return s;
}

absl::StatusOr<void*> PooledBackend::Alloc(size_t bytes) { return AllocateFromPool(pool_.get(), bytes); }

void PooledBackend::Free(void* p) {
  if (p != nullptr) (void)pool_->Retire(p);
}

// Runs `call` between the trace's Begin and End when tracing is on.
template <typename F>
absl::Status Traced(OpTrace* trace, void* stream, const char* what, int64_t rows, int64_t cols,
                    F&& call) {
  if (trace == nullptr) return call();
  trace->Begin(stream, what, rows, cols);
  absl::Status s = call();
  trace->End(stream);
  return s;
}

absl::Status PooledBackend::Forward(const ForwardArgs& a) {
  const char* what = a.mask == MaskKind::kCausal      ? "fwd causal"
                     : a.mask == MaskKind::kIntervals ? "fwd masked"
                                                      : "fwd full";
  return Traced(trace_.get(), a.stream, what, a.q.rows, a.k.rows, [&] { return inner_->Forward(a); });
}

absl::Status PooledBackend::Backward(const BackwardArgs& a) {
  const char* what = a.mask == MaskKind::kCausal      ? "bwd causal"
                     : a.mask == MaskKind::kIntervals ? "bwd masked"
                                                      : "bwd full";
  return Traced(trace_.get(), a.stream, what, a.q.rows, a.k.rows,
                [&] { return inner_->Backward(a); });
}

absl::Status PooledBackend::Merge(const MergeArgs& a) {
  return Traced(trace_.get(), a.stream, "merge", a.out_a.rows, 0, [&] { return inner_->Merge(a); });
}

absl::Status PooledBackend::ComputeDelta(const TensorView& dout, const TensorView& out,
                                         const RowStatView& delta, void* stream) {
  return Traced(trace_.get(), stream, "delta", dout.rows, 0,
                [&] { return inner_->ComputeDelta(dout, out, delta, stream); });
}

absl::Status PooledBackend::Convert(const TensorView& src, const TensorView& dst, void* stream) {
  return Traced(trace_.get(), stream, "convert", src.rows, 0,
                [&] { return inner_->Convert(src, dst, stream); });
}

absl::Status PooledBackend::Accumulate(const TensorView& src, const TensorView& dst,
                                       void* stream) {
  return Traced(trace_.get(), stream, "accumulate", src.rows, 0,
                [&] { return inner_->Accumulate(src, dst, stream); });
}

absl::Status PooledBackend::Copy(void* dst, const void* src, size_t bytes, CopyKind kind,
                                 void* stream) {
  return Traced(trace_.get(), stream, "copy (KiB)", static_cast<int64_t>(bytes >> 10), 0,
                [&] { return inner_->Copy(dst, src, bytes, kind, stream); });
}

absl::Status PooledBackend::Memset(void* dst, int value, size_t bytes, void* stream) {
  return Traced(trace_.get(), stream, "memset (KiB)", static_cast<int64_t>(bytes >> 10), 0,
                [&] { return inner_->Memset(dst, value, bytes, stream); });
}

absl::Status PooledBackend::Synchronize(void* stream) {
  RETURN_IF_ERROR(inner_->Synchronize(stream));
  if (stream == nullptr && pool_->retired_bytes() > 0) {
    RETURN_IF_ERROR(DeviceSync(pool_->device()));
    pool_->ReclaimRetired();
  }
  if (trace_) trace_->Report();
  return absl::OkStatus();
}

}  // namespace dfa
