#include "worker/executor/memory_tracking_backend.h"

#include <algorithm>

namespace dfa {

absl::StatusOr<void*> MemoryTrackingBackend::Alloc(size_t bytes) {
  ASSIGN_OR_RETURN(void* p, inner_->Alloc(bytes));
  std::lock_guard<std::mutex> l(mu_);
  sizes_[p] = bytes;
  const int64_t now = live_.fetch_add(static_cast<int64_t>(bytes)) + static_cast<int64_t>(bytes);
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
  return p;
}

void MemoryTrackingBackend::Free(void* p) {
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = sizes_.find(p);
    if (it != sizes_.end()) {
      live_.fetch_sub(static_cast<int64_t>(it->second));
      sizes_.erase(it);
    }
  }
  inner_->Free(p);
}

}  // namespace dfa
