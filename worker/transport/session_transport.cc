#include "worker/transport/session_transport.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/transport/ucx_transport.h"

namespace dfa {

#ifdef DFA_HAVE_NCCL
// nccl_session_transport.cc (built with NCCL)
absl::StatusOr<std::unique_ptr<SessionTransport>> CreateNcclSessionTransport(
    const v1::OpenSessionRequest& request, int cuda_device);
#endif

namespace {

class UcxSessionTransport : public SessionTransport {
 public:
  explicit UcxSessionTransport(std::unique_ptr<UcxTransport> t) : t_(std::move(t)) {}
  std::string_view Name() const override { return "ucx"; }
  const std::string& address() const override { return t_->address(); }
  absl::StatusOr<Transport*> ForJob(const std::string& job_id,
                                    const std::vector<std::string>& peer_addresses,
                                    absl::Duration) override {
    RETURN_IF_ERROR(t_->BeginJob(job_id, peer_addresses));
    return t_.get();
  }
  void Abort() override { t_->Abort(); }
  std::vector<int64_t> BytesSentPerPeer() const override { return t_->bytes_sent_per_peer(); }
  std::vector<int64_t> BytesReceivedPerPeer() const override {
    return t_->bytes_received_per_peer();
  }

 private:
  std::unique_ptr<UcxTransport> t_;
};

}  // namespace

std::vector<std::string> PeerNames(const v1::OpenSessionRequest& request) {
  std::vector<std::string> names(static_cast<size_t>(request.plan().workers_size()));
  for (const v1::PeerInfo& p : request.peers()) {
    if (p.rank() < 0 || p.rank() >= static_cast<int>(names.size())) continue;
    // Names come from the network: bounded, so an error message stays readable.
    names[static_cast<size_t>(p.rank())] =
        absl::StrCat(p.worker_id().substr(0, 128), " at ", p.address().substr(0, 128));
  }
  return names;
}

std::vector<std::string> SupportedTransports(std::string_view backend) {
  if (backend == "cpu") return {"ucx"};
#ifdef DFA_HAVE_NCCL
  // Both GPU kernel backends (our kernels, cuDNN) keep tensors in device memory.
  if (backend == "cuda" || backend == "cudnn") return {"nccl"};
#endif
  return {};
}

absl::StatusOr<std::unique_ptr<SessionTransport>> CreateSessionTransport(
    std::string_view backend, const v1::OpenSessionRequest& request, int cuda_device) {
  const std::vector<std::string> supported = SupportedTransports(backend);
  std::string name = request.transport();
  if (name.empty() && !supported.empty()) name = supported.front();
  if (std::find(supported.begin(), supported.end(), name) == supported.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transport = '", name, "' is not available on this worker (backend ",
        std::string(backend), " supports: ",
        supported.empty() ? std::string("none") : absl::StrJoin(supported, ", "), ")"));
  }
  const int size = request.plan().workers_size();
  if (name == "ucx") {
    ASSIGN_OR_RETURN(std::unique_ptr<UcxTransport> t,
                     UcxTransport::Create(request.rank(), size, PeerNames(request)));
    return std::unique_ptr<SessionTransport>(new UcxSessionTransport(std::move(t)));
  }
#ifdef DFA_HAVE_NCCL
  if (name == "nccl") return CreateNcclSessionTransport(request, cuda_device);
#endif
  return absl::InternalError(absl::StrCat("transport ", name, " has no implementation"));
}

}  // namespace dfa
