// Bytes held by sessions on one worker, bounded by the configured limit (0: unbounded).
// Thread-safe. Reserve before allocating, Release after freeing.
#pragma once

#include <cstdint>
#include <mutex>

#include "core/status.h"

namespace dfa {

// The memory this worker may use: the host's physical memory or, when lower, the limit of its
// cgroup (cgroup v2 memory.max of its cgroup and every parent; v1 memory.limit_in_bytes).
int64_t UsableMemoryBytes();

// The default session memory limit (when --memory_limit is not given): 80% of
// UsableMemoryBytes() divided by `workers_per_host` (>= 1), the workers that share that memory
// (--workers_per_host; the local cluster launcher passes its worker count), so the defaults of
// the workers of one host add up to 80% of it, not 80% each.
int64_t DefaultMemoryLimit(int workers_per_host);

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
