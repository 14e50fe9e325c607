#include "core/gpu/nccl_transport.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/gpu/nccl_status.h"

namespace dfa {

static_assert(kNcclUniqueIdBytes == NCCL_UNIQUE_ID_BYTES, "nccl.h's unique id size changed");

absl::StatusOr<std::string> NewNcclUniqueId() {
  ncclUniqueId id;
  NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
  return std::string(id.internal, sizeof(id.internal));
}

// The handle the executor holds for one posted group.
class NcclTransport::Group : public PendingGroup {
 public:
  Group(NcclTransport* transport, std::shared_ptr<GroupState> state)
      : transport_(transport), state_(std::move(state)) {}
  ~Group() override { transport_->Release(state_.get()); }

  absl::Status Wait(void* compute_stream, absl::Duration timeout) override {
    RETURN_IF_ERROR(transport_->status());
    transport_->Tighten(state_.get(), absl::Now() + timeout);
    return transport_->StreamWait(compute_stream, state_->done);
  }

 private:
  NcclTransport* transport_;
  std::shared_ptr<GroupState> state_;
};

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(
    const NcclTransportOptions& options) {
  if (options.size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: size must be >= 1, got ", options.size));
  }
  if (options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl: rank must be in [0, ", options.size, "), got ", options.rank));
  }
  if (options.unique_id.size() != NCCL_UNIQUE_ID_BYTES) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: unique_id must be ", NCCL_UNIQUE_ID_BYTES,
                                                   " bytes, got ", options.unique_id.size()));
  }
  if (options.device < 0) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: device must be >= 0, got ", options.device));
  }
  std::unique_ptr<NcclTransport> t(new NcclTransport());
  RETURN_IF_ERROR(t->Init(options));
  return t;
}

absl::Status NcclTransport::AwaitComm(ncclComm* comm, absl::Time deadline, const char* what) {
  // A group launch on a non-blocking communicator completes in tens of microseconds: poll
  // without sleeping for the first 2 ms (a 20 us sleep costs ~60-100 us of wake-up, on the
  // critical path of every step's enqueue), then back off to sleeps.
  const absl::Time spin_until = absl::Now() + absl::Milliseconds(2);
  while (true) {
    ncclResult_t async = ncclSuccess;
    NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm, &async));
    if (async != ncclInProgress) return NcclStatus(async, what);
    const absl::Time now = absl::Now();
    if (now > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": not complete after the deadline (rank ", rank_, " of ", size_,
                       "; a peer did not join or is lost)"));
    }
    if (now < spin_until) {
      std::this_thread::yield();
    } else {
      absl::SleepFor(absl::Microseconds(20));
    }
  }
}

absl::Status NcclTransport::Init(const NcclTransportOptions& options) {
  device_ = options.device;
  rank_ = options.rank;
  size_ = options.size;
  watchdog_period_ = options.watchdog_period;
  default_group_timeout_ = options.default_group_timeout;
  measure_compute_idle_ = options.measure_compute_idle;
  lanes_ = options.directional_lanes ? kLanes : 1;
  sent_per_peer_ = std::vector<std::atomic<int64_t>>(size_);
  received_per_peer_ = std::vector<std::atomic<int64_t>>(size_);
  int count = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (device_ >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl: device ", device_, " does not exist (", count, " devices)"));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  int least = 0, greatest = 0;
  CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  // High priority: communication kernels get SMs as soon as they are queued, even while the
  // attention kernels of the current step fill the device.
  for (int l = 0; l < lanes_; ++l) {
    cudaStream_t stream = nullptr;
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest));
    comm_streams_[l] = stream;
  }
  cudaEvent_t ready = nullptr;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  ready_event_ = ready;

  ncclUniqueId id;
  std::memcpy(id.internal, options.unique_id.data(), sizeof(id.internal));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  absl::MutexLock lock(&comm_mu_);
  const absl::Time deadline = absl::Now() + options.init_timeout;
  ncclComm_t comm = nullptr;
  // NCCL's "invalid usage" at init is most often two ranks of the communicator on one GPU
  // (two workers of a session started on the same device): say so beside NCCL's reason.
  auto explain = [&](absl::Status st) {
    if (st.code() != absl::StatusCode::kInvalidArgument) return st;
    return absl::InvalidArgumentError(absl::StrCat(
        st.message(), " (rank ", rank_, " of ", size_, " on device ", device_,
        "; NCCL refuses two ranks of one communicator on one GPU: every worker of a session "
        "needs a device of its own)"));
  };
  RETURN_IF_ERROR(explain(NcclStatus(ncclCommInitRankConfig(&comm, size_, id, rank_, &config),
                                     "ncclCommInitRankConfig")));
  comms_[0] = comm;
  absl::Status st = explain(AwaitComm(comms_[0], deadline, "ncclCommInitRankConfig"));
  if (st.ok() && lanes_ == 2) {
    // The second lane: same ranks, its own communicator (collective over the group).
    ncclComm_t second = nullptr;
    st = NcclStatus(ncclCommSplit(comms_[0], 0, rank_, &second, &config), "ncclCommSplit");
    if (st.ok()) st = AwaitComm(comms_[0], deadline, "ncclCommSplit");
    if (st.ok()) {
      comms_[1] = second;
      st = AwaitComm(comms_[1], deadline, "ncclCommSplit (new communicator)");
    }
  }
  if (st.ok()) st = ConnectAll(deadline);
  if (!st.ok()) {
    AbortComms();
    failed_ = true;
    return st;
  }
  watchdog_ = std::thread([this] { WatchdogLoop(); });
  return absl::OkStatus();
}

