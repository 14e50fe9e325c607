#include "client/lease_holder.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "client/grpc_util.h"

namespace dfa::client {
namespace {

constexpr absl::Duration kFirstBackoff = absl::Milliseconds(100);
constexpr absl::Duration kMaxBackoff = absl::Seconds(2);

std::chrono::nanoseconds Chrono(absl::Duration d) {
  return std::chrono::nanoseconds(absl::ToInt64Nanoseconds(d));
}

}  // namespace

LeaseHolder::LeaseHolder(v1::Coordinator::Stub* stub, std::string client_id)
    : stub_(stub), client_id_(std::move(client_id)), creator_pid_(getpid()) {}

bool LeaseHolder::Forked() const { return getpid() != creator_pid_; }

LeaseHolder::~LeaseHolder() {
  // In a fork()ed child nothing here may take mu_ (the parent's thread may have held it at the
  // fork, and holds it forever in this copy).
  if (Forked()) {
    // The thread and the lease are the parent's: neither closed nor beaten from here. The
    // thread's handle is left behind (joining or detaching it here would act on a thread this
    // process does not have).
    if (thread_.joinable()) new std::thread(std::move(thread_));
    return;
  }
  std::unique_lock<std::mutex> l(mu_);
  if (!started_) return;
  stop_ = true;
  cv_.notify_all();
  // The close beat goes out at once; a coordinator that does not finish the stream in time
  // (hung, unreachable) is cut off.
  if (!cv_.wait_for(l, Chrono(kCloseTimeout), [this] { return done_; })) {
    if (stream_ctx_ != nullptr) stream_ctx_->TryCancel();
  }
  l.unlock();
  thread_.join();
}

absl::StatusOr<LeaseCredentials> LeaseHolder::Get(absl::Duration timeout) {
  if (Forked()) {
    // No rpc at all: the channel's connections are the parent's (shared sockets), and gRPC
    // does not run in a fork()ed child (its threads are not there). A call hangs here and
    // breaks the parent's streams, its lease with them.
    return absl::FailedPreconditionError(absl::StrCat(
        "client lease: this Client was created in process ", creator_pid_,
        " and is used in its fork()ed child ", getpid(),
        "; gRPC connections do not survive fork() (using them here would break the parent's "
        "lease and sessions): create the Client in a process that is started, not forked "
        "(Python multiprocessing: the 'spawn' or 'forkserver' start method)"));
  }
  std::unique_lock<std::mutex> l(mu_);
  if (!started_) {
    started_ = true;
    thread_ = std::thread([this] { Loop(); });
  }
  const int failures = failures_;
  if (!attached_) {
    retry_now_ = true;  // a caller waits: no backoff before the next attempt
    cv_.notify_all();
  }
  cv_.wait_for(l, Chrono(timeout),
               [&] { return attached_ || unsupported_ || stop_ || failures_ != failures; });
  if (attached_) return lease_;
  if (unsupported_) return LeaseCredentials{};
  if (!last_error_.ok()) return last_error_;
  return absl::UnavailableError(absl::StrCat("HoldLease: no answer from the coordinator within ",
                                             absl::FormatDuration(timeout)));
}

void LeaseHolder::Forget(const std::string& lease_id) {
  if (Forked()) return;  // the parent's lease: not this process's to cut
  std::lock_guard<std::mutex> l(mu_);
  if (lease_.lease_id != lease_id) return;  // renewed already
  lease_ = LeaseCredentials{};
  attached_ = false;
  retry_now_ = true;
  if (stream_ctx_ != nullptr) {
    forgot_ = true;
    stream_ctx_->TryCancel();
  }
  cv_.notify_all();
}

std::string LeaseHolder::lease_id() {
  if (Forked()) return "";  // the parent's lease, not this process's
  std::lock_guard<std::mutex> l(mu_);
  return lease_.lease_id;
}

bool LeaseHolder::WaitBackoff(absl::Duration d) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait_for(l, Chrono(d), [this] { return stop_ || retry_now_; });
  retry_now_ = false;
  return stop_;
}

grpc::Status LeaseHolder::RunStream() {
  grpc::ClientContext ctx;
  LeaseCredentials lease;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_) return grpc::Status::CANCELLED;
    stream_ctx_ = &ctx;
    lease = lease_;
  }
  struct Forget {  // stream_ctx_ never outlives ctx
    LeaseHolder* h;
    ~Forget() {
      std::lock_guard<std::mutex> l(h->mu_);
      h->stream_ctx_ = nullptr;
    }
  } forget{this};
  std::unique_ptr<grpc::ClientReaderWriter<v1::LeaseBeat, v1::LeaseState>> stream =
      stub_->HoldLease(&ctx);
  v1::LeaseBeat beat;
  beat.set_lease_id(lease.lease_id);
  beat.set_lease_secret(lease.secret);
  beat.set_client_id(client_id_);
  v1::LeaseState state;
  if (!stream->Write(beat) || !stream->Read(&state)) return stream->Finish();
  {
    std::unique_lock<std::mutex> l(mu_);
    if (lease_.lease_id != lease.lease_id) {  // Forget ran while this attached: start over
      l.unlock();
      ctx.TryCancel();
      return stream->Finish();
    }
    if (lease_.lease_id.empty()) {
      lease_.lease_id = state.lease_id();
      lease_.secret = state.lease_secret();
    }
    attached_ = true;
    last_error_ = absl::OkStatus();
    cv_.notify_all();
  }
  while (true) {
    const absl::Duration interval = absl::Milliseconds(std::max(state.beat_interval_ms(), 10));
    bool stop = false;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait_for(l, Chrono(interval), [this] { return stop_ || !attached_; });
      if (!stop_ && !attached_) break;  // Forget cut this stream
      stop = stop_;
    }
    if (stop) {
      v1::LeaseBeat close;
      close.set_close(true);
      if (stream->Write(close)) stream->WritesDone();
      return stream->Finish();
    }
    v1::LeaseBeat renew;
    if (!stream->Write(renew) || !stream->Read(&state)) break;
  }
  return stream->Finish();
}

void LeaseHolder::Loop() {
  absl::Duration backoff = kFirstBackoff;
  while (true) {
    const grpc::Status s = RunStream();
    bool was_attached = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      was_attached = attached_;
      attached_ = false;
      if (stop_) break;
      if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
        unsupported_ = true;  // an older coordinator: sessions without a lease
        cv_.notify_all();
        break;
      }
      bool renew = false;
      if ((s.error_code() == grpc::StatusCode::NOT_FOUND ||
           s.error_code() == grpc::StatusCode::PERMISSION_DENIED) &&
          !lease_.lease_id.empty()) {
        lease_ = LeaseCredentials{};  // expired (or the coordinator restarted): a new lease, now
        renew = true;
        retry_now_ = true;
      }
      if (forgot_) {
        forgot_ = false;  // cut by Forget: attach again at once, no failure to report
      } else if (!was_attached && !renew) {
        last_error_ = FromGrpc(s, "HoldLease");
        ++failures_;
      }
      cv_.notify_all();
    }
    if (was_attached) backoff = kFirstBackoff;
    if (WaitBackoff(backoff)) break;
    backoff = std::min(2 * backoff, kMaxBackoff);
  }
  std::lock_guard<std::mutex> l(mu_);
  done_ = true;
  cv_.notify_all();
}

}  // namespace dfa::client
