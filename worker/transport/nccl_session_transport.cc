// The worker daemon's "nccl" SessionTransport (session_transport.h): the session's
// NcclTransport, brought up by NcclBootstrap from OpenSession (see nccl_bootstrap.h for the
// sequence with the coordinator). Declared in session_transport.cc under DFA_HAVE_NCCL.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dfa/v1/worker.pb.h"
#include "worker/transport/nccl_bootstrap.h"
#include "core/gpu/nccl_transport.h"
#include "worker/transport/peer_address.h"
#include "worker/transport/session_transport.h"

namespace dfa {
namespace {

// How long the group may take to form (all ranks' OpenSession + ncclCommInitRank).
constexpr absl::Duration kInitTimeout = absl::Seconds(120);

class NcclSessionTransport : public SessionTransport {
 public:
  NcclSessionTransport(std::unique_ptr<NcclBootstrap> b, int size)
      : bootstrap_(std::move(b)),
        size_(size),
        address_(SealPeerAddress(PeerAddressKind::kNccl, bootstrap_->unique_id())) {}

  std::string_view Name() const override { return "nccl"; }
  // The group's NCCL unique id, sealed (peer_address.h): the coordinator hands rank 0's to the
  // other ranks as OpenSessionRequest.nccl_unique_id.
  const std::string& address() const override { return address_; }

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
  std::string address_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SessionTransport>> CreateNcclSessionTransport(
    const v1::OpenSessionRequest& request, int cuda_device) {
  const int size = request.plan().workers_size();
  std::string unique_id;
  if (!request.nccl_unique_id().empty()) {
    // Rank 0's sealed id: checked before NCCL sees it (ncclCommInitRank connects to whatever
    // address the id's bytes hold).
    const std::vector<std::string> names = PeerNames(request);
    const std::string root = names.empty() || names[0].empty()
                                 ? std::string("rank 0")
                                 : absl::StrCat("rank 0 (", names[0], ")");
    absl::StatusOr<std::string> id =
        OpenPeerAddress(PeerAddressKind::kNccl, request.nccl_unique_id());
    if (id.ok() && id->size() != kNcclUniqueIdBytes) {
      id = absl::InvalidArgumentError(absl::StrCat("holds ", id->size(), " bytes, not an NCCL ",
                                                   "unique id (", kNcclUniqueIdBytes, ")"));
    }
    if (!id.ok()) {
      return absl::UnavailableError(absl::StrCat("nccl_unique_id from ", root, " ",
                                                 id.status().message()));
    }
    unique_id = *std::move(id);
  }
  ASSIGN_OR_RETURN(auto b, NcclBootstrap::Start(cuda_device, request.rank(), size,
                                                std::move(unique_id), kInitTimeout));
  return std::unique_ptr<SessionTransport>(new NcclSessionTransport(std::move(b), size));
}

}  // namespace dfa