absl::Status NcclTransport::ConnectAll(absl::Time deadline) {
  if (size_ == 1) return absl::OkStatus();
  // NCCL connects point-to-point channels lazily, at the first send/recv to a peer, and that
  // needs the peer's participation. Exchanging one byte with every peer here moves connection
  // setup (and its failures) to session start, so a job's first step neither pays for it nor
  // can block on a peer that never posts.
  void* buf = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&buf, 2 * size_));
  char* b = static_cast<char*>(buf);
  auto lane_done = [&]() -> cudaError_t {
    for (int l = 0; l < lanes_; ++l) {
      cudaError_t q = cudaStreamQuery(comm_streams_[l]);
      if (q != cudaSuccess) return q;
    }
    return cudaSuccess;
  };
  absl::Status st = [&]() -> absl::Status {
    for (int l = 0; l < lanes_; ++l) {
      NCCL_RETURN_IF_ERROR(ncclGroupStart());
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        if (SendLane(p) == l) ncclSend(b + p, 1, ncclUint8, p, comms_[l], comm_streams_[l]);
        if (RecvLane(p) == l) {
          ncclRecv(b + size_ + p, 1, ncclUint8, p, comms_[l], comm_streams_[l]);
        }
      }
      ncclResult_t res = ncclGroupEnd();
      if (res != ncclSuccess && res != ncclInProgress) return NcclStatus(res, "ncclGroupEnd");
      RETURN_IF_ERROR(AwaitComm(comms_[l], deadline, "nccl connect to peers"));
    }
    while (true) {
      cudaError_t q = lane_done();
      if (q == cudaSuccess) return absl::OkStatus();
      if (q != cudaErrorNotReady) return CudaStatus(q, "nccl connect to peers");
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "nccl: rank ", rank_, " of ", size_, ": peers did not complete the first exchange"));
      }
      absl::SleepFor(absl::Microseconds(50));
    }
  }();
  if (st.ok()) cudaFree(buf);  // on failure the kernel may still hold it; leak it
  return st;
}

