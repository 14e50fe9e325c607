#include "worker/transport/ucx_transport.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "worker/transport/fd_usage.h"
#include "worker/transport/peer_address.h"

namespace dfa {
namespace {

constexpr int kMaxRanks = 1 << 12;  // 12 bits of the tag
// Descriptors a UCX worker opens (12 measured with UCX 1.13 on loopback) and a few to spare.
constexpr int kFdsPerTransport = 16;
constexpr uint64_t kSeqMask = (uint64_t{1} << 36) - 1;
constexpr uint64_t kFullMask = ~uint64_t{0};

uint64_t MakeTag(uint64_t job_tag, int sender, uint64_t seq) {
  return (job_tag << 48) | (static_cast<uint64_t>(sender) << 36) | (seq & kSeqMask);
}

// FNV-1a folded to 16 bits: only has to differ between consecutive jobs of one session.
uint64_t HashJob(const std::string& job_id) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : job_id) h = (h ^ c) * 1099511628211ull;
  return (h ^ (h >> 16) ^ (h >> 32) ^ (h >> 48)) & 0xffffu;
}

absl::Status UcxError(const char* call, ucs_status_t s) {
  return absl::InternalError(absl::StrCat("ucx: ", call, " failed: ", ucs_status_string(s)));
}

// Zeros after a peer's address handed to UCX: ucp_address_unpack takes no length, so a short
// address reads our zeros, not the heap.
constexpr size_t kAddressPadding = 256;

// The low 4 bits of a UCX worker address' first byte are its format version
// (UCP_ADDRESS_HEADER_VERSION_MASK); a peer built against the same UCX packs the same one.
constexpr uint8_t kUcxAddressVersionMask = 0x0f;

}  // namespace

// State of one posted group; lives until its PendingGroup is gone and every op completed.
struct UcxGroup {
  int remaining = 0;  // guarded by Impl::mu_
  absl::Status status;
};

struct UcxOp {
  UcxTransport::Impl* impl = nullptr;
  std::shared_ptr<UcxGroup> group;
  bool is_send = false;
  int peer = 0;
  void* data = nullptr;
  size_t bytes = 0;
  uint64_t tag = 0;
  void* request = nullptr;  // UCX request while in flight (progress thread only)
  // UCX may run the callback inside the posting call: it is then recorded and finished after.
  bool starting = false;
  bool early_done = false;
  ucs_status_t early_status = UCS_OK;
  size_t early_length = 0;
  absl::Status forced;      // error to report instead of UCX's (peer lost)
};

class UcxTransport::Impl {
 public:
  Impl(int rank, int size, std::vector<std::string> peer_names)
      : rank_(rank), size_(size), sent_(size), received_(size) {
    for (int p = 0; p < size; ++p) {
      const bool named = p < static_cast<int>(peer_names.size()) && !peer_names[p].empty();
      peer_names_.push_back(named ? absl::StrCat("rank ", p, " (", peer_names[p], ")")
                                  : absl::StrCat("rank ", p));
    }
  }
  ~Impl() { Shutdown(); }

  absl::Status Init();
  void Shutdown();

  // Runs `fn` on the progress thread (asynchronously).
  void Submit(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> l(mu_);
      commands_.push_back(std::move(fn));
    }
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(event_fd_, &one, sizeof(one));
  }
  // Runs `fn` on the progress thread and waits for it.
  void Run(std::function<void()> fn) {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    Submit([&] {
      fn();
      std::lock_guard<std::mutex> l(m);
      done = true;
      cv.notify_all();
    });
    std::unique_lock<std::mutex> l(m);
    cv.wait(l, [&] { return done; });
  }

  absl::Status BeginJob(const std::string& job_id, const std::vector<std::string>& addrs);
  absl::StatusOr<std::unique_ptr<PendingGroup>> Post(std::span<const TransportMessage> sends,
                                                    std::span<const TransportMessage> recvs);
  void Abort();
  absl::Status WaitGroup(const std::shared_ptr<UcxGroup>& g, absl::Duration timeout);

  int rank_, size_;
  std::string address_;      // sealed (peer_address.h): what peers are given
  std::string raw_address_;  // UCX's bytes
  std::vector<std::string> peer_names_;  // "rank 1 (worker-1 at host:port)", for errors
  std::vector<std::atomic<int64_t>> sent_, received_;

 private:
  void Loop();
  void StartOp(UcxOp* op);      // progress thread
  void Complete(UcxOp* op, ucs_status_t s, size_t length);  // progress thread
  void CloseEndpoint(int peer);  // progress thread
  void AbortOnThread();          // progress thread
  UcxOp* NewOp(const std::shared_ptr<UcxGroup>& g, bool is_send, const TransportMessage& m,
               uint64_t tag) {
    auto* op = new UcxOp;
    op->impl = this;
    op->group = g;
    op->is_send = is_send;
    op->peer = m.peer;
    op->data = m.data;
    op->bytes = m.bytes;
    op->tag = tag;
    return op;
  }
  static void SendCb(void* req, ucs_status_t s, void* user);
  static void RecvCb(void* req, ucs_status_t s, const ucp_tag_recv_info_t* info, void* user);
  static void ErrCb(void* arg, ucp_ep_h ep, ucs_status_t s);

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1, epoll_fd_ = -1;
  std::thread thread_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> commands_;
  bool aborted_ = false;
  bool stop_ = false;

  // Progress thread only.
  std::vector<ucp_ep_h> eps_;
  std::vector<std::string> ep_addrs_;
  std::vector<bool> peer_lost_;
  std::unordered_set<UcxOp*> inflight_;
  std::vector<void*> closing_;  // ep close requests still in progress

  // Caller's thread (Post and BeginJob are not concurrent).
  uint64_t job_tag_ = 0;
  std::vector<uint64_t> send_seq_, recv_seq_;
};

