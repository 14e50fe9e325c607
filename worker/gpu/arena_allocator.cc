#include "worker/gpu/arena_allocator.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace dfa {

ArenaAllocator::ArenaAllocator(size_t capacity, size_t alignment)
    : capacity_(capacity & ~(alignment - 1)), alignment_(alignment) {
  if (capacity_ > 0) free_[0] = capacity_;
}

size_t ArenaAllocator::largest_free() const {
  size_t best = 0;
  for (const auto& [off, size] : free_) best = std::max(best, size);
  return best;
}

absl::StatusOr<size_t> ArenaAllocator::Allocate(size_t bytes) {
  const size_t need = std::max<size_t>(alignment_, (bytes + alignment_ - 1) & ~(alignment_ - 1));
  if (need < bytes) return absl::InvalidArgumentError(absl::StrCat("arena: bytes ", bytes, " overflow"));
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const size_t off = it->first;
    const size_t rest = it->second - need;
    free_.erase(it);
    if (rest > 0) free_[off + need] = rest;
    allocated_[off] = need;
    used_ += need;
    peak_used_ = std::max(peak_used_, used_);
    return off;
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("arena: cannot allocate ", bytes, " bytes: ", capacity_ - used_, " of ",
                   capacity_, " bytes free, largest free range ", largest_free()));
}

absl::Status ArenaAllocator::Free(size_t offset) {
  auto a = allocated_.find(offset);
  if (a == allocated_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("arena: offset ", offset, " is not allocated"));
  }
  size_t off = a->first, size = a->second;
  allocated_.erase(a);
  used_ -= size;
  auto next = free_.lower_bound(off);
  if (next != free_.end() && off + size == next->first) {  // merge with the range after
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {  // merge with the range before
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += size;
      return absl::OkStatus();
    }
  }
  free_[off] = size;
  return absl::OkStatus();
}

}  // namespace dfa
