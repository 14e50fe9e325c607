// The tensors one worker holds for one attention session: its owned rows of Q, K, V, the
// forward's O and LSE, the backward's dO and D, and the gradients dQ, dK, dV. All memory comes
// from the worker's AttentionBackend (host memory for cpu, device memory for cuda).
//
// Layout. The worker's owned global row ranges (its shard; a zigzag layout owns several) are
// packed in order into "local" rows 0..rows()-1. Tensors are dense BSHD over the local rows
// ([batch, rows, heads, head_dim]); per-row statistics are dense fp32 BHS ([batch, heads, rows]).
//   q, o, dout           : [B, rows, q_heads, D]   in the session's dtype
//   k, v                 : [B, rows, kv_heads, D]  in the session's dtype (never expanded)
//   lse, delta           : [B, q_heads, rows]      fp32
//   dq                   : [B, rows, q_heads, D]   fp32
//   dk, dv               : [B, rows, kv_heads, D]  fp32
// Who writes what: the worker daemon fills q, k, v (upload) and dout (before a backward pass);
// PlanExecutor::RunForward writes o and lse; RunBackward writes delta, dq, dk, dv.
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
  // Allocates (and zeroes) every tensor for the given owned ranges (sorted, disjoint, non-empty).
  // INVALID_ARGUMENT for a bad shape or ranges; the backend's error (e.g. RESOURCE_EXHAUSTED)
  // when memory runs out, with nothing left allocated.
  static absl::StatusOr<std::unique_ptr<SessionStorage>> Create(AttentionBackend* backend,
                                                                const AttentionShape& shape,
                                                                std::vector<RowRange> owned);
  ~SessionStorage();
  SessionStorage(const SessionStorage&) = delete;
  SessionStorage& operator=(const SessionStorage&) = delete;

  const AttentionShape& shape() const { return shape_; }
  const std::vector<RowRange>& owned() const { return owned_; }
  int64_t rows() const { return rows_; }
  int64_t bytes() const { return SessionStorageBytes(shape_, rows_); }

  // Local row of the first row of `global`, which must lie inside ONE owned range
  // (INVALID_ARGUMENT otherwise).
  absl::StatusOr<int64_t> LocalRow(const RowRange& global) const;

  // Views over all local rows; Slice(LocalRow(r), r.size()) selects a global range.
  TensorView q() const { return View(q_, shape_.dtype, shape_.q_heads); }
  TensorView k() const { return View(k_, shape_.dtype, shape_.kv_heads); }
  TensorView v() const { return View(v_, shape_.dtype, shape_.kv_heads); }
  TensorView o() const { return View(o_, shape_.dtype, shape_.q_heads); }
  TensorView dout() const { return View(dout_, shape_.dtype, shape_.q_heads); }
  TensorView dq() const { return View(dq_, DType::kF32, shape_.q_heads); }
  TensorView dk() const { return View(dk_, DType::kF32, shape_.kv_heads); }
  TensorView dv() const { return View(dv_, DType::kF32, shape_.kv_heads); }
  RowStatView lse() const { return Stat(lse_); }
  RowStatView delta() const { return Stat(delta_); }

 private:
  SessionStorage(AttentionBackend* backend, const AttentionShape& shape, std::vector<RowRange> owned,
                 int64_t rows)
      : backend_(backend), shape_(shape), owned_(std::move(owned)), rows_(rows) {}
  TensorView View(void* p, DType t, int heads) const;
  RowStatView Stat(float* p) const;

  AttentionBackend* backend_;
  AttentionShape shape_;
  std::vector<RowRange> owned_;
  int64_t rows_ = 0;
  void* q_ = nullptr;
  void* k_ = nullptr;
  void* v_ = nullptr;
  void* o_ = nullptr;
  void* dout_ = nullptr;
  float* dq_ = nullptr;
  float* dk_ = nullptr;
  float* dv_ = nullptr;
  float* lse_ = nullptr;
  float* delta_ = nullptr;
};

}  // namespace dfa
