// An AttentionBackend decorator that counts the memory allocated through it: the bytes alive now
// and the most alive at once since construction (or ResetPeak). Everything else is forwarded.
// The simulator measures each worker's session memory with it (SimulationResult::peak_bytes),
// against what admission charges (core/planner/worker_memory.h; docs/memory.md).
// Thread safety: as the wrapped backend's (one thread at a time); the counters are atomics so a
// test may read them from another thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "kernels/attention_backend.h"

namespace dfa {

class MemoryTrackingBackend final : public AttentionBackend {
 public:
  explicit MemoryTrackingBackend(std::unique_ptr<AttentionBackend> inner)
      : inner_(std::move(inner)) {}

  int64_t live_bytes() const { return live_.load(); }
  int64_t peak_bytes() const { return peak_.load(); }
  void ResetPeak() { peak_.store(live_.load()); }

  std::string_view Name() const override { return inner_->Name(); }
  absl::Status Forward(const ForwardArgs& a) override { return inner_->Forward(a); }
  absl::Status Backward(const BackwardArgs& a) override { return inner_->Backward(a); }
  absl::Status Merge(const MergeArgs& a) override { return inner_->Merge(a); }
  absl::Status ComputeDelta(const TensorView& dout, const TensorView& out,
                            const RowStatView& delta, void* stream) override {
    return inner_->ComputeDelta(dout, out, delta, stream);
  }
  absl::Status Convert(const TensorView& src, const TensorView& dst, void* stream) override {
    return inner_->Convert(src, dst, stream);
  }
  absl::Status Accumulate(const TensorView& src, const TensorView& dst, void* stream) override {
    return inner_->Accumulate(src, dst, stream);
  }
  absl::StatusOr<void*> Alloc(size_t bytes) override;
  void Free(void* p) override;
  absl::Status Copy(void* dst, const void* src, size_t bytes, CopyKind kind,
                    void* stream) override {
    return inner_->Copy(dst, src, bytes, kind, stream);
  }
  absl::Status Memset(void* dst, int value, size_t bytes, void* stream) override {
    return inner_->Memset(dst, value, bytes, stream);
  }
  absl::Status Synchronize(void* stream) override { return inner_->Synchronize(stream); }
  absl::StatusOr<void*> CreateStream() override { return inner_->CreateStream(); }
  void DestroyStream(void* stream) override { inner_->DestroyStream(stream); }

 private:
  std::unique_ptr<AttentionBackend> inner_;
  std::mutex mu_;
  std::unordered_map<void*, size_t> sizes_;  // guarded by mu_
  std::atomic<int64_t> live_{0};
  std::atomic<int64_t> peak_{0};
};

}  // namespace dfa
