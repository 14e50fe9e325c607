#include "worker/registrar.h"

#include <algorithm>
#include <iostream>

#include "grpcpp/client_context.h"

namespace dfa {
namespace {

constexpr absl::Duration kRpcTimeout = absl::Seconds(5);
constexpr absl::Duration kDefaultLease = absl::Seconds(10);

void SetDeadline(grpc::ClientContext* ctx, absl::Duration d) {
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(d));
}

}  // namespace

Registrar::Registrar(std::string coordinator_address, v1::RegisterWorkerRequest registration,
                     std::function<int64_t()> memory_used,
                     std::function<void()> on_forgotten,
                     std::shared_ptr<const RpcSecurity> security)
    : coordinator_(std::move(coordinator_address)),
      registration_(std::move(registration)),
      memory_used_(std::move(memory_used)),
      on_forgotten_(std::move(on_forgotten)),
      stub_(v1::Coordinator::NewStub(
          (security ? security : RpcSecurity::Insecure())->CreateChannel(coordinator_))) {}

Registrar::~Registrar() { Stop(); }

void Registrar::Start() { thread_ = std::thread([this] { Loop(); }); }

void Registrar::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    // A call in flight to a slow or dead coordinator would hold shutdown for its deadline.
    if (in_flight_ != nullptr) in_flight_->TryCancel();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

int Registrar::registrations() const {
  std::lock_guard<std::mutex> l(mu_);
  return registrations_;
}

bool Registrar::Sleep(absl::Duration d) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait_for(l, absl::ToChronoMilliseconds(d), [this] { return stop_; });
  return !stop_;
}

bool Registrar::BeginCall(grpc::ClientContext* ctx) {
  std::lock_guard<std::mutex> l(mu_);
  if (stop_) return false;
  in_flight_ = ctx;
  return true;
}

void Registrar::EndCall() {
  std::lock_guard<std::mutex> l(mu_);
  in_flight_ = nullptr;
}

void Registrar::Loop() {
  absl::Duration backoff = absl::Milliseconds(100);
  absl::Duration lease = kDefaultLease;
  bool registered = false;
  bool warned = false;
  while (true) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return;
    }
    if (!registered) {
      grpc::ClientContext ctx;
      SetDeadline(&ctx, kRpcTimeout);
      v1::RegisterWorkerResponse resp;
      v1::RegisterWorkerRequest req = registration_;
      if (!BeginCall(&ctx)) return;
      const grpc::Status st = stub_->RegisterWorker(&ctx, req, &resp);
      EndCall();
      if (st.ok()) {
        registered = true;
        warned = false;
        backoff = absl::Milliseconds(100);
        lease = resp.lease_ms() > 0 ? absl::Milliseconds(resp.lease_ms()) : kDefaultLease;
        {
          std::lock_guard<std::mutex> l(mu_);
          ++registrations_;
        }
        std::cerr << "dfa-worker " << registration_.worker_id() << " registered with "
                  << coordinator_ << " (lease " << absl::FormatDuration(lease) << ")"
                  << std::endl;
      } else {
        if (!warned) {
          std::cerr << "dfa-worker " << registration_.worker_id() << ": RegisterWorker at "
                    << coordinator_ << " failed: " << st.error_message() << " (retrying)"
                    << std::endl;
          warned = true;
        }
        if (!Sleep(backoff)) return;
        backoff = std::min(backoff * 2, absl::Seconds(2));
        continue;
      }
    }
    if (!Sleep(std::max(lease / 3, absl::Milliseconds(50)))) return;
    grpc::ClientContext ctx;
    SetDeadline(&ctx, std::min(kRpcTimeout, std::max(lease / 3, absl::Milliseconds(200))));
    v1::HeartbeatRequest req;
    req.set_worker_id(registration_.worker_id());
    req.set_memory_used_bytes(memory_used_ ? memory_used_() : 0);
    v1::HeartbeatResponse resp;
    if (!BeginCall(&ctx)) return;
    const grpc::Status st = stub_->Heartbeat(&ctx, req, &resp);
    EndCall();
    if (st.ok()) {
      if (resp.lease_ms() > 0) lease = absl::Milliseconds(resp.lease_ms());
    } else if (st.error_code() == grpc::StatusCode::NOT_FOUND) {
      std::cerr << "dfa-worker " << registration_.worker_id()
                << ": coordinator does not know us (restarted, or our lease ran out); dropping "
                   "our sessions and registering again"
                << std::endl;
      if (on_forgotten_) on_forgotten_();
      registered = false;
    }
    // Other errors (coordinator down): keep heartbeating; a restarted one answers NOT_FOUND.
  }
}

}  // namespace dfa