NcclTransport::~NcclTransport() {
  bool healthy = !failed_.load();
  if (healthy && comm_streams_[0] != nullptr) healthy = Drain(absl::Seconds(30)).ok();
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (watchdog_.joinable()) watchdog_.join();
  cudaSetDevice(device_);
  {
    absl::MutexLock lock(&comm_mu_);
    if (!comm_aborted_) {
      for (int l = lanes_ - 1; l >= 0; --l) {
        if (comms_[l] == nullptr) continue;
        bool destroyed = false;
        if (healthy) {
          ncclResult_t res = ncclCommFinalize(comms_[l]);
          if ((res == ncclSuccess || res == ncclInProgress) &&
              AwaitComm(comms_[l], absl::Now() + absl::Seconds(10), "ncclCommFinalize").ok()) {
            destroyed = ncclCommDestroy(comms_[l]) == ncclSuccess;
          }
        }
        if (!destroyed) ncclCommAbort(comms_[l]);
        comms_[l] = nullptr;
      }
    }
  }
  absl::MutexLock lock(&mu_);
  for (auto& s : outstanding_) {
    for (CUevent_st* e : s->done) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  }
  for (CUevent_st* e : free_events_) cudaEventDestroy(e);
  for (auto& [a, b] : idle_pairs_) {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  for (CUevent_st* e : free_timing_events_) cudaEventDestroy(e);
  if (ready_event_ != nullptr) cudaEventDestroy(ready_event_);
  for (CUstream_st* st : comm_streams_) {
    if (st != nullptr) cudaStreamDestroy(st);
  }
}

std::vector<int64_t> NcclTransport::bytes_sent_per_peer() const {
  std::vector<int64_t> v;
  for (const auto& b : sent_per_peer_) v.push_back(b.load());
  return v;
}

std::vector<int64_t> NcclTransport::bytes_received_per_peer() const {
  std::vector<int64_t> v;
  for (const auto& b : received_per_peer_) v.push_back(b.load());
  return v;
}

absl::Status NcclTransport::status() const {
  absl::MutexLock lock(&mu_);
  return error_;
}

void NcclTransport::Fail(absl::Status error) {
  {
    absl::MutexLock lock(&mu_);
    if (error_.ok()) error_ = std::move(error);
    failed_ = true;
  }
  absl::MutexLock lock(&comm_mu_);
  // Releases NCCL kernels that wait on a lost peer, so the streams drain instead of hanging.
  AbortComms();
}

void NcclTransport::AbortComms() {
  if (comm_aborted_) return;
  for (int l = kLanes - 1; l >= 0; --l) {
    if (comms_[l] != nullptr) ncclCommAbort(comms_[l]);
    comms_[l] = nullptr;
  }
  comm_aborted_ = true;
}

void NcclTransport::Abort() { Fail(absl::CancelledError("nccl transport: aborted")); }

absl::StatusOr<CUevent_st*> NcclTransport::TakeEvent() {
  {
    absl::MutexLock lock(&mu_);
    if (!free_events_.empty()) {
      CUevent_st* e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void NcclTransport::Release(GroupState* state) {
  absl::MutexLock lock(&mu_);
  state->released = true;
}

void NcclTransport::Tighten(GroupState* state, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  state->deadline = std::min(state->deadline, deadline);
}

absl::Status NcclTransport::StreamWait(void* compute_stream, CUevent_st* const* done) {
  cudaStream_t s = static_cast<cudaStream_t>(compute_stream);
  auto wait_all = [&]() -> absl::Status {
    for (int l = 0; l < kLanes; ++l) {
      if (done[l] != nullptr) CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s, done[l], 0));
    }
    return absl::OkStatus();
  };
  if (!measure_compute_idle_) return wait_all();
  cudaEvent_t ev[2] = {nullptr, nullptr};
  {
    absl::MutexLock lock(&mu_);
    for (auto& e : ev) {
      if (!free_timing_events_.empty()) {
        e = free_timing_events_.back();
        free_timing_events_.pop_back();
      }
    }
  }
  for (auto& e : ev) {
    if (e == nullptr) CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
  }
  CUDA_RETURN_IF_ERROR(cudaEventRecord(ev[0], s));
  RETURN_IF_ERROR(wait_all());
  CUDA_RETURN_IF_ERROR(cudaEventRecord(ev[1], s));
  absl::MutexLock lock(&mu_);
  idle_pairs_.emplace_back(ev[0], ev[1]);
  return absl::OkStatus();
}

absl::StatusOr<double> NcclTransport::CollectComputeIdleSeconds() {
  absl::MutexLock lock(&mu_);
  double total = 0;
  absl::Status st;
  for (auto& [a, b] : idle_pairs_) {
    float ms = 0;
    cudaError_t err = cudaEventElapsedTime(&ms, a, b);
    if (err == cudaSuccess) {
      total += ms / 1e3;
    } else if (st.ok()) {
      st = err == cudaErrorNotReady
               ? absl::FailedPreconditionError("nccl: idle timing read before the stream finished")
               : CudaStatus(err, "cudaEventElapsedTime");
    }
    free_timing_events_.push_back(a);
    free_timing_events_.push_back(b);
  }
  idle_pairs_.clear();
  if (!st.ok()) return st;
  return total;
}

bool NcclTransport::MarkReady(void* ready_stream) {
  absl::MutexLock lock(&comm_mu_);
  if (comm_aborted_ || ready_event_ == nullptr) return false;
  premarked_ =
      cudaEventRecord(ready_event_, static_cast<cudaStream_t>(ready_stream)) == cudaSuccess;
  return premarked_;
}

void NcclTransport::ClearReadyMark() {
  absl::MutexLock lock(&comm_mu_);
  premarked_ = false;
}

absl::StatusOr<std::unique_ptr<PendingGroup>> NcclTransport::Post(
    std::span<const TransportMessage> sends, std::span<const TransportMessage> recvs,
    void* ready_stream) {
  auto check = [&](const TransportMessage& m, const char* kind, size_t i) -> absl::Status {
    if (m.peer < 0 || m.peer >= size_ || m.peer == rank_) {
      return absl::InvalidArgumentError(absl::StrCat("nccl: ", kind, "[", i, "].peer ", m.peer,
                                                     " is not another rank of [0, ", size_, ")"));
    }
    if (m.bytes > 0 && m.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("nccl: ", kind, "[", i, "].data is null"));
    }
    return absl::OkStatus();
  };
  for (size_t i = 0; i < sends.size(); ++i) RETURN_IF_ERROR(check(sends[i], "sends", i));
  for (size_t i = 0; i < recvs.size(); ++i) RETURN_IF_ERROR(check(recvs[i], "recvs", i));
  RETURN_IF_ERROR(status());
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  // Which lanes this group uses (a group with no message still gets lane 0's done event).
  bool used[kLanes] = {false, false};
  for (const auto& m : sends) used[SendLane(m.peer)] = true;
  for (const auto& m : recvs) used[RecvLane(m.peer)] = true;
  if (!used[0] && !used[1]) used[0] = true;
  auto state = std::make_shared<GroupState>();
  state->deadline = absl::Now() + default_group_timeout_;
  auto give_back_events = [&]() {
    absl::MutexLock lock(&mu_);
    for (CUevent_st*& e : state->done) {
      if (e != nullptr) free_events_.push_back(e);
      e = nullptr;
    }
  };
  for (int l = 0; l < kLanes; ++l) {
    if (!used[l]) continue;
    auto e = TakeEvent();
    if (!e.ok()) {
      give_back_events();
      return e.status();
    }
    state->done[l] = *e;
  }

  absl::Status st;
  int64_t sent = 0, received = 0;
  {
    absl::MutexLock lock(&comm_mu_);
    if (comm_aborted_ || comms_[0] == nullptr) {
      give_back_events();
      absl::Status err = status();
      return err.ok() ? absl::FailedPreconditionError("nccl: no communicator") : err;
    }
    auto post = [&]() -> absl::Status {
      // Sends read data produced by work already queued on the compute stream; receives may
      // overwrite buffers that queued computes still read. Both wait for it.
      if (!premarked_) {  // else MarkReady recorded it (kept until ClearReadyMark)
        CUDA_RETURN_IF_ERROR(
            cudaEventRecord(ready_event_, static_cast<cudaStream_t>(ready_stream)));
      }
      for (int l = 0; l < kLanes; ++l) {
        if (!used[l]) continue;
        cudaStream_t stream = comm_streams_[l];
        CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, ready_event_, 0));
        bool any = false;
        for (const auto& m : sends) any |= SendLane(m.peer) == l;
        for (const auto& m : recvs) any |= RecvLane(m.peer) == l;
        if (any) {
          NCCL_RETURN_IF_ERROR(ncclGroupStart());
          for (const auto& m : sends) {
            if (SendLane(m.peer) != l) continue;
            ncclSend(m.data, m.bytes, ncclUint8, m.peer, comms_[l], stream);
            sent += static_cast<int64_t>(m.bytes);
            sent_per_peer_[m.peer] += static_cast<int64_t>(m.bytes);
          }
          for (const auto& m : recvs) {
            if (RecvLane(m.peer) != l) continue;
            ncclRecv(m.data, m.bytes, ncclUint8, m.peer, comms_[l], stream);
            received += static_cast<int64_t>(m.bytes);
            received_per_peer_[m.peer] += static_cast<int64_t>(m.bytes);
          }
          // Errors of the individual calls are reported by ncclGroupEnd (non-blocking comm).
          ncclResult_t res = ncclGroupEnd();
          if (res != ncclSuccess && res != ncclInProgress) return NcclStatus(res, "ncclGroupEnd");
          RETURN_IF_ERROR(
              AwaitComm(comms_[l], absl::Now() + absl::Seconds(60), "nccl group launch"));
        }
        CUDA_RETURN_IF_ERROR(cudaEventRecord(state->done[l], stream));
      }
      return absl::OkStatus();
    };
    st = post();
  }
  if (!st.ok()) {
    Fail(st);
    give_back_events();
    return status();
  }
  bytes_sent_ += sent;
  bytes_received_ += received;
  {
    absl::MutexLock lock(&mu_);
    outstanding_.push_back(state);
  }
  return std::unique_ptr<PendingGroup>(new Group(this, std::move(state)));
}

