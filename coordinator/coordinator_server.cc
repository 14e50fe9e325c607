#include "coordinator/coordinator_server.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
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
  if (o.limits.max_rpc_threads < 8) {
    return absl::InvalidArgumentError("max_rpc_threads: must be >= 8");
  }
  if (o.limits.max_watch_streams < 1 || o.limits.max_watch_streams_per_client < 1) {
    return absl::InvalidArgumentError(
        "max_watch_streams / max_watch_streams_per_client: must be >= 1");
  }
  RETURN_IF_ERROR(ValidateToken(o.auth_token, "--auth_token"));
  RETURN_IF_ERROR(ValidateToken(o.worker_token, "--worker_token"));
  if (!o.worker_token.empty() && o.worker_token == o.auth_token) {
    return absl::InvalidArgumentError(
        "--worker_token: must differ from --auth_token (a client must not be able to register "
        "as a worker)");
  }
  RETURN_IF_ERROR(ValidateClientLeaseOptions(o.client_lease));
  if (o.register_check_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("register_check_timeout_ms: must be positive");
  }
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
    ASSIGN_OR_RETURN(metrics_port_,
                     metrics_.Serve(options_.metrics_port, [this] { return NotReadyReason(); }));
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
  // Synchronous handlers take a thread each; beyond the cap gRPC answers RESOURCE_EXHAUSTED
  // instead of starting threads (WatchJob is a reactor and takes none).
  grpc::ResourceQuota quota("dfa-coordinator");
  quota.SetMaxThreads(options_.limits.max_rpc_threads);
  builder.SetResourceQuota(quota);
  server_ = builder.BuildAndStart();
  if (!server_ || port == 0) {
    service_.reset();
    return absl::UnavailableError(absl::StrCat("listen: cannot listen on ", options_.listen));
  }
  address_ = absl::StrCat(options_.listen.substr(0, options_.listen.rfind(':')), ":", port);
  serving_.store(service_.get(), std::memory_order_release);
  health_ = std::make_unique<GrpcHealthMirror>(
      server_->GetHealthCheckService(),
      std::vector<std::string>{v1::Coordinator::service_full_name(), ""},
      [this] { return NotReadyReason(); });
  started_ = true;
  ticker_ = std::thread([this] {
    const auto period = absl::ToChronoNanoseconds(options_.tick);
    std::unique_lock<std::mutex> lock(stop_mu_);
    while (!stop_cv_.wait_for(lock, period, [this] { return stop_; })) {
      lock.unlock();
      service_->Tick(absl::Now());
      lock.lock();
    }
  });
  return absl::OkStatus();
}

std::string CoordinatorServer::NotReadyReason() const {
  const CoordinatorService* service = serving_.load(std::memory_order_acquire);
  if (service == nullptr) return "not serving (starting or shutting down)";
  if (service->LiveWorkers() > 0) return "";
  return "no live worker (none registered with a valid lease)";
}

void CoordinatorServer::Shutdown() {
  if (!started_ || stopped_) return;
  stopped_ = true;
  serving_.store(nullptr, std::memory_order_release);
  health_->Stop();
  server_->GetHealthCheckService()->SetServingStatus(false);
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  ticker_.join();
  service_->Shutdown();  // cancels jobs, so that WatchJob streams end
  server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  server_->Wait();
  metrics_.StopServing();
}

}  // namespace dfa
