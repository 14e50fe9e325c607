// The tensors one worker holds for one attention session: its owned rows of Q, K, V, dO, the
// forward's LSE and the backward's D, and one work region for O and the passes' fp32
// accumulators (core/shape.h SessionStorageLayout; docs/memory.md). All memory comes from the
// worker's AttentionBackend (host memory for cpu, device memory for cuda), one block per tensor.
//
// Layout. The worker's owned global row ranges (its shard; a zigzag layout owns several) are
// packed in order into "local" rows 0..rows()-1. Tensors are dense BSHD over the local rows
// ([batch, rows, heads, head_dim]); per-row statistics are dense fp32 BHS ([batch, heads, rows]).
//   q, dout              : [B, rows, q_heads, D]   in the session's dtype
//   k, v                 : [B, rows, kv_heads, D]  in the session's dtype (never expanded)
//   lse, delta           : [B, q_heads, rows]      fp32
//   work region          : o [B, rows, q_heads, D] (dtype) at offset 0; during a forward that
//                          merges, o_acc (fp32) after it; during a backward dq_acc (fp32, over o)
//                          and, unless the backward runs in key chunks, dk_acc, dv_acc (fp32).
// Gradients end in the session's dtype in the inputs' slots: dq() is q's memory, dk() k's, dv()
// v's. Who writes what: the worker daemon fills q, k, v (upload) and dout (before a backward
// pass); PlanExecutor::RunForward writes o and lse; RunBackward reads o into delta, then
// accumulates into the work region and converts the gradients into q, k, v (consuming them).
//
// Ownership: the storage owns its buffers and frees them through the backend in its
// destructor; the backend must outlive it. Not thread-safe (one pass at a time).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/planner/plan.h"
#include "kernels/attention_backend.h"
#include "core/dtype.h"
#include "core/status.h"

namespace dfa {

class SessionStorage {
 public:
  // Allocates (and zeroes) every tensor for the given owned ranges (sorted, disjoint, non-empty),
  // with the work region `layout` asks for (the plan's: PlanWorkerMemory, core/planner/
  // worker_memory.h; the default is the widest). INVALID_ARGUMENT for a bad shape or ranges; the
  // backend's error (e.g. RESOURCE_EXHAUSTED) when memory runs out, with nothing left allocated.
  static absl::StatusOr<std::unique_ptr<SessionStorage>> Create(AttentionBackend* backend,
                                                                const AttentionShape& shape,
                                                                std::vector<RowRange> owned,
                                                                const StorageLayout& layout = {});
  ~SessionStorage();
  SessionStorage(const SessionStorage&) = delete;
  SessionStorage& operator=(const SessionStorage&) = delete;

  const AttentionShape& shape() const { return shape_; }
  const std::vector<RowRange>& owned() const { return owned_; }
  int64_t rows() const { return rows_; }
  const StorageLayout& layout() const { return layout_; }
  int64_t bytes() const { return bytes_.total; }

  // Local row of the first row of `global`, which must lie inside ONE owned range
  // (INVALID_ARGUMENT otherwise).
  absl::StatusOr<int64_t> LocalRow(const RowRange& global) const;

  // Views over all local rows; Slice(LocalRow(r), r.size()) selects a global range.
  TensorView q() const { return View(q_, shape_.dtype, shape_.q_heads); }
  TensorView k() const { return View(k_, shape_.dtype, shape_.kv_heads); }
  TensorView v() const { return View(v_, shape_.dtype, shape_.kv_heads); }
  TensorView o() const { return View(work_, shape_.dtype, shape_.q_heads); }
  TensorView dout() const { return View(dout_, shape_.dtype, shape_.q_heads); }
  // The gradients after a backward, in the session's dtype: the memory of q, k, v.
  TensorView dq() const { return q(); }
  TensorView dk() const { return k(); }
  TensorView dv() const { return v(); }
  RowStatView lse() const { return Stat(lse_); }
  RowStatView delta() const { return Stat(delta_); }
  // The work region's fp32 accumulators (data == nullptr when the layout has none).
  TensorView o_acc() const { return Work(bytes_.o_acc_offset, shape_.q_heads); }
  TensorView dq_acc() const { return Work(0, shape_.q_heads); }
  TensorView dk_acc() const { return Work(bytes_.dk_acc_offset, shape_.kv_heads); }
  TensorView dv_acc() const { return Work(bytes_.dv_acc_offset, shape_.kv_heads); }

 private:
  SessionStorage(AttentionBackend* backend, const AttentionShape& shape, std::vector<RowRange> owned,
                 int64_t rows, const StorageLayout& layout)
      : backend_(backend), shape_(shape), owned_(std::move(owned)), rows_(rows), layout_(layout),
        bytes_(SessionStorageLayout(shape, rows, layout)) {}
  TensorView View(void* p, DType t, int heads) const;
  TensorView Work(int64_t offset, int heads) const;
  RowStatView Stat(float* p) const;

  AttentionBackend* backend_;
  AttentionShape shape_;
  std::vector<RowRange> owned_;
  int64_t rows_ = 0;
  StorageLayout layout_;
  StorageBytes bytes_;
  void* q_ = nullptr;
  void* k_ = nullptr;
  void* v_ = nullptr;
  void* dout_ = nullptr;
  void* work_ = nullptr;
  float* lse_ = nullptr;
  float* delta_ = nullptr;
};

}  // namespace dfa
