#include "worker/session_mask.h"

#include <cstring>
#include <vector>

namespace dfa {

int64_t SessionMask::Bytes(const MaskSpec& mask, int batch, int64_t seq) {
  if (mask.IsDense()) return 0;
  return 4 * int64_t{batch} * seq * static_cast<int64_t>(sizeof(int32_t));
}

absl::StatusOr<std::unique_ptr<SessionMask>> SessionMask::Create(AttentionBackend* backend,
                                                                 const MaskSpec& mask, int batch,
                                                                 int64_t seq) {
  std::unique_ptr<SessionMask> m(new SessionMask(backend, mask));
  if (mask.IsDense()) return m;
  const MaskIntervalArrays a = BuildMaskIntervals(mask, batch, seq);
  const size_t n = a.q_lo.size();
  const size_t bytes = 4 * n * sizeof(int32_t);
  std::vector<int32_t> host(4 * n);
  std::memcpy(host.data(), a.q_lo.data(), n * sizeof(int32_t));
  std::memcpy(host.data() + n, a.q_hi.data(), n * sizeof(int32_t));
  std::memcpy(host.data() + 2 * n, a.k_lo.data(), n * sizeof(int32_t));
  std::memcpy(host.data() + 3 * n, a.k_hi.data(), n * sizeof(int32_t));
  ASSIGN_OR_RETURN(void* p, backend->Alloc(bytes));
  m->data_ = p;
  m->bytes_ = static_cast<int64_t>(bytes);
  RETURN_IF_ERROR(backend->Copy(p, host.data(), bytes,
                                AttentionBackend::CopyKind::kHostToDevice, nullptr));
  // The host copy dies here: wait for the copy to land.
  RETURN_IF_ERROR(backend->Synchronize(nullptr));
  const int32_t* base = static_cast<const int32_t*>(p);
  m->intervals_ = {base, base + n, base + 2 * n, base + 3 * n, seq};
  return m;
}

SessionMask::~SessionMask() {
  if (data_ != nullptr) backend_->Free(data_);
}

}  // namespace dfa
