// PooledBackend: an AttentionBackend that forwards every kernel to an inner (cuda) backend but
// serves Alloc/Free from a DeviceMemoryPool. The worker wraps its cuda backend in one, so that
// everything it allocates for sessions and jobs (Q/K/V/O/LSE, gradients, receive buffers,
// scratch) comes from the worker's pool and no cudaMalloc happens while a job runs.
//
// Free() is stream-ordered and never synchronises: the block is retired (quarantined) and
// becomes reusable only after a device-wide synchronisation, which happens in
// Synchronize(nullptr) (the default stream: the worker's end of a job) or when an Alloc() finds
// the pool full. Synchronize() of a stream of one's own (CreateStream: a job's computes, a
// data-plane copy) waits for that stream alone, so a copy never waits for a running job's
// kernels. So buffers that a pass
// frees while its kernels and NCCL transfers may still read them are never handed out early,
// and no step pays for a cudaFree's implicit device synchronisation. Same thread rules as the
// inner backend. With DFA_TRACE_OPS=1 every call is timed on the device and each pass's
// timeline printed at its Synchronize() (op_trace.h).
#pragma once

#include <memory>

#include "kernels/attention_backend.h"
#include "worker/gpu/device_memory_pool.h"
#include "worker/gpu/op_trace.h"

namespace dfa {

// Allocate from `pool`; when it is full but holds retired blocks, waits once for the device,
// takes them back and tries again (what PooledBackend::Alloc does).
absl::StatusOr<void*> AllocateFromPool(DeviceMemoryPool* pool, size_t bytes);

// Scratch for a backend's own buffers (BackendOptions::scratch) from `pool`: allocate as above,
// release = retire (stream-ordered).
ScratchAllocator PoolScratchAllocator(std::shared_ptr<DeviceMemoryPool> pool);

class PooledBackend : public AttentionBackend {
 public:
  PooledBackend(std::unique_ptr<AttentionBackend> inner, std::shared_ptr<DeviceMemoryPool> pool)
      : inner_(std::move(inner)), pool_(std::move(pool)) {}

  std::string_view Name() const override { return inner_->Name(); }
  absl::Status Forward(const ForwardArgs& a) override;
  absl::Status Backward(const BackwardArgs& a) override;
  absl::Status Merge(const MergeArgs& a) override;
  absl::Status ComputeDelta(const TensorView& dout, const TensorView& out,
                            const RowStatView& delta, void* stream) override;
  absl::Status Convert(const TensorView& src, const TensorView& dst, void* stream) override;
  absl::Status Accumulate(const TensorView& src, const TensorView& dst, void* stream) override;
  absl::StatusOr<void*> Alloc(size_t bytes) override;
  void Free(void* p) override;
  absl::Status Copy(void* dst, const void* src, size_t bytes, CopyKind kind,
                    void* stream) override;
  absl::Status Memset(void* dst, int value, size_t bytes, void* stream) override;
  absl::Status Synchronize(void* stream) override;
  absl::StatusOr<void*> CreateStream() override { return inner_->CreateStream(); }
  void DestroyStream(void* stream) override { inner_->DestroyStream(stream); }

  AttentionBackend* inner() { return inner_.get(); }
  DeviceMemoryPool* pool() { return pool_.get(); }

 private:
  std::unique_ptr<AttentionBackend> inner_;
  std::shared_ptr<DeviceMemoryPool> pool_;
  std::unique_ptr<OpTrace> trace_{OpTrace::FromEnvironment()};  // DFA_TRACE_OPS=1 only
};

}  // namespace dfa
