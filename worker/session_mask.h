// A session's mask as its worker holds it: the MaskSpec of the spec and, when the mask is not
// dense (documents or a window), the per-position interval arrays the kernels read
// (core/mask.h BuildMaskIntervals), built once per session and kept in the backend's memory
// (host for cpu, device for cuda: the backend's Alloc/Copy). Dense masks hold no arrays, and
// the executor keeps calling kFull / kCausal.
#pragma once

#include <cstdint>
#include <memory>

#include "core/mask.h"
#include "core/status.h"
#include "kernels/attention_backend.h"

namespace dfa {

class SessionMask {
 public:
  // Bytes Create allocates for a mask over `batch` rows of `seq` positions (0 when dense).
  static int64_t Bytes(const MaskSpec& mask, int batch, int64_t seq);
  // `mask` must have passed ValidateMask(mask, batch, seq). The backend's error (e.g.
  // RESOURCE_EXHAUSTED) when its memory runs out, with nothing left allocated.
  static absl::StatusOr<std::unique_ptr<SessionMask>> Create(AttentionBackend* backend,
                                                             const MaskSpec& mask, int batch,
                                                             int64_t seq);
  ~SessionMask();
  SessionMask(const SessionMask&) = delete;
  SessionMask& operator=(const SessionMask&) = delete;

  const MaskSpec& spec() const { return spec_; }
  bool dense() const { return data_ == nullptr; }
  // The arrays in the backend's memory (all null when dense).
  MaskIntervals intervals() const { return intervals_; }
  int64_t bytes() const { return bytes_; }

 private:
  SessionMask(AttentionBackend* backend, MaskSpec spec)
      : backend_(backend), spec_(std::move(spec)) {}

  AttentionBackend* backend_;
  MaskSpec spec_;
  void* data_ = nullptr;  // one block: q_lo, q_hi, k_lo, k_hi
  int64_t bytes_ = 0;
  MaskIntervals intervals_;
};

}  // namespace dfa
