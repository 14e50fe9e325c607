#include "worker/stream_limits.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dfa {

struct StreamLimits::Entry {
  std::mutex mu;
  grpc::CallbackServerContext* ctx = nullptr;  // null once the stream's ticket is gone
  bool cancelled = false;
  std::string client;  // set by SetClient; guarded by StreamLimits::mu_
  bool counted = false;
  const char* method = "";
  std::atomic<int64_t> last_active_ns{0};
};

namespace {

int64_t NowNs() { return absl::ToUnixNanos(absl::Now()); }

}  // namespace

StreamLimits::StreamLimits(StreamLimitOptions options) : options_(options) {
  if (options_.idle_timeout > absl::ZeroDuration()) {
    sweeper_ = std::thread([this] { Sweep(); });
  }
}

StreamLimits::~StreamLimits() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (sweeper_.joinable()) sweeper_.join();
}

absl::StatusOr<std::unique_ptr<StreamLimits::Ticket>> StreamLimits::Open(
    grpc::CallbackServerContext* ctx, const char* method) {
  auto e = std::make_shared<Entry>();
  e->ctx = ctx;
  e->method = method;
  e->last_active_ns = NowNs();
  std::lock_guard<std::mutex> l(mu_);
  if (static_cast<int>(open_.size()) >= options_.max_streams) {
    return absl::ResourceExhaustedError(
        absl::StrCat(method, ": ", open_.size(), " data streams are open on this worker, its ",
                     "limit (--max_data_streams = ", options_.max_streams, "); retry later"));
  }
  open_.insert(e);
  return std::unique_ptr<Ticket>(new Ticket(this, std::move(e)));
}

void StreamLimits::Release(const std::shared_ptr<Entry>& e) {
  {
    // Waits for a cancel in progress: the call stays valid until then.
    std::lock_guard<std::mutex> l(e->mu);
    e->ctx = nullptr;
  }
  std::lock_guard<std::mutex> l(mu_);
  open_.erase(e);
  if (e->counted) {
    auto it = per_client_.find(e->client);
    if (it != per_client_.end() && --it->second <= 0) per_client_.erase(it);
  }
}

StreamLimits::Ticket::~Ticket() { limits_->Release(entry_); }

void StreamLimits::Ticket::Touch() { entry_->last_active_ns = NowNs(); }

absl::Status StreamLimits::Ticket::SetClient(const std::string& client_id) {
  std::lock_guard<std::mutex> l(limits_->mu_);
  if (entry_->counted) return absl::OkStatus();
  int& n = limits_->per_client_[client_id];
  if (n >= limits_->options_.max_streams_per_client) {
    if (n == 0) limits_->per_client_.erase(client_id);
    return absl::ResourceExhaustedError(absl::StrCat(
        entry_->method, ": client_id = '", client_id.substr(0, 64), "' has ", n,
        " data streams open on this worker, the limit per client (--max_data_streams_per_client"
        " = ", limits_->options_.max_streams_per_client, ")"));
  }
  ++n;
  entry_->client = client_id;
  entry_->counted = true;
  return absl::OkStatus();
}

void StreamLimits::Sweep() {
  const absl::Duration period =
      std::min(absl::Seconds(1), std::max(absl::Milliseconds(10), options_.idle_timeout / 4));
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    cv_.wait_for(l, absl::ToChronoNanoseconds(period), [this] { return stop_; });
    if (stop_) return;
    const int64_t cutoff = NowNs() - absl::ToInt64Nanoseconds(options_.idle_timeout);
    std::vector<std::shared_ptr<Entry>> idle;
    for (const auto& e : open_) {
      if (e->last_active_ns.load() < cutoff) idle.push_back(e);
    }
    l.unlock();
    for (const auto& e : idle) {
      // TryCancel schedules the reactions (never runs OnDone here), so holding e->mu keeps the
      // call alive without deadlocking with the ticket's release.
      std::lock_guard<std::mutex> el(e->mu);
      if (e->ctx == nullptr || e->cancelled) continue;
      e->cancelled = true;
      e->ctx->TryCancel();
      ++idle_cancels_;
    }
    l.lock();
  }
}

int StreamLimits::open() const {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<int>(open_.size());
}

int64_t StreamLimits::idle_cancels() const { return idle_cancels_.load(); }

}  // namespace dfa
