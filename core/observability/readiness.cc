#include "core/observability/readiness.h"

namespace dfa {

GrpcHealthMirror::GrpcHealthMirror(grpc::HealthCheckServiceInterface* health,
                                   std::vector<std::string> services, ReadinessCheck ready,
                                   absl::Duration period)
    : health_(health), services_(std::move(services)), ready_(std::move(ready)), period_(period) {
  Set(ready_().empty());
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> l(mu_);
    while (!cv_.wait_for(l, absl::ToChronoMilliseconds(period_), [this] { return stop_; })) {
      l.unlock();
      Set(ready_().empty());
      l.lock();
    }
  });
}

GrpcHealthMirror::~GrpcHealthMirror() { Stop(); }

void GrpcHealthMirror::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  Set(false);
}

void GrpcHealthMirror::Set(bool serving) {
  if (health_ == nullptr || serving_ == static_cast<int>(serving)) return;
  serving_ = serving;
  for (const std::string& service : services_) health_->SetServingStatus(service, serving);
}

}  // namespace dfa
