// The worker daemon's "nccl" SessionTransport (session_transport.h): the session's
// NcclTransport, brought up by NcclBootstrap from OpenSession (see nccl_bootstrap.h for the
// sequence with the coordinator). Declared in session_transport.cc under DFA_HAVE_NCCL.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dfa/v1/worker.pb.h"
#include "worker/transport/nccl_bootstrap.h"
#include "worker/transport/nccl_transport.h"
#include "worker/transport/session_transport.h"

namespace dfa {
namespace {

// How long the group may take to form (all ranks' OpenSession + ncclCommInitRank).
constexpr absl::Duration kInitTimeout = absl::Seconds(120);

class NcclSessionTransport : public SessionTransport {
 public:
  NcclSessionTransport(std::unique_ptr<NcclBootstrap> b, int size)
      : bootstrap_(std::move(b)), size_(size) {}

  std::string_view Name() const override { return "nccl"; }
  // Rank 0's is the group's NCCL unique id: the coordinator hands it to the other ranks.
  const std::string& address() const override { return bootstrap_->unique_id(); }

  absl::StatusOr<Transport*> ForJob(const std::string& job_id, const std::vector<std::string>&,
                                    absl::Duration timeout) override {
    ASSIGN_OR_RETURN(Transport * t, bootstrap_->Get(timeout));
    absl::Status health = bootstrap_->nccl()->status();
    if (!health.ok()) {
      // An aborted or failed communicator cannot be reused: the session must be reopened.
      return absl::UnavailableError(absl::StrCat("job ", job_id, ": the session's NCCL group ",
                                                 "failed earlier (", health.message(),
                                                 "); release and recreate the session"));
    }
    return t;
  }
  void Abort() override {
    if (NcclTransport* t = bootstrap_->nccl()) t->Abort();
  }
  double TakeDeviceIdleSeconds() override {
    NcclTransport* t = bootstrap_->nccl();
    if (t == nullptr) return 0;
    auto idle = t->CollectComputeIdleSeconds();
    return idle.ok() ? *idle : -1;
  }
  std::vector<int64_t> BytesSentPerPeer() const override {
    NcclTransport* t = bootstrap_->nccl();
    return t ? t->bytes_sent_per_peer() : std::vector<int64_t>(size_, 0);
  }
  std::vector<int64_t> BytesReceivedPerPeer() const override {
    NcclTransport* t = bootstrap_->nccl();
    return t ? t->bytes_received_per_peer() : std::vector<int64_t>(size_, 0);
  }

 private:
  std::unique_ptr<NcclBootstrap> bootstrap_;
  int size_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SessionTransport>> CreateNcclSessionTransport(
    const v1::OpenSessionRequest& request, int cuda_device) {
  const int size = request.plan().workers_size();
  ASSIGN_OR_RETURN(auto b, NcclBootstrap::Start(cuda_device, request.rank(), size,
                                                request.nccl_unique_id(), kInitTimeout));
  return std::unique_ptr<SessionTransport>(new NcclSessionTransport(std::move(b), size));
}

}  // namespace dfa
