#include "worker/executor/session_storage.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dfa {

absl::StatusOr<std::unique_ptr<SessionStorage>> SessionStorage::Create(
    AttentionBackend* backend, const AttentionShape& shape, std::vector<RowRange> owned,
    const StorageLayout& layout) {
  if (backend == nullptr) return absl::InvalidArgumentError("backend must not be null");
  RETURN_IF_ERROR(shape.Validate());
  if (owned.empty()) return absl::InvalidArgumentError("owned: no row ranges");
  int64_t rows = 0;
  for (size_t i = 0; i < owned.size(); ++i) {
    if (owned[i].begin < 0 || owned[i].size() <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("owned[", i, "]: empty or negative range [",
                                                     owned[i].begin, ", ", owned[i].end, ")"));
    }
    if (i > 0 && owned[i].begin < owned[i - 1].end) {
      return absl::InvalidArgumentError(
          absl::StrCat("owned[", i, "]: ranges must be sorted and disjoint"));
    }
    rows += owned[i].size();
  }
  std::unique_ptr<SessionStorage> s(
      new SessionStorage(backend, shape, std::move(owned), rows, layout));
  const StorageBytes& b = s->bytes_;
  struct Item {
    void** slot;
    int64_t bytes;
  };
  const Item items[] = {
      {&s->q_, b.q},
      {&s->k_, b.kv},
      {&s->v_, b.kv},
      {&s->dout_, b.dout},
      {&s->work_, b.work},
      {reinterpret_cast<void**>(&s->lse_), b.stat},
      {reinterpret_cast<void**>(&s->delta_), b.stat},
  };
  for (const Item& it : items) {
    ASSIGN_OR_RETURN(void* p, backend->Alloc(static_cast<size_t>(it.bytes)));
    *it.slot = p;  // owned by s from here: freed by its destructor on any later error
    RETURN_IF_ERROR(backend->Memset(p, 0, static_cast<size_t>(it.bytes), nullptr));
  }
  RETURN_IF_ERROR(backend->Synchronize(nullptr));
  return s;
}

SessionStorage::~SessionStorage() {
  for (void* p : {q_, k_, v_, dout_, work_, static_cast<void*>(lse_), static_cast<void*>(delta_)}) {
    if (p != nullptr) backend_->Free(p);
  }
}

absl::StatusOr<int64_t> SessionStorage::LocalRow(const RowRange& global) const {
  int64_t base = 0;
  for (const RowRange& r : owned_) {
    if (r.Contains(global) && global.size() > 0) return base + (global.begin - r.begin);
    base += r.size();
  }
  return absl::InvalidArgumentError(absl::StrCat("rows [", global.begin, ", ", global.end,
                                                 ") are not inside one owned range"));
}

TensorView SessionStorage::View(void* p, DType t, int heads) const {
  TensorView v;
  v.data = p;
  v.dtype = t;
  v.batch = shape_.batch;
  v.rows = rows_;
  v.heads = heads;
  v.head_dim = shape_.head_dim;
  return v;
}

TensorView SessionStorage::Work(int64_t offset, int heads) const {
  if (offset < 0) return TensorView{};
  return View(static_cast<char*>(work_) + offset, DType::kF32, heads);
}

RowStatView SessionStorage::Stat(float* p) const {
  RowStatView s;
  s.data = p;
  s.batch = shape_.batch;
  s.heads = shape_.q_heads;
  s.rows = rows_;
  return s;
}

}  // namespace dfa
