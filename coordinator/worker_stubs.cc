#include "coordinator/worker_stubs.h"


namespace dfa {

std::shared_ptr<grpc::Channel> WorkerStubs::NewChannel(const std::string& address) const {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Fail fast when a worker restarts: do not back off for long before reconnecting.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return security_->CreateChannel(address, args);
}

std::shared_ptr<v1::Worker::Stub> WorkerStubs::Get(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& stub = stubs_[address];
  if (!stub) stub = v1::Worker::NewStub(NewChannel(address));
  return stub;
}

void WorkerStubs::Install(const std::string& address, std::shared_ptr<grpc::Channel> channel) {
  std::shared_ptr<v1::Worker::Stub> stub = v1::Worker::NewStub(std::move(channel));
  absl::MutexLock lock(&mu_);
  stubs_[address] = std::move(stub);
}

std::unique_ptr<grpc::ClientContext> ContextWithTimeout(absl::Duration timeout) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return ctx;
}

}  // namespace dfa
