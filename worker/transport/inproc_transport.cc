#include "worker/transport/inproc_transport.h"

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dfa {
namespace {

struct GroupState {
  int remaining = 0;
  absl::Status status;
};

struct Msg {
  void* data = nullptr;
  size_t bytes = 0;
  GroupState* group = nullptr;
};

}  // namespace

class InprocHub {
 public:
  explicit InprocHub(int size)
      : size_(size), sends_(size * size), recvs_(size * size) {}

  int size() const { return size_; }
  std::mutex& mu() { return mu_; }
  std::condition_variable& cv() { return cv_; }
  bool aborted() const { return aborted_; }

  void Abort() {
    std::lock_guard<std::mutex> l(mu_);
    aborted_ = true;
    cv_.notify_all();
  }

  // Queues or matches one message; mu_ held.
  void PostSend(int src, int dst, Msg m) { Match(sends_[src * size_ + dst], recvs_[src * size_ + dst], m, true); }
  void PostRecv(int src, int dst, Msg m) { Match(recvs_[src * size_ + dst], sends_[src * size_ + dst], m, false); }

  // Drops every queued message of `g` (its buffers are going away); mu_ held.
  void Forget(GroupState* g) {
    for (auto* qs : {&sends_, &recvs_}) {
      for (auto& q : *qs) {
        for (auto it = q.begin(); it != q.end();) it = it->group == g ? q.erase(it) : it + 1;
      }
    }
  }

 private:
  void Match(std::deque<Msg>& mine, std::deque<Msg>& theirs, Msg m, bool is_send) {
    if (theirs.empty()) {
      mine.push_back(m);
      return;
    }
    Msg other = theirs.front();
    theirs.pop_front();
    const Msg& s = is_send ? m : other;
    const Msg& r = is_send ? other : m;
    if (s.bytes != r.bytes) {
      absl::Status err = absl::InternalError(absl::StrCat(
          "inproc transport: send of ", s.bytes, " bytes matched a receive of ", r.bytes, " bytes"));
      s.group->status.Update(err);
      r.group->status.Update(err);
    } else if (s.bytes > 0) {
      std::memcpy(r.data, s.data, s.bytes);
    }
    --s.group->remaining;
    --r.group->remaining;
    cv_.notify_all();
  }

  const int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool aborted_ = false;
  std::vector<std::deque<Msg>> sends_;  // [src * size + dst], waiting for a receive
  std::vector<std::deque<Msg>> recvs_;  // [src * size + dst], waiting for a send
};

namespace {

class InprocGroup : public PendingGroup {
 public:
  explicit InprocGroup(std::shared_ptr<InprocHub> hub) : hub_(std::move(hub)) {}
  ~InprocGroup() override {
    std::lock_guard<std::mutex> l(hub_->mu());
    hub_->Forget(&state_);
  }
  GroupState* state() { return &state_; }

  absl::Status Wait(void*, absl::Duration timeout) override {
    std::unique_lock<std::mutex> l(hub_->mu());
    const bool done = hub_->cv().wait_for(l, absl::ToChronoNanoseconds(timeout), [&] {
      return state_.remaining == 0 || !state_.status.ok() || hub_->aborted();
    });
    if (!state_.status.ok()) return state_.status;
    if (state_.remaining == 0) return absl::OkStatus();
    if (hub_->aborted()) return absl::CancelledError("inproc transport: aborted");
    if (!done) {
      return absl::DeadlineExceededError(absl::StrCat(
          "inproc transport: ", state_.remaining, " message(s) not matched within ",
          absl::FormatDuration(timeout)));
    }
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<InprocHub> hub_;
  GroupState state_;
};

class InprocTransport : public Transport {
 public:
  InprocTransport(std::shared_ptr<InprocHub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}
  std::string_view Name() const override { return "inproc"; }
  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }

  absl::StatusOr<std::unique_ptr<PendingGroup>> Post(std::span<const TransportMessage> sends,
                                                     std::span<const TransportMessage> recvs,
                                                     void*) override {
    for (const auto* list : {&sends, &recvs}) {
      for (const TransportMessage& m : *list) {
        if (m.peer < 0 || m.peer >= hub_->size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("inproc transport: peer ", m.peer, " out of range [0, ", hub_->size(), ")"));
        }
        if (m.bytes > 0 && m.data == nullptr) {
          return absl::InvalidArgumentError("inproc transport: null buffer");
        }
      }
    }
    auto group = std::make_unique<InprocGroup>(hub_);
    std::lock_guard<std::mutex> l(hub_->mu());
    if (hub_->aborted()) return absl::CancelledError("inproc transport: aborted");
    group->state()->remaining = static_cast<int>(sends.size() + recvs.size());
    int64_t out = 0, in = 0;
    for (const TransportMessage& m : sends) {
      hub_->PostSend(rank_, m.peer, Msg{m.data, m.bytes, group->state()});
      out += static_cast<int64_t>(m.bytes);
    }
    for (const TransportMessage& m : recvs) {
      hub_->PostRecv(m.peer, rank_, Msg{m.data, m.bytes, group->state()});
      in += static_cast<int64_t>(m.bytes);
    }
    sent_ += out;
    received_ += in;
    return std::unique_ptr<PendingGroup>(std::move(group));
  }

  void Abort() override { hub_->Abort(); }
  int64_t bytes_sent() const override { return sent_.load(); }
  int64_t bytes_received() const override { return received_.load(); }

 private:
  std::shared_ptr<InprocHub> hub_;
  const int rank_;
  std::atomic<int64_t> sent_{0};
  std::atomic<int64_t> received_{0};
};

}  // namespace

absl::StatusOr<std::shared_ptr<InprocHub>> CreateInprocHub(int size) {
  if (size < 1) return absl::InvalidArgumentError(absl::StrCat("inproc hub: size must be >= 1, got ", size));
  return std::make_shared<InprocHub>(size);
}

absl::StatusOr<std::unique_ptr<Transport>> CreateInprocTransport(std::shared_ptr<InprocHub> hub,
                                                                 int rank) {
  if (hub == nullptr) return absl::InvalidArgumentError("inproc transport: null hub");
  if (rank < 0 || rank >= hub->size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("inproc transport: rank ", rank, " out of range [0, ", hub->size(), ")"));
  }
  return std::unique_ptr<Transport>(new InprocTransport(std::move(hub), rank));
}

void AbortInprocHub(InprocHub& hub) { hub.Abort(); }

}  // namespace dfa
