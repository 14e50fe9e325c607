#include "worker/memory_budget.h"

#include "absl/strings/str_cat.h"

namespace dfa {

absl::Status MemoryBudget::Reserve(int64_t bytes) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("bytes to reserve must be >= 0, got ", bytes));
  }
  std::lock_guard<std::mutex> l(mu_);
  if (limit_ > 0 && bytes > limit_ - used_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session needs ", bytes, " bytes but the worker has ", limit_ - used_,
                     " of its memory_limit_bytes = ", limit_, " free (", used_, " in use)"));
  }
  used_ += bytes;
  return absl::OkStatus();
}

void MemoryBudget::Release(int64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  used_ -= bytes;
  if (used_ < 0) used_ = 0;
}

int64_t MemoryBudget::used() const {
  std::lock_guard<std::mutex> l(mu_);
  return used_;
}

}  // namespace dfa
