#include "worker/session_admission.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/transport/fd_usage.h"

namespace dfa {

SessionAdmission::SessionAdmission(SessionAdmissionOptions options)
    : options_(options), baseline_fds_(std::max(0, CountOpenFds())) {}

int SessionAdmission::FdsPerSession(int ranks) {
  // 12 for the UCX worker, ~3 per peer connection (4 counted), 4 shared-memory segments, and 4
  // to spare.
  return 20 + 4 * std::max(0, ranks - 1);
}

absl::StatusOr<std::unique_ptr<SessionAdmission::Ticket>> SessionAdmission::Admit(int ranks) {
  const int need = FdsPerSession(ranks);
  std::lock_guard<std::mutex> l(mu_);
  if (sessions_ >= options_.max_sessions) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the worker holds ", sessions_, " sessions, its limit (--max_sessions = ",
        options_.max_sessions, "); release a session or use another worker"));
  }
  const int limit = FdLimit();
  if (limit > 0) {
    const int reserve = options_.fd_reserve > 0 ? options_.fd_reserve : std::max(64, limit / 8);
    const int open = CountOpenFds();
    // What the open sessions may still take is at most their estimate; the two views bound it
    // from above (estimates) and from what is really open (connections and all).
    const int by_estimate = baseline_fds_ + committed_fds_ + need + reserve;
    const int by_now = (open < 0 ? 0 : open) + need + reserve / 2;
    if (by_estimate > limit || by_now > limit) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the worker is near its file descriptor limit (RLIMIT_NOFILE ", limit, ": ", open,
          " open, ", committed_fds_, " promised to its ", sessions_, " sessions; a session of ",
          ranks, " ranks needs about ", need, " and ", reserve,
          " stay free for connections); release a session or raise `ulimit -n`"));
    }
  }
  ++sessions_;
  committed_fds_ += need;
  return std::unique_ptr<Ticket>(new Ticket(this, need));
}

void SessionAdmission::Release(int fds) {
  std::lock_guard<std::mutex> l(mu_);
  --sessions_;
  committed_fds_ -= fds;
}

SessionAdmission::Ticket::~Ticket() { owner_->Release(fds_); }

int SessionAdmission::sessions() const {
  std::lock_guard<std::mutex> l(mu_);
  return sessions_;
}

}  // namespace dfa
