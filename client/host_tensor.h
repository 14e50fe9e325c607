// Host-memory tensors of a client: the full (unsharded) Q, K, V, dO a training job holds, and the
// O, LSE, dQ, dK, dV it gets back. Plus the shape rules that tie a TensorKind to an AttentionSpec.
//
// Layouts (as in proto/dfa/v1/attention.proto): every tensor except LSE is "BSHD",
// [batch, seq_len, heads, head_dim] of the spec's dtype, row major; LSE is fp32 "BHS",
// [batch, heads, seq_len]. A HostTensor owns its bytes; it is a plain value (copyable, movable),
// not thread-safe for concurrent writers of the same rows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dfa/v1/attention.pb.h"
#include "kernels/attention_backend.h"
#include "core/dtype.h"
#include "core/spec_validation.h"
#include "core/status.h"

namespace dfa::client {

// Dense host tensor. `row_stats` selects the BHS fp32 layout (LSE) instead of BSHD.
struct HostTensor {
  DType dtype = DType::kF32;
  int batch = 0;
  int64_t rows = 0;  // tokens (seq_len)
  int heads = 0;
  int head_dim = 0;  // 1 for row statistics
  bool row_stats = false;
  std::vector<uint8_t> bytes;
  // When set, the tensor's size_bytes() bytes live in caller memory (e.g. a numpy array or a
  // torch tensor handed in by the Python binding) and `bytes` stays empty: the tensor is a view
  // that uploads without a copy. The caller keeps that memory alive and unchanged while the
  // view is used; copies of the view share it.
  uint8_t* external = nullptr;

  int64_t elements() const { return int64_t{batch} * rows * heads * head_dim; }
  int64_t size_bytes() const { return elements() * DTypeSize(dtype); }
  // Bytes of one token row of one batch (all heads); BSHD only.
  int64_t row_bytes() const { return int64_t{heads} * head_dim * DTypeSize(dtype); }
  uint8_t* data() { return external != nullptr ? external : bytes.data(); }
  const uint8_t* data() const { return external != nullptr ? external : bytes.data(); }
  // Bytes the tensor's storage holds: size_bytes() for a view, bytes.size() otherwise.
  int64_t storage_bytes() const {
    return external != nullptr ? size_bytes() : static_cast<int64_t>(bytes.size());
  }
  // Kernel view of the whole tensor (BSHD) or of its row statistics (BHS, fp32).
  TensorView View() const;
  RowStatView StatView() const;
};

// ValidateSpec (core/spec_validation.h) with kNoSpecLimits: what is wrong with any spec (sizes
// < 1, heads not divisible, unknown dtype, bad scale). The coordinator and the workers check
// again, with their limits.
absl::Status ValidateSpec(const v1::AttentionSpec& spec);

absl::StatusOr<DType> FromProtoDType(v1::DType t);
v1::DType ToProtoDType(DType t);
// "bf16", "f16"/"fp16", "f32"/"fp32" -> DType; INVALID_ARGUMENT otherwise.
absl::StatusOr<v1::DType> ParseDType(const std::string& name);
std::string TensorKindName(v1::TensorKind kind);

// Allocates a zeroed tensor of the shape `kind` has under `spec` (the whole sequence).
absl::StatusOr<HostTensor> MakeTensor(const v1::AttentionSpec& spec, v1::TensorKind kind);
// Fills a BSHD tensor with deterministic uniform values in [-1, 1) (rounded to its dtype).
void FillRandom(uint64_t seed, HostTensor* t);
// An fp32 copy of a BSHD tensor (for comparisons and the reference).
HostTensor ToF32(const HostTensor& t);

// The softmax scale the service uses: spec.softmax_scale, or 1/sqrt(head_dim) when it is 0.
using ::dfa::EffectiveScale;
// Forward FLOPs of the whole job, 4·B·Hq·D per visible (query, key) pair (backward is 2.5x).
double ForwardFlops(const v1::AttentionSpec& spec);

}  // namespace dfa::client