absl::Status UcxTransport::Impl::Init() {
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return UcxError("ucp_config_read", s);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  s = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (s != UCS_OK) return UcxError("ucp_init", s);

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the progress thread touches the worker
  s = ucp_worker_create(context_, &wp, &worker_);
  if (s != UCS_OK) return UcxError("ucp_worker_create", s);

  ucp_address_t* addr = nullptr;
  size_t len = 0;
  s = ucp_worker_get_address(worker_, &addr, &len);
  if (s != UCS_OK) return UcxError("ucp_worker_get_address", s);
  raw_address_.assign(reinterpret_cast<const char*>(addr), len);
  ucp_worker_release_address(worker_, addr);
  if (raw_address_.empty() || raw_address_.size() > kMaxPeerAddressPayload) {
    return absl::InternalError(absl::StrCat("ucx: this worker's address is ", raw_address_.size(),
                                            " bytes, outside [1, ", kMaxPeerAddressPayload, "]"));
  }
  address_ = SealPeerAddress(PeerAddressKind::kUcx, raw_address_);

  int ucx_fd = -1;
  s = ucp_worker_get_efd(worker_, &ucx_fd);
  if (s != UCS_OK) return UcxError("ucp_worker_get_efd", s);
  event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (event_fd_ < 0 || epoll_fd_ < 0) return absl::InternalError("ucx: eventfd/epoll failed");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = event_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, event_fd_, &ev);
  ev.data.fd = ucx_fd;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, ucx_fd, &ev);

  eps_.assign(size_, nullptr);
  ep_addrs_.assign(size_, "");
  peer_lost_.assign(size_, false);
  send_seq_.assign(size_, 0);
  recv_seq_.assign(size_, 0);
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void UcxTransport::Impl::Shutdown() {
  if (thread_.joinable()) {
    Submit([this] {
      AbortOnThread();
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    });
    thread_.join();
  }
  if (worker_) ucp_worker_destroy(worker_);
  if (context_) ucp_cleanup(context_);
  worker_ = nullptr;
  context_ = nullptr;
  if (event_fd_ >= 0) close(event_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
  event_fd_ = epoll_fd_ = -1;
}

void UcxTransport::Impl::Loop() {
  while (true) {
    std::deque<std::function<void()>> cmds;
    bool stop;
    {
      std::lock_guard<std::mutex> l(mu_);
      cmds.swap(commands_);
      stop = stop_;
    }
    for (auto& c : cmds) c();
    // Finish ep closes; on stop, keep progressing until they and all ops are released.
    for (size_t i = 0; i < closing_.size();) {
      if (ucp_request_check_status(closing_[i]) != UCS_INPROGRESS) {
        ucp_request_free(closing_[i]);
        closing_[i] = closing_.back();
        closing_.pop_back();
      } else {
        ++i;
      }
    }
    if (stop && closing_.empty() && inflight_.empty()) return;
    if (ucp_worker_progress(worker_) != 0) continue;
    if (!cmds.empty()) continue;
    if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) continue;
    epoll_event evs[2];
    // The short timeout with work in flight is a safety net for transports without wakeup.
    const bool busy = !inflight_.empty() || !closing_.empty();
    int n = epoll_wait(epoll_fd_, evs, 2, busy ? 1 : 100);
    for (int i = 0; i < n; ++i) {
      if (evs[i].data.fd == event_fd_) {
        uint64_t v;
        [[maybe_unused]] ssize_t r = read(event_fd_, &v, sizeof(v));
      }
    }
  }
}

