#include "worker/registrar.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/log.h"
#include "grpcpp/client_context.h"

namespace dfa {
namespace {

// RegisterWorker: the coordinator checks our address (and a live holder of our id) first.
constexpr absl::Duration kRegisterTimeout = absl::Seconds(5);
constexpr absl::Duration kMaxHeartbeatTimeout = absl::Seconds(5);
// Until the first answer tells the lease: the coordinator's default lease (3 s) / 3.
constexpr absl::Duration kDefaultPeriod = absl::Seconds(1);
constexpr absl::Duration kMinPeriod = absl::Milliseconds(50);
// The first retry of a refused registration; doubles up to one heartbeat period.
constexpr absl::Duration kFirstRetry = absl::Milliseconds(50);

void SetDeadline(grpc::ClientContext* ctx, absl::Duration d) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + d));
  // Wait for the channel to (re)connect up to the deadline rather than failing at once: the
  // call then goes out the moment the coordinator is back.
  ctx->set_wait_for_ready(true);
}

}  // namespace

Registrar::Registrar(std::string coordinator_address, v1::RegisterWorkerRequest registration,
                     std::function<int64_t()> memory_used, std::function<void()> on_forgotten,
                     std::shared_ptr<const RpcSecurity> security)
    : coordinator_(std::move(coordinator_address)),
      registration_(std::move(registration)),
      memory_used_(std::move(memory_used)),
      on_forgotten_(std::move(on_forgotten)),
      security_(security ? std::move(security) : RpcSecurity::Insecure()) {
  Connect(kDefaultPeriod);
}

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

absl::Time Registrar::registered_until() const {
  std::lock_guard<std::mutex> l(mu_);
  return registered_until_;
}

void Registrar::Connect(absl::Duration period) {
  // gRPC backs off between connection attempts (by default 1 s growing to 120 s): after a long
  // outage a channel would find the coordinator back only minutes later. Capped at half a
  // heartbeat period (gRPC adds up to 20% jitter), so it retries within one period.
  const int cap_ms = static_cast<int>(std::max<int64_t>(absl::ToInt64Milliseconds(period / 2), 20));
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::min(100, cap_ms));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, cap_ms);
  // Also the time one connection attempt may take (gRPC's default is 20 s).
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, std::max(cap_ms, 100));
  stub_ = v1::Coordinator::NewStub(security_->CreateChannel(coordinator_, args));
  channel_period_ = period;
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

void Registrar::Warn(const std::string& what) {
  if (what == last_warning_) return;
  last_warning_ = what;
  DFA_LOG(WARNING) << "worker " << registration_.worker_id() << ": " << what;
}

bool Registrar::Register(absl::Duration* period) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, kRegisterTimeout);
  v1::RegisterWorkerResponse resp;
  const absl::Time sent = absl::Now();
  if (!BeginCall(&ctx)) return false;
  const grpc::Status st = stub_->RegisterWorker(&ctx, registration_, &resp);
  EndCall();
  if (!st.ok()) {
    Warn(absl::StrCat("RegisterWorker at ", coordinator_, " failed: ", st.error_message(),
                      " (retrying)"));
    return false;
  }
  last_warning_.clear();
  const absl::Duration lease =
      resp.lease_ms() > 0 ? absl::Milliseconds(resp.lease_ms()) : 3 * kDefaultPeriod;
  *period = std::max(lease / 3, kMinPeriod);
  {
    std::lock_guard<std::mutex> l(mu_);
    ++registrations_;
    registered_until_ = sent + lease;
  }
  DFA_LOG(INFO) << "worker " << registration_.worker_id() << " registered with " << coordinator_
                << " as " << registration_.address() << " (lease " << absl::FormatDuration(lease)
                << ")";
  return true;
}

void Registrar::Loop() {
  absl::Duration period = kDefaultPeriod;
  absl::Duration retry = kFirstRetry;
  bool registered = false;
  absl::Time next_heartbeat = absl::InfinitePast();
  while (true) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return;
    }
    if (!registered) {
      const absl::Time started = absl::Now();
      registered = Register(&period);
      if (registered) {
        retry = kFirstRetry;
        if (period != channel_period_) Connect(period);
        next_heartbeat = absl::Now() + period;
        continue;
      }
      // Refused (or no coordinator within the deadline, which took its own time): again
      // after a pause that doubles, capped at one heartbeat period.
      if (absl::Now() - started < retry && !Sleep(retry)) return;
      retry = std::min(retry * 2, period);
      continue;
    }
    if (!Sleep(next_heartbeat - absl::Now())) return;
    grpc::ClientContext ctx;
    SetDeadline(&ctx, std::min(kMaxHeartbeatTimeout, std::max(period, absl::Milliseconds(200))));
    v1::HeartbeatRequest req;
    req.set_worker_id(registration_.worker_id());
    req.set_boot_id(registration_.boot_id());
    req.set_memory_used_bytes(memory_used_ ? memory_used_() : 0);
    v1::HeartbeatResponse resp;
    const absl::Time started = absl::Now();
    if (!BeginCall(&ctx)) return;
    const grpc::Status st = stub_->Heartbeat(&ctx, req, &resp);
    EndCall();
    if (st.ok()) {
      if (!last_warning_.empty()) {
        DFA_LOG(INFO) << "worker " << registration_.worker_id() << ": heartbeats to "
                      << coordinator_ << " answered again";
      }
      last_warning_.clear();
      if (resp.lease_ms() > 0) {
        period = std::max(absl::Milliseconds(resp.lease_ms()) / 3, kMinPeriod);
      }
      {
        std::lock_guard<std::mutex> l(mu_);
        registered_until_ =
            started + (resp.lease_ms() > 0 ? absl::Milliseconds(resp.lease_ms()) : 3 * period);
      }
      next_heartbeat = started + period;
    } else if (st.error_code() == grpc::StatusCode::NOT_FOUND) {
      DFA_LOG(WARNING) << "worker " << registration_.worker_id() << ": coordinator "
                       << coordinator_ << " does not know us (" << st.error_message()
                       << "); dropping our sessions and registering again";
      {
        std::lock_guard<std::mutex> l(mu_);
        registered_until_ = absl::InfinitePast();
      }
      if (on_forgotten_) on_forgotten_();
      registered = false;
    } else {
      // No answer (coordinator down or stopped): the call waited for the channel up to its
      // deadline, so try again at once; a broken connection again shortly; a refusal (say,
      // a wrong worker token) at the next period.
      Warn(absl::StrCat("Heartbeat to ", coordinator_, " failed: ", st.error_message(),
                        " (retrying)"));
      switch (st.error_code()) {
        case grpc::StatusCode::DEADLINE_EXCEEDED:
          next_heartbeat = absl::Now();
          break;
        case grpc::StatusCode::UNAVAILABLE:
          next_heartbeat = started + std::min(period, absl::Milliseconds(100));
          break;
        default:
          next_heartbeat = started + period;
      }
    }
  }
}

}  // namespace dfa
