#include "worker/gpu/nccl_transport.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/gpu/cuda_status.h"

namespace dfa {

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

absl::Status NcclTransport::AwaitComm(absl::Time deadline, const char* what) {
  while (true) {
    ncclResult_t async = ncclSuccess;
    NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm_, &async));
    if (async != ncclInProgress) return NcclStatus(async, what);
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": not complete after the deadline (rank ", rank_, " of ", size_,
                       "; a peer did not join or is lost)"));
    }
    absl::SleepFor(absl::Microseconds(20));
  }
}

absl::Status NcclTransport::Init(const NcclTransportOptions& options) {
  device_ = options.device;
  rank_ = options.rank;
  size_ = options.size;
  watchdog_period_ = options.watchdog_period;
  default_group_timeout_ = options.default_group_timeout;
  measure_compute_idle_ = options.measure_compute_idle;
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
  cudaStream_t stream = nullptr;
  // High priority: communication kernels get SMs as soon as they are queued, even while the
  // attention kernels of the current step fill the device.
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest));
  comm_stream_ = stream;
  cudaEvent_t ready = nullptr;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  ready_event_ = ready;

  ncclUniqueId id;
  std::memcpy(id.internal, options.unique_id.data(), sizeof(id.internal));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  absl::MutexLock lock(&comm_mu_);
  ncclComm_t comm = nullptr;
  NCCL_RETURN_IF_ERROR(ncclCommInitRankConfig(&comm, size_, id, rank_, &config));
  comm_ = comm;
  absl::Status st = AwaitComm(absl::Now() + options.init_timeout, "ncclCommInitRankConfig");
  if (!st.ok()) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
    comm_aborted_ = true;
    failed_ = true;
    return st;
  }
  st = ConnectAll(absl::Now() + options.init_timeout);
  if (!st.ok()) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
    comm_aborted_ = true;
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
  absl::Status st = [&]() -> absl::Status {
    NCCL_RETURN_IF_ERROR(ncclGroupStart());
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      ncclSend(b + p, 1, ncclUint8, p, comm_, comm_stream_);
      ncclRecv(b + size_ + p, 1, ncclUint8, p, comm_, comm_stream_);
    }
    ncclResult_t res = ncclGroupEnd();
    if (res != ncclSuccess && res != ncclInProgress) return NcclStatus(res, "ncclGroupEnd");
    RETURN_IF_ERROR(AwaitComm(deadline, "nccl connect to peers"));
    while (true) {
      cudaError_t q = cudaStreamQuery(comm_stream_);
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
  if (healthy && comm_stream_ != nullptr) healthy = Drain(absl::Seconds(30)).ok();
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (watchdog_.joinable()) watchdog_.join();
  cudaSetDevice(device_);
  {
    absl::MutexLock lock(&comm_mu_);
    if (comm_ != nullptr && !comm_aborted_) {
      bool destroyed = false;
      if (healthy) {
        ncclResult_t res = ncclCommFinalize(comm_);
        if ((res == ncclSuccess || res == ncclInProgress) &&
            AwaitComm(absl::Now() + absl::Seconds(10), "ncclCommFinalize").ok()) {
          destroyed = ncclCommDestroy(comm_) == ncclSuccess;
        }
      }
      if (!destroyed) ncclCommAbort(comm_);
    }
    comm_ = nullptr;
  }
  absl::MutexLock lock(&mu_);
  for (auto& s : outstanding_) cudaEventDestroy(s->done);
  for (CUevent_st* e : free_events_) cudaEventDestroy(e);
  for (auto& [a, b] : idle_pairs_) {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  for (CUevent_st* e : free_timing_events_) cudaEventDestroy(e);
  if (ready_event_ != nullptr) cudaEventDestroy(ready_event_);
  if (comm_stream_ != nullptr) cudaStreamDestroy(comm_stream_);
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
  if (comm_ != nullptr && !comm_aborted_) {
    // Releases NCCL kernels that wait on a lost peer, so the streams drain instead of hanging.
    ncclCommAbort(comm_);
    comm_aborted_ = true;
    comm_ = nullptr;
  }
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

absl::Status NcclTransport::StreamWait(void* compute_stream, CUevent_st* done) {
  cudaStream_t s = static_cast<cudaStream_t>(compute_stream);
  if (!measure_compute_idle_) {
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s, done, 0));
    return absl::OkStatus();
  }
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
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s, done, 0));
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
  ASSIGN_OR_RETURN(CUevent_st * done, TakeEvent());
  auto state = std::make_shared<GroupState>();
  state->done = done;
  state->deadline = absl::Now() + default_group_timeout_;

  absl::Status st;
  int64_t sent = 0, received = 0;
  {
    absl::MutexLock lock(&comm_mu_);
    if (comm_ == nullptr) {
      absl::MutexLock l2(&mu_);
      free_events_.push_back(done);
      return error_.ok() ? absl::FailedPreconditionError("nccl: no communicator") : error_;
    }
    auto post = [&]() -> absl::Status {
      // Sends read data produced by work already queued on the compute stream; receives may
      // overwrite buffers that queued computes still read. Both wait for it.
      CUDA_RETURN_IF_ERROR(
          cudaEventRecord(ready_event_, static_cast<cudaStream_t>(ready_stream)));
      CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(comm_stream_, ready_event_, 0));
      if (!sends.empty() || !recvs.empty()) {
        NCCL_RETURN_IF_ERROR(ncclGroupStart());
        for (const auto& m : sends) {
          ncclSend(m.data, m.bytes, ncclUint8, m.peer, comm_, comm_stream_);
          sent += static_cast<int64_t>(m.bytes);
          sent_per_peer_[m.peer] += static_cast<int64_t>(m.bytes);
        }
        for (const auto& m : recvs) {
          ncclRecv(m.data, m.bytes, ncclUint8, m.peer, comm_, comm_stream_);
          received += static_cast<int64_t>(m.bytes);
          received_per_peer_[m.peer] += static_cast<int64_t>(m.bytes);
        }
        // Errors of the individual calls are reported by ncclGroupEnd (non-blocking comm).
        ncclResult_t res = ncclGroupEnd();
        if (res != ncclSuccess && res != ncclInProgress) return NcclStatus(res, "ncclGroupEnd");
        RETURN_IF_ERROR(AwaitComm(absl::Now() + absl::Seconds(60), "nccl group launch"));
      }
      CUDA_RETURN_IF_ERROR(cudaEventRecord(done, comm_stream_));
      return absl::OkStatus();
    };
    st = post();
  }
  if (!st.ok()) {
    Fail(st);
    absl::MutexLock lock(&mu_);
    free_events_.push_back(done);
    return error_;
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
  cudaEvent_t probe = nullptr;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&probe, cudaEventDisableTiming));
  absl::Status st = CudaStatus(cudaEventRecord(probe, comm_stream_), "cudaEventRecord");
  const absl::Time deadline = absl::Now() + timeout;
  while (st.ok()) {
    cudaError_t q = cudaEventQuery(probe);
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
    absl::SleepFor(absl::Microseconds(50));
  }
  cudaEventDestroy(probe);
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
      if (comm_ != nullptr) {
        ncclResult_t async = ncclSuccess;
        ncclResult_t res = ncclCommGetAsyncError(comm_, &async);
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
          cudaError_t q = cudaEventQuery(s->done);
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
          free_events_.push_back(s->done);
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
