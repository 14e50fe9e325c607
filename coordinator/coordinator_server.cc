#include "coordinator/coordinator_server.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server_builder.h"

namespace dfa {
namespace {

absl::Status ValidateOptions(const CoordinatorOptions& o) {
  if (o.lease < absl::Milliseconds(10)) {
    return absl::InvalidArgumentError("lease_ms: must be at least 10");
  }
  if (o.session_ttl < absl::Seconds(1)) {
    return absl::InvalidArgumentError("session_ttl_s: must be at least 1");
  }
  if (o.rpc_timeout <= absl::ZeroDuration() || o.job_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("rpc_timeout_ms / job_timeout_s: must be positive");
  }
  if (o.limits.max_seq_len < 1) return absl::InvalidArgumentError("max_seq_len: must be >= 1");
  if (o.metrics_port < -1 || o.metrics_port > 65535) {
    return absl::InvalidArgumentError("metrics_port: must be -1 (off), 0 (any) or a port");
  }
  const size_t colon = o.listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(o.listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen: expected host:port, got \"", o.listen, "\""));
  }
  return absl::OkStatus();
}

}  // namespace

CoordinatorServer::CoordinatorServer(const CoordinatorOptions& options) : options_(options) {}

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

absl::Status CoordinatorServer::Start() {
  RETURN_IF_ERROR(ValidateOptions(options_));
  if (options_.metrics_port >= 0) {
    ASSIGN_OR_RETURN(metrics_port_, metrics_.Serve(options_.metrics_port));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const RpcSecurity> security,
                   RpcSecurity::Load(options_.security));
  service_ = std::make_unique<CoordinatorService>(options_, &metrics_, security);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options_.listen, security->ServerCredentials(), &port);
  builder.RegisterService(service_.get());
  // No SO_REUSEPORT: a second daemon on a port already in use fails to bind (and says so)
  // instead of sharing the port's connections with the first.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  server_ = builder.BuildAndStart();
  if (!server_ || port == 0) {
    service_.reset();
    return absl::UnavailableError(absl::StrCat("listen: cannot listen on ", options_.listen));
  }
  address_ = absl::StrCat(options_.listen.substr(0, options_.listen.rfind(':')), ":", port);
  server_->GetHealthCheckService()->SetServingStatus(true);
  started_ = true;
  ticker_ = std::thread([this] {
    while (!stop_.WaitForNotificationWithTimeout(options_.tick)) service_->Tick(absl::Now());
  });
  return absl::OkStatus();
}

void CoordinatorServer::Shutdown() {
  if (!started_ || stopped_) return;
  stopped_ = true;
  server_->GetHealthCheckService()->SetServingStatus(false);
  stop_.Notify();
  ticker_.join();
  service_->Shutdown();  // cancels jobs, so that WatchJob streams end
  server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  server_->Wait();
  metrics_.StopServing();
}

}  // namespace dfa
