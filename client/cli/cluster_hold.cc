#include "client/cli/cluster_hold.h"

#include <cstdio>

#include "client/cli/interrupt.h"
#include "client/grpc_util.h"
#include "core/grpc_status.h"
#include "core/session_capability.h"

namespace dfa::cli {

ClusterHold::ClusterHold(client::Client* client) : client_(client) {
  handle_ = Interrupts::AddCleanup("cancelling the job and releasing the session",
                                   [this] { GiveBack(); });
}

ClusterHold::~ClusterHold() { Interrupts::RemoveCleanup(handle_); }

void ClusterHold::SetSession(const client::Session* session) {
  std::lock_guard<std::mutex> lock(mu_);
  session_id_ = session != nullptr ? session->id() : "";
  capability_ = session != nullptr ? session->capability() : "";
  job_id_.clear();
}

void ClusterHold::SetJob(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  job_id_ = job_id;
}

void ClusterHold::GiveBack() {
  std::string session_id, capability, job_id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    session_id = session_id_;
    capability = capability_;
    job_id = job_id_;
    session_id_.clear();
    job_id_.clear();
  }
  if (!job_id.empty()) {
    grpc::ClientContext ctx;
    client::SetDeadline(&ctx, kCallTimeout);
    AttachCapability(&ctx, capability);
    v1::GetJobRequest req;
    req.set_job_id(job_id);
    req.set_client_id(client_->client_id());
    v1::Job job;
    const absl::Status s =
        FromGrpcStatus(client_->coordinator()->CancelJob(&ctx, req, &job), "CancelJob");
    std::fprintf(stderr, "  job %s: %s\n", job_id.c_str(),
                 s.ok() ? "cancelled" : std::string(s.message()).c_str());
  }
  if (!session_id.empty()) {
    grpc::ClientContext ctx;
    client::SetDeadline(&ctx, kCallTimeout);
    AttachCapability(&ctx, capability);
    v1::ReleaseSessionRequest req;
    req.set_session_id(session_id);
    req.set_client_id(client_->client_id());
    v1::ReleaseSessionResponse resp;
    const absl::Status s =
        FromGrpcStatus(client_->coordinator()->ReleaseSession(&ctx, req, &resp), "ReleaseSession");
    std::fprintf(stderr, "  session %s: %s\n", session_id.c_str(),
                 s.ok() ? "released" : std::string(s.message()).c_str());
  }
}

}  // namespace dfa::cli