void UcxTransport::Impl::ErrCb(void* arg, ucp_ep_h ep, ucs_status_t s) {
  auto* self = static_cast<Impl*>(arg);
  for (int p = 0; p < self->size_; ++p) {
    if (self->eps_[p] != ep) continue;
    self->peer_lost_[p] = true;
    // Receives from a lost peer would wait forever: cancel them with UNAVAILABLE.
    // (Copied: a cancel may complete, and so erase, the op at once.)
    std::vector<UcxOp*> ops(self->inflight_.begin(), self->inflight_.end());
    for (UcxOp* op : ops) {
      if (op->peer == p && op->request != nullptr) {
        op->forced = absl::UnavailableError(absl::StrCat(
            "ucx: lost connection to ", self->peer_names_[p], ": ", ucs_status_string(s)));
        if (!op->is_send) ucp_request_cancel(self->worker_, op->request);
      }
    }
    // Closed outside UCX's callback; skipped if BeginJob already replaced the endpoint.
    self->Submit([self, p, ep] {
      if (self->eps_[p] == ep) self->CloseEndpoint(p);
    });
  }
}

void UcxTransport::Impl::CloseEndpoint(int peer) {
  if (eps_[peer] == nullptr) return;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t r = ucp_ep_close_nbx(eps_[peer], &p);
  if (UCS_PTR_IS_PTR(r)) closing_.push_back(r);
  eps_[peer] = nullptr;
  ep_addrs_[peer].clear();
}

absl::Status UcxTransport::Impl::BeginJob(const std::string& job_id,
                                          const std::vector<std::string>& addrs) {
  if (static_cast<int>(addrs.size()) != size_) {
    return absl::InvalidArgumentError(absl::StrCat("peer_transport_addresses has ", addrs.size(),
                                                   " entries, want one per rank (", size_, ")"));
  }
  // Every peer's address is opened and checked here, before UCX parses any of it. This rank's
  // own entry is not used: it connects to itself with its own address.
  std::vector<std::string> raw(size_);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) {
      raw[p] = raw_address_;
      continue;
    }
    absl::StatusOr<std::string> opened = OpenPeerAddress(PeerAddressKind::kUcx, addrs[p]);
    if (opened.ok() && (static_cast<uint8_t>((*opened)[0]) & kUcxAddressVersionMask) !=
                           (static_cast<uint8_t>(raw_address_[0]) & kUcxAddressVersionMask)) {
      opened = absl::InvalidArgumentError(
          "holds a UCX address of another format version than this worker's UCX packs");
    }
    if (!opened.ok()) {
      return absl::UnavailableError(absl::StrCat("peer_transport_addresses[", p, "] of ",
                                                 peer_names_[p], " ", opened.status().message()));
    }
    raw[p] = *std::move(opened);
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    aborted_ = false;
  }
  job_tag_ = HashJob(job_id);
  send_seq_.assign(size_, 0);
  recv_seq_.assign(size_, 0);
  absl::Status result;
  Run([&] {
    for (int p = 0; p < size_ && result.ok(); ++p) {
      const std::string& a = raw[p];
      if (eps_[p] != nullptr && ep_addrs_[p] == a && !peer_lost_[p]) continue;
      CloseEndpoint(p);
      const std::string padded = a + std::string(kAddressPadding, '\0');
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.address = reinterpret_cast<const ucp_address_t*>(padded.data());
      ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      ep.err_handler.cb = &Impl::ErrCb;
      ep.err_handler.arg = this;
      ucs_status_t s = ucp_ep_create(worker_, &ep, &eps_[p]);
      if (s != UCS_OK) {
        eps_[p] = nullptr;
        result = absl::UnavailableError(absl::StrCat("peer_transport_addresses[", p, "]: ",
                                                     "cannot connect to ", peer_names_[p], ": ",
                                                     ucs_status_string(s)));
        break;
      }
      ep_addrs_[p] = a;
      peer_lost_[p] = false;
    }
  });
  return result;
}

void UcxTransport::Impl::SendCb(void* req, ucs_status_t s, void* user) {
  auto* op = static_cast<UcxOp*>(user);
  op->impl->Complete(op, s, op->bytes);
  ucp_request_free(req);
}

