// Bytes held by sessions on one worker, bounded by the configured limit (0: unbounded).
// Thread-safe. Reserve before allocating, Release after freeing.
#pragma once

#include <cstdint>
#include <mutex>

#include "core/status.h"

namespace dfa {

class MemoryBudget {
 public:
  explicit MemoryBudget(int64_t limit_bytes) : limit_(limit_bytes) {}

  // RESOURCE_EXHAUSTED naming the bytes asked for, used and the limit; INVALID_ARGUMENT < 0.
  absl::Status Reserve(int64_t bytes);
  void Release(int64_t bytes);

  int64_t used() const;
  int64_t limit() const { return limit_; }

 private:
  const int64_t limit_;
  mutable std::mutex mu_;
  int64_t used_ = 0;
};

}  // namespace dfa