absl::Status NcclTransport::Drain(absl::Duration timeout) {
  RETURN_IF_ERROR(status());
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  cudaEvent_t probe[kLanes] = {nullptr, nullptr};
  absl::Status st;
  for (int l = 0; l < lanes_ && st.ok(); ++l) {
    st = CudaStatus(cudaEventCreateWithFlags(&probe[l], cudaEventDisableTiming), "cudaEventCreate");
    if (st.ok()) st = CudaStatus(cudaEventRecord(probe[l], comm_streams_[l]), "cudaEventRecord");
  }
  const absl::Time deadline = absl::Now() + timeout;
  const absl::Time spin_until = absl::Now() + absl::Milliseconds(2);  // see AwaitComm
  while (st.ok()) {
    cudaError_t q = cudaSuccess;
    for (int l = 0; l < lanes_ && q == cudaSuccess; ++l) q = cudaEventQuery(probe[l]);
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) {
      st = CudaStatus(q, "cudaEventQuery(comm stream)");
      break;
    }
    st = status();
    if (!st.ok()) break;
    if (absl::Now() > deadline) {
      Fail(absl::DeadlineExceededError(absl::StrCat(
          "nccl: rank ", rank_, ": communication not done after ", absl::FormatDuration(timeout),
          " (a peer is lost or did not post its matching messages)")));
      st = status();
      break;
    }
    if (absl::Now() < spin_until) {
      std::this_thread::yield();
    } else {
      absl::SleepFor(absl::Microseconds(50));
    }
  }
  for (cudaEvent_t p : probe) {
    if (p != nullptr) cudaEventDestroy(p);
  }
  if (st.ok()) st = status();
  return st;
}