void UcxTransport::Impl::RecvCb(void* req, ucs_status_t s, const ucp_tag_recv_info_t* info,
                                void* user) {
  auto* op = static_cast<UcxOp*>(user);
  op->impl->Complete(op, s, s == UCS_OK ? info->length : 0);
  ucp_request_free(req);
}

void UcxTransport::Impl::StartOp(UcxOp* op) {
  bool aborted;
  {
    std::lock_guard<std::mutex> l(mu_);
    aborted = aborted_;
  }
  if (aborted) return Complete(op, UCS_ERR_CANCELED, 0);
  if (peer_lost_[op->peer] || (op->is_send && eps_[op->peer] == nullptr)) {
    op->forced =
        absl::UnavailableError(absl::StrCat("ucx: no connection to ", peer_names_[op->peer]));
    return Complete(op, UCS_ERR_UNREACHABLE, 0);
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                   UCP_OP_ATTR_FIELD_DATATYPE;
  p.datatype = ucp_dt_make_contig(1);
  p.user_data = op;
  ucs_status_ptr_t r;
  op->starting = true;
  if (op->is_send) {
    p.cb.send = &Impl::SendCb;
    r = ucp_tag_send_nbx(eps_[op->peer], op->data, op->bytes, op->tag, &p);
  } else {
    p.cb.recv = &Impl::RecvCb;
    // Always through the callback: UCX 1.13 leaves recv_info unset on immediate completion,
    // and the callback is where the received length is checked.
    p.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    r = ucp_tag_recv_nbx(worker_, op->data, op->bytes, op->tag, kFullMask, &p);
  }
  op->starting = false;
  if (op->early_done) return Complete(op, op->early_status, op->early_length);
  if (r == nullptr) return Complete(op, UCS_OK, op->bytes);
  if (UCS_PTR_IS_ERR(r)) return Complete(op, UCS_PTR_STATUS(r), 0);
  op->request = r;
  inflight_.insert(op);
}

void UcxTransport::Impl::Complete(UcxOp* op, ucs_status_t s, size_t length) {
  if (op->starting) {
    op->early_done = true;
    op->early_status = s;
    op->early_length = length;
    return;
  }
  inflight_.erase(op);
  op->request = nullptr;
  absl::Status st;
  if (!op->forced.ok()) {
    st = op->forced;
  } else if (s == UCS_ERR_CANCELED) {
    st = absl::CancelledError("ucx: transfer cancelled");
  } else if (s != UCS_OK) {
    st = absl::UnavailableError(absl::StrCat("ucx: ", op->is_send ? "send to " : "receive from ",
                                             peer_names_[op->peer], " failed: ",
                                             ucs_status_string(s)));
  } else if (length != op->bytes) {
    // A peer that sends what the plan does not say is a broken peer, not a bug here.
    st = absl::UnavailableError(absl::StrCat("ucx: message from ", peer_names_[op->peer],
                                             " has ", length, " bytes, expected ", op->bytes));
  }
  if (st.ok()) (op->is_send ? sent_ : received_)[op->peer] += static_cast<int64_t>(op->bytes);
  std::shared_ptr<UcxGroup> g = std::move(op->group);
  delete op;
  std::lock_guard<std::mutex> l(mu_);
  if (!st.ok() && g->status.ok()) g->status = st;
  if (--g->remaining == 0) cv_.notify_all();
}

class UcxPendingGroup : public PendingGroup {
 public:
  UcxPendingGroup(UcxTransport::Impl* impl, std::shared_ptr<UcxGroup> g)
      : impl_(impl), group_(std::move(g)) {}
  ~UcxPendingGroup() override {
    if (!waited_) (void)impl_->WaitGroup(group_, absl::Seconds(0));
  }
  absl::Status Wait(void* /*compute_stream*/, absl::Duration timeout) override {
    waited_ = true;
    return impl_->WaitGroup(group_, timeout);
  }

 private:
  UcxTransport::Impl* impl_;
  std::shared_ptr<UcxGroup> group_;
  bool waited_ = false;
};

absl::StatusOr<std::unique_ptr<PendingGroup>> UcxTransport::Impl::Post(
    std::span<const TransportMessage> sends, std::span<const TransportMessage> recvs) {
  for (const auto* list : {&sends, &recvs}) {
    const char* what = list == &sends ? "sends" : "recvs";
    for (size_t i = 0; i < list->size(); ++i) {
      const TransportMessage& m = (*list)[i];
      if (m.peer < 0 || m.peer >= size_) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, "[", i, "].peer = ", m.peer, " is not a rank in [0, ", size_, ")"));
      }
      if (m.bytes > 0 && m.data == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(what, "[", i, "].data is null"));
      }
    }
  }
  auto g = std::make_shared<UcxGroup>();
  g->remaining = static_cast<int>(sends.size() + recvs.size());
  std::vector<UcxOp*> ops;
  ops.reserve(g->remaining);
  for (const TransportMessage& m : sends) {
    ops.push_back(NewOp(g, true, m, MakeTag(job_tag_, rank_, send_seq_[m.peer]++)));
  }
  for (const TransportMessage& m : recvs) {
    ops.push_back(NewOp(g, false, m, MakeTag(job_tag_, m.peer, recv_seq_[m.peer]++)));
  }
  if (!ops.empty()) {
    Submit([this, ops = std::move(ops)] {
      for (UcxOp* op : ops) StartOp(op);
    });
  }
  return std::unique_ptr<PendingGroup>(new UcxPendingGroup(this, std::move(g)));
}

