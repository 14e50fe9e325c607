// CancellableBackend: an AttentionBackend decorator that makes a running CPU job stop promptly.
//
// The plan executor checks its cancel flag only between plan steps, and one step of a long
// sequence on a CPU worker computes for seconds. This decorator cuts every Forward and
// Backward unit into pieces worth at most `flops_per_piece` FLOPs and checks `*cancel` before
// each piece: a cancel (CancelJob, a client that went away, SIGTERM) then takes effect within
// one piece, about 0.1-0.3 s on a CPU. A forward piece is a range of query rows (whole 64-row
// blocks) over all keys: each query row's output and LSE depend only on that row. A backward
// piece is a tile of query rows x keys, about square (keys in 64-row blocks, about
// sqrt(flops_per_piece / FLOPs per pair) of them), tiles that see no key of theirs skipped: a
// CPU backward call packs all its keys and adds all their dK/dV, so row pieces over every key
// of a long unit would spend as long on that as on the work. dQ, dK and dV are sums over keys
// and query rows: the tiles add their parts (only the fp32 summation order changes).
// Every other call is forwarded unchanged.
//
// Ownership: owns `inner`; `cancel` must outlive the decorator. Thread safety: as the inner
// backend (one thread at a time); `*cancel` may be set from any thread.
// Errors: CANCELLED ("cancelled inside a unit") once *cancel is seen; the inner backend's
// errors otherwise. A cancelled unit leaves its outputs partly written (the job fails anyway).
#pragma once

#include <atomic>
#include <memory>

#include "kernels/attention_backend.h"

namespace dfa {

class CancellableBackend final : public AttentionBackend {
 public:
  // FLOPs (as ForwardFlops counts them; backward 2.5x) per piece for one CPU thread: about
  // 0.2 s at ~13 GFLOP/s per thread. Multiply by the backend's thread count.
  static constexpr double kFlopsPerThreadPiece = 3e9;

  CancellableBackend(std::unique_ptr<AttentionBackend> inner, const std::atomic<bool>* cancel,
                     double flops_per_piece)
      : inner_(std::move(inner)), cancel_(cancel), flops_per_piece_(flops_per_piece) {}

  std::string_view Name() const override { return inner_->Name(); }
  absl::Status Forward(const ForwardArgs& args) override;
  absl::Status Backward(const BackwardArgs& args) override;
  absl::Status Merge(const MergeArgs& args) override { return inner_->Merge(args); }
  absl::Status ComputeDelta(const TensorView& dout, const TensorView& out, const RowStatView& delta,
                            void* stream) override {
    return inner_->ComputeDelta(dout, out, delta, stream);
  }
  absl::Status Convert(const TensorView& src, const TensorView& dst, void* stream) override {
    return inner_->Convert(src, dst, stream);
  }
  absl::Status Accumulate(const TensorView& src, const TensorView& dst, void* stream) override {
    return inner_->Accumulate(src, dst, stream);
  }
  absl::StatusOr<void*> Alloc(size_t bytes) override { return inner_->Alloc(bytes); }
  void Free(void* p) override { inner_->Free(p); }
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

  AttentionBackend* inner() const { return inner_.get(); }

 private:
  // End of the piece of query rows starting at `r0` (of m): at least one 64-row block, at most
  // flops_per_piece_ worth of visible (query, key) pairs.
  // kIntervals: the pairs the unit's interval arrays (host memory) let through.
  int64_t PieceEnd(int64_t r0, int64_t m, int64_t q_row0, int64_t kv_row0, int64_t n, MaskKind mask,
                   const MaskIntervals& intervals, int batch, double flops_per_row_pair) const;
  absl::Status CheckCancelled() const;

  std::unique_ptr<AttentionBackend> inner_;
  const std::atomic<bool>* cancel_;
  const double flops_per_piece_;
};

}  // namespace dfa
