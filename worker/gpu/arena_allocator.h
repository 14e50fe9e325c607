// ArenaAllocator: hands out aligned byte ranges of one fixed-size arena (first fit, free ranges
// coalesced). Pure bookkeeping on offsets: it touches no memory, so the same logic serves the
// device memory pool (worker/gpu/device_memory_pool.h) and is testable without a GPU.
// Not thread-safe: the owner serialises calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>

#include "core/status.h"

namespace dfa {

class ArenaAllocator {
 public:
  // `capacity` bytes; every range starts at a multiple of `alignment` (a power of two).
  explicit ArenaAllocator(size_t capacity, size_t alignment = 256);

  // Offset of a new range of `bytes` (rounded up to the alignment; 0 bytes take one unit).
  // RESOURCE_EXHAUSTED naming the request, the free total and the largest free range.
  absl::StatusOr<size_t> Allocate(size_t bytes);
  // Returns a range given by Allocate. INVALID_ARGUMENT for an offset that is not allocated.
  absl::Status Free(size_t offset);

  // Size (after rounding) of the allocated range at `offset`; 0 when none is allocated there.
  size_t SizeOf(size_t offset) const {
    auto it = allocated_.find(offset);
    return it == allocated_.end() ? 0 : it->second;
  }
  size_t capacity() const { return capacity_; }
  size_t used() const { return used_; }
  size_t peak_used() const { return peak_used_; }
  size_t largest_free() const;
  size_t num_allocations() const { return allocated_.size(); }

 private:
  size_t capacity_;
  size_t alignment_;
  size_t used_ = 0;
  size_t peak_used_ = 0;
  std::map<size_t, size_t> free_;       // offset -> size, disjoint and never adjacent
  std::map<size_t, size_t> allocated_;  // offset -> size
};

}  // namespace dfa