void UcxTransport::Impl::AbortOnThread() {
  std::vector<UcxOp*> ops(inflight_.begin(), inflight_.end());
  for (UcxOp* op : ops) {
    if (!op->is_send && op->request != nullptr) ucp_request_cancel(worker_, op->request);
  }
  // Force-closing the endpoints completes the outstanding sends with UCS_ERR_CANCELED.
  for (int p = 0; p < size_; ++p) CloseEndpoint(p);
}

void UcxTransport::Impl::Abort() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_) return;
    aborted_ = true;
  }
  Submit([this] { AbortOnThread(); });
}

absl::Status UcxTransport::Impl::WaitGroup(const std::shared_ptr<UcxGroup>& g,
                                           absl::Duration timeout) {
  std::unique_lock<std::mutex> l(mu_);
  const bool done = cv_.wait_for(l, absl::ToChronoNanoseconds(timeout),
                                 [&] { return g->remaining == 0; });
  if (done) return g->status;
  // The buffers stay in UCX's hands until every op is released: abort, then wait for that.
  l.unlock();
  Abort();
  l.lock();
  cv_.wait(l, [&] { return g->remaining == 0; });
  return absl::DeadlineExceededError(absl::StrCat(
      "ucx: transfers of a plan step did not complete within ", absl::FormatDuration(timeout)));
}

UcxTransport::UcxTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
UcxTransport::~UcxTransport() = default;

absl::StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::Create(
    int rank, int size, std::vector<std::string> peer_names) {
  if (size < 1 || size > kMaxRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("size = ", size, " must be in [1, ", kMaxRanks, "]"));
  }
  if (rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("rank = ", rank, " must be in [0, ", size, ")"));
  }
  auto impl = std::make_unique<Impl>(rank, size, std::move(peer_names));
  if (absl::Status st = impl->Init(); !st.ok()) {
    if (FdsNearLimit(kFdsPerTransport)) {  // a full worker, not a bug
      return absl::ResourceExhaustedError(absl::StrCat(
          "ucx: cannot start a transport: the worker is out of file descriptors (",
          CountOpenFds(), " open, RLIMIT_NOFILE ", FdLimit(), "): ", st.message()));
    }
    return st;
  }
  return std::unique_ptr<UcxTransport>(new UcxTransport(std::move(impl)));
}

const std::string& UcxTransport::address() const { return impl_->address_; }
absl::Status UcxTransport::BeginJob(const std::string& job_id,
                                    const std::vector<std::string>& peer_addresses) {
  return impl_->BeginJob(job_id, peer_addresses);
}
int UcxTransport::rank() const { return impl_->rank_; }
int UcxTransport::size() const { return impl_->size_; }
absl::StatusOr<std::unique_ptr<PendingGroup>> UcxTransport::Post(
    std::span<const TransportMessage> sends, std::span<const TransportMessage> recvs,
    void* /*ready_stream*/) {
  return impl_->Post(sends, recvs);
}
void UcxTransport::Abort() { impl_->Abort(); }
int64_t UcxTransport::bytes_sent() const {
  int64_t t = 0;
  for (auto& v : impl_->sent_) t += v.load();
  return t;
}
int64_t UcxTransport::bytes_received() const {
  int64_t t = 0;
  for (auto& v : impl_->received_) t += v.load();
  return t;
}
std::vector<int64_t> UcxTransport::bytes_sent_per_peer() const {
  std::vector<int64_t> r;
  for (auto& v : impl_->sent_) r.push_back(v.load());
  return r;
}
std::vector<int64_t> UcxTransport::bytes_received_per_peer() const {
  std::vector<int64_t> r;
  for (auto& v : impl_->received_) r.push_back(v.load());
  return r;
}

}  // namespace dfa
