#include "coordinator/lease_stream.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace dfa {
namespace {

using LeaseReactor = grpc::ServerBidiReactor<v1::LeaseBeat, v1::LeaseState>;

// A HoldLease refused before it starts (authorization, limits, shutdown).
class RefusedLease final : public LeaseReactor {
 public:
  explicit RefusedLease(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

int Ms(absl::Duration d) { return static_cast<int>(absl::ToInt64Milliseconds(d)); }

}  // namespace

class LeaseStreamHub::Stream final : public LeaseReactor {
 public:
  explicit Stream(LeaseStreamHub* hub) : hub_(hub) {}

  // After registration: waits for the first beat.
  void Begin() { StartRead(&in_); }

  void Stop(absl::Status why) {
    std::unique_lock<std::mutex> l(mu_);
    stopping_ = true;  // the coordinator goes away: leave the lease as it is
    End(l, std::move(why));
  }

  void OnReadDone(bool ok) override {
    std::unique_lock<std::mutex> l(mu_);
    if (finished_) return;
    if (!ok) {
      Lost(l, absl::CancelledError("HoldLease: the client ended the stream without a close"));
      return;
    }
    const absl::Time now = absl::Now();
    ClientLeases* leases = hub_->leases_;
    if (lease_id_.empty()) {
      absl::StatusOr<ClientLeases::Attachment> a =
          leases->Attach(in_.lease_id(), in_.lease_secret(), in_.client_id(), now);
      if (!a.ok()) {
        End(l, a.status());
        return;
      }
      lease_id_ = a->lease_id;
      stream_ = a->stream;
      out_.Clear();
      out_.set_lease_id(a->lease_id);
      out_.set_lease_secret(a->secret);
      out_.set_sessions(a->sessions);
    } else {
      out_.clear_lease_secret();
      absl::StatusOr<int> sessions = leases->Beat(lease_id_, stream_, now);
      if (!sessions.ok()) {
        End(l, sessions.status());
        return;
      }
      out_.set_sessions(*sessions);
    }
    if (in_.close()) {
      leases->Detach(lease_id_, stream_, /*clean=*/true, now);
      closed_ = true;
      End(l, absl::OkStatus());
      return;
    }
    const ClientLeaseOptions& o = leases->options();
    out_.set_beat_interval_ms(Ms(o.beat_interval));
    out_.set_timeout_ms(Ms(o.timeout));
    out_.set_grace_ms(Ms(o.grace));
    l.unlock();
    StartWrite(&out_);
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> l(mu_);
    if (finished_) return;
    if (!ok) {
      Lost(l, absl::CancelledError("HoldLease: the client went away"));
      return;
    }
    l.unlock();
    StartRead(&in_);
  }

  void OnCancel() override {
    std::unique_lock<std::mutex> l(mu_);
    Lost(l, absl::CancelledError("HoldLease: cancelled (the client went away)"));
  }

  void OnDone() override {
    {
      // A stream that ended for any reason but a clean close leaves its lease lost.
      std::unique_lock<std::mutex> l(mu_);
      if (!closed_ && !stopping_ && !lease_id_.empty()) {
        hub_->leases_->Detach(lease_id_, stream_, /*clean=*/false, absl::Now());
      }
    }
    hub_->Remove(this);
    delete this;
  }

 private:
  // With mu_ held: the lease is lost (unless the coordinator is stopping) and the stream ends.
  void Lost(std::unique_lock<std::mutex>& l, absl::Status why) {
    if (!closed_ && !stopping_ && !lease_id_.empty()) {
      hub_->leases_->Detach(lease_id_, stream_, /*clean=*/false, absl::Now());
    }
    End(l, std::move(why));
  }
  // With mu_ held: finishes once; unlocks before calling into gRPC.
  void End(std::unique_lock<std::mutex>& l, absl::Status why) {
    if (finished_) return;
    finished_ = true;
    const grpc::Status status = hub_->reply_(why);
    l.unlock();
    Finish(status);
  }

  LeaseStreamHub* const hub_;
  std::mutex mu_;
  v1::LeaseBeat in_;
  v1::LeaseState out_;
  std::string lease_id_;  // set by the first beat
  uint64_t stream_ = 0;
  bool finished_ = false;
  bool closed_ = false;    // a clean close
  bool stopping_ = false;  // Shutdown
};

LeaseStreamHub::LeaseStreamHub(ClientLeases* leases, int max_streams,
                               std::function<grpc::Status(const absl::Status&)> reply)
    : leases_(leases), max_streams_(max_streams), reply_(std::move(reply)) {}

LeaseStreamHub::~LeaseStreamHub() { Shutdown(); }

grpc::ServerBidiReactor<v1::LeaseBeat, v1::LeaseState>* LeaseStreamHub::Start(
    const absl::Status& admitted) {
  if (!admitted.ok()) return new RefusedLease(reply_(admitted));
  Stream* s = nullptr;
  {
    std::lock_guard<std::mutex> l(mu_);
    absl::Status refused;
    if (shut_down_) {
      refused = absl::UnavailableError("the coordinator is shutting down");
    } else if (static_cast<int>(streams_.size()) >= max_streams_) {
      refused = absl::ResourceExhaustedError(
          absl::StrCat("HoldLease: ", streams_.size(),
                       " lease streams are open, the coordinator's limit "
                       "(twice --max_client_leases); retry later"));
    }
    if (!refused.ok()) return new RefusedLease(reply_(refused));
    s = new Stream(this);
    streams_.insert(s);
  }
  s->Begin();
  return s;
}

void LeaseStreamHub::Remove(Stream* s) {
  std::lock_guard<std::mutex> l(mu_);
  streams_.erase(s);
}

void LeaseStreamHub::Shutdown() {
  std::lock_guard<std::mutex> l(mu_);
  if (shut_down_) return;
  shut_down_ = true;
  for (Stream* s : streams_) s->Stop(absl::UnavailableError("the coordinator is shutting down"));
}

int LeaseStreamHub::streams() const {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<int>(streams_.size());
}

}  // namespace dfa