void NcclTransport::WatchdogLoop() {
  cudaSetDevice(device_);
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto stopped = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopped), watchdog_period_)) return;
    }
    if (failed_.load()) continue;  // keep recycling nothing; the transport is dead
    absl::Status to_fail;
    if (comm_mu_.TryLock()) {
      for (int l = 0; l < kLanes && to_fail.ok(); ++l) {
        if (comm_aborted_ || comms_[l] == nullptr) continue;
        ncclResult_t async = ncclSuccess;
        ncclResult_t res = ncclCommGetAsyncError(comms_[l], &async);
        if (res != ncclSuccess) {
          to_fail = NcclStatus(res, "ncclCommGetAsyncError");
        } else if (async != ncclSuccess && async != ncclInProgress) {
          to_fail = absl::UnavailableError(
              absl::StrCat("nccl: rank ", rank_, ": communication failed (peer lost?): ",
                           ncclGetErrorString(async)));
        }
      }
      comm_mu_.Unlock();
    }
    if (to_fail.ok()) {
      absl::MutexLock lock(&mu_);
      const absl::Time now = absl::Now();
      std::vector<std::shared_ptr<GroupState>> keep;
      keep.reserve(outstanding_.size());
      for (auto& s : outstanding_) {
        if (!s->completed) {
          cudaError_t q = cudaSuccess;
          for (CUevent_st* e : s->done) {
            if (e != nullptr && q == cudaSuccess) q = cudaEventQuery(e);
          }
          if (q == cudaSuccess) {
            s->completed = true;
          } else if (q != cudaErrorNotReady) {
            to_fail = CudaStatus(q, "cudaEventQuery(nccl group)");
          } else if (now > s->deadline && to_fail.ok()) {
            to_fail = absl::DeadlineExceededError(
                absl::StrCat("nccl: rank ", rank_, ": a step's messages were not done by their "
                             "deadline (a peer is lost or did not post its matching messages)"));
          }
        }
        if (s->completed && s->released) {
          for (CUevent_st* e : s->done) {
            if (e != nullptr) free_events_.push_back(e);
          }
        } else {
          keep.push_back(std::move(s));
        }
      }
      outstanding_ = std::move(keep);
    }
    if (!to_fail.ok()) Fail(std::move(to_fail));
  }
}

}  // namespace dfa
