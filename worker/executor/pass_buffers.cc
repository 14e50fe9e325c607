#include "worker/executor/pass_buffers.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "worker/executor/transfer_layout.h"

namespace dfa::executor_internal {

absl::StatusOr<std::unique_ptr<Buffer>> PassBuffers::New(PlanTensor t, const RowRange& rows) {
  auto b = std::make_unique<Buffer>();
  b->tensor = t;
  b->rows = rows;
  b->layout = {rows};
  for (const Component& c : Components(t, ctx_.shape)) {
    const int64_t bytes = ComponentBytes(c, ctx_.shape, rows.size());
    ASSIGN_OR_RETURN(void* p, ctx_.backend->Alloc(static_cast<size_t>(bytes)));
    b->parts.push_back(std::make_unique<DeviceBuffer>(ctx_.backend, p));
    b->bytes += bytes;
  }
  return b;
}

void PassBuffers::KeepReceived(std::unique_ptr<Buffer> b) { received_.push_back(std::move(b)); }

Buffer* PassBuffers::FindReceived(PlanTensor t, const RowRange& rows) {
  for (auto& b : received_) {
    if (b->tensor == t && b->rows.Contains(rows)) return b.get();
  }
  return nullptr;
}

absl::StatusOr<Buffer*> PassBuffers::Partial(PlanTensor t, const RowRange& rows) {
  for (auto& b : partials_) {
    if (b->tensor == t && b->rows == rows) return b.get();
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Buffer> b, New(t, rows));
  const std::vector<Component> comps = Components(t, ctx_.shape);
  for (size_t i = 0; i < comps.size(); ++i) {
    const size_t bytes = static_cast<size_t>(ComponentBytes(comps[i], ctx_.shape, rows.size()));
    if (comps[i].stat) {  // LSE of an empty partial: -inf
      std::vector<float> host(bytes / 4, -std::numeric_limits<float>::infinity());
      RETURN_IF_ERROR(ctx_.backend->Copy(b->parts[i]->get(), host.data(), bytes,
                                         AttentionBackend::CopyKind::kHostToDevice, ctx_.stream));
    } else {
      RETURN_IF_ERROR(ctx_.backend->Memset(b->parts[i]->get(), 0, bytes, ctx_.stream));
    }
  }
  b->free_after = std::numeric_limits<int>::max();  // until its (last) send completes
  b->rows_unsent = rows.size();
  partials_.push_back(std::move(b));
  return partials_.back().get();
}

Buffer* PassBuffers::PartialContaining(PlanTensor t, const RowRange& rows) {
  Buffer* found = nullptr;
  for (auto& p : partials_) {
    if (p->tensor == t && p->rows.Contains(rows)) found = p.get();
  }
  return found;
}

int64_t PassBuffers::LiveBytes() const {
  int64_t live = 0;
  for (const auto& b : received_) live += b->bytes;
  for (const auto& b : partials_) live += b->bytes;
  return live;
}

void PassBuffers::ReleaseSent(int t) {
  auto sent = [t](const std::unique_ptr<Buffer>& b) { return b->free_after <= t; };
  partials_.erase(std::remove_if(partials_.begin(), partials_.end(), sent), partials_.end());
}

void PassBuffers::ReleaseAfterStep(int t) {
  auto unused = [t](const std::unique_ptr<Buffer>& b) { return b->free_after <= t; };
  received_.erase(std::remove_if(received_.begin(), received_.end(), unused), received_.end());
  auto sent = [t](const std::unique_ptr<Buffer>& b) { return b->free_after < t; };
  partials_.erase(std::remove_if(partials_.begin(), partials_.end(), sent), partials_.end());
}

}  // namespace dfa::executor_internal
