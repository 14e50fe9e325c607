#include "worker/transport/nccl_bootstrap.h"

#include "absl/strings/str_cat.h"
#include "core/gpu/nccl_transport.h"

namespace dfa {

absl::StatusOr<std::unique_ptr<NcclBootstrap>> NcclBootstrap::Start(int device, int rank,
                                                                   int size,
                                                                   std::string unique_id,
                                                                   absl::Duration init_timeout) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl bootstrap: rank ", rank, " is not in a group of size ", size));
  }
  if (unique_id.empty()) {
    if (rank != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("nccl_unique_id is empty on rank ", rank, " (only rank 0 creates it)"));
    }
    ASSIGN_OR_RETURN(unique_id, NewNcclUniqueId());
  }
  std::unique_ptr<NcclBootstrap> b(new NcclBootstrap());
  b->unique_id_ = unique_id;
  NcclTransportOptions o;
  o.device = device;
  o.rank = rank;
  o.size = size;
  o.unique_id = std::move(unique_id);
  o.init_timeout = init_timeout;
  NcclBootstrap* self = b.get();
  b->thread_ = std::thread([self, o] {
    auto t = NcclTransport::Create(o);
    absl::MutexLock lock(&self->mu_);
    self->done_ = true;
    if (t.ok()) {
      self->transport_ = std::move(*t);
    } else {
      self->status_ = t.status();
    }
  });
  return b;
}

NcclBootstrap::~NcclBootstrap() {
  if (thread_.joinable()) thread_.join();  // bounded by init_timeout
}

absl::StatusOr<Transport*> NcclBootstrap::Get(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return done_; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&done), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "nccl bootstrap: the group's ranks did not all join within ", absl::FormatDuration(timeout)));
  }
  if (!status_.ok()) return status_;
  return transport_.get();
}

NcclTransport* NcclBootstrap::nccl() {
  absl::MutexLock lock(&mu_);
  return transport_.get();
}

}  // namespace dfa
