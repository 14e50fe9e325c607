// NcclTransport: the Transport (transport.h) between GPU workers, over NCCL point-to-point.
//
// Streams and events, per Post():
//   ready_stream --(event "ready")--> comm stream: ncclGroupStart; ncclSend/ncclRecv...;
//   ncclGroupEnd --(event "done")--> PendingGroup::Wait makes the compute stream wait on it.
// No host synchronisation happens in Post() or Wait(): both only queue work and return.
// One NCCL group per Post() pairs every send and receive of a plan step, so no posting order
// can deadlock; messages between one pair of ranks are matched in posting order.
//
// Two lanes: messages from a lower to a higher rank travel on one communicator and stream,
// messages from a higher to a lower rank on another (made by ncclCommSplit). NCCL runs the
// groups of one communicator in issue order, each group as a unit, so with a single lane two
// ranks that each post a receive-only group before a send-only group (the executor's early
// and late groups, e.g. dK/dV partials in the balanced plan's last backward step) wait on each
// other for ever. Per direction, a rank's groups only ever wait on groups of lower ranks
// (lane 0) or of higher ranks (lane 1), so no cycle can form.
//
// Failure handling: the communicator is non-blocking (ncclConfig_t.blocking = 0). A watchdog
// thread polls ncclCommGetAsyncError and the "done" events of groups that have been waited on;
// when NCCL reports an error, or a group is not done by the deadline given to Wait(), it
// aborts the communicator (ncclCommAbort releases kernels stuck on a lost peer, so streams
// drain instead of hanging) and records the error. From then on Post(), Wait() and Drain()
// return it (UNAVAILABLE for a lost peer, DEADLINE_EXCEEDED for a timeout, CANCELLED after
// Abort()). A transport that failed or was aborted stays failed: the session needs a new
// communicator (a new unique id).
//
// Bootstrap: one rank (rank 0's worker, or anyone on a host all ranks can reach) calls
// NewNcclUniqueId(), which starts NCCL's bootstrap root in that process; the 128-byte id travels
// to every rank of the group (OpenSessionRequest.nccl_unique_id, or rank 0's
// OpenSessionResponse.transport_address); each rank calls Create() with it. Create() returns
// once all ranks joined, or DEADLINE_EXCEEDED after options.init_timeout.
//
// Threads: Post(), Wait() and Drain() from one thread at a time (the executor's); Abort(),
// bytes_sent(), bytes_received() and status() from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/transport.h"

// Opaque CUDA/NCCL handles, so that users of this header need no CUDA include path.
struct CUstream_st;
struct CUevent_st;
struct ncclComm;

namespace dfa {

// Bytes of an NCCL unique id (NCCL_UNIQUE_ID_BYTES; nccl_transport.cc checks they agree).
inline constexpr size_t kNcclUniqueIdBytes = 128;

// A new NCCL unique id (ncclGetUniqueId), as bytes. Starts NCCL's bootstrap root in this process;
// it must stay alive until every rank called Create().
absl::StatusOr<std::string> NewNcclUniqueId();

struct NcclTransportOptions {
  int device = 0;  // CUDA device ordinal of this rank
  int rank = 0;
  int size = 1;
  std::string unique_id;  // from NewNcclUniqueId(); exactly NCCL_UNIQUE_ID_BYTES (128) bytes
  absl::Duration init_timeout = absl::Seconds(60);
  // How often the watchdog looks at NCCL's async error and outstanding groups.
  absl::Duration watchdog_period = absl::Milliseconds(2);
  // Deadline for a group that is never waited on (counted from Post()).
  absl::Duration default_group_timeout = absl::Seconds(300);
  // Wait() brackets its stream wait with two timing events, so CollectComputeIdleSeconds() can
  // tell how long the compute stream stood still waiting for data (the GPU's idle time; host
  // clocks cannot see it since nothing waits on the host).
  bool measure_compute_idle = true;
  // Two communicators, one per direction (see above). false: one (tests of the old behaviour).
  bool directional_lanes = true;
};

class NcclTransport : public Transport {
 public:
  // INVALID_ARGUMENT naming the field for bad options; DEADLINE_EXCEEDED when the other ranks
  // did not join within init_timeout; UNAVAILABLE when NCCL or CUDA cannot start.
  static absl::StatusOr<std::unique_ptr<NcclTransport>> Create(const NcclTransportOptions& options);
  ~NcclTransport() override;

  std::string_view Name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // Messages: `peer` in [0, size) and != rank; `data` a device pointer on this rank's device
  // (or nullptr with bytes == 0). `ready_stream` is a cudaStream_t (nullptr: legacy default).
  bool MarkReady(void* ready_stream) override;
  void ClearReadyMark() override;
  absl::StatusOr<std::unique_ptr<PendingGroup>> Post(std::span<const TransportMessage> sends,
                                                     std::span<const TransportMessage> recvs,
                                                     void* ready_stream) override;
  void Abort() override;
  int64_t bytes_sent() const override { return bytes_sent_.load(); }
  int64_t bytes_received() const override { return bytes_received_.load(); }
  // Per peer rank (index = rank; own rank stays 0), for metrics.
  std::vector<int64_t> bytes_sent_per_peer() const;
  std::vector<int64_t> bytes_received_per_peer() const;

  // Blocks the host until every posted group is done, or the transport failed, or `timeout`
  // passed (then it fails the transport with DEADLINE_EXCEEDED). For the end of a job.
  absl::Status Drain(absl::Duration timeout);
  absl::Status Finish(absl::Duration timeout) override { return Drain(timeout); }
  // OK, or the error that failed the transport.
  absl::Status status() const;
  // Seconds the compute stream(s) spent blocked in the waits queued by Wait() since the last
  // call: the sum over waits of the time between "compute reached the wait" and "data arrived".
  // Call after the stream was synchronised (FAILED_PRECONDITION if a wait has not run yet).
  absl::StatusOr<double> CollectComputeIdleSeconds();
  // The communication stream of lane 0 (cudaStream_t), for tests and diagnostics.
  void* comm_stream() const { return comm_streams_[0]; }

 private:
  class Group;
  // One posted group, shared by its Group handle and the watchdog.
  static constexpr int kLanes = 2;
  struct GroupState {
    CUevent_st* done[kLanes] = {nullptr, nullptr};  // per lane; nullptr: lane unused
    absl::Time deadline;
    bool completed = false;  // done event observed complete
    bool released = false;   // Group handle destroyed; event may be recycled once completed
  };

  NcclTransport() = default;
  absl::Status Init(const NcclTransportOptions& options);
  void WatchdogLoop();
  // Records `error` (the first one wins) and aborts the communicator. Any thread.
  void Fail(absl::Status error);
  // Polls ncclCommGetAsyncError until the communicator is no longer "in progress".
  absl::Status AwaitComm(ncclComm* comm, absl::Time deadline, const char* what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(comm_mu_);
  // Lane of a message to (send) or from (recv) `peer`: 0 when it flows to a higher rank.
  int SendLane(int peer) const { return lanes_ == 1 || rank_ < peer ? 0 : 1; }
  int RecvLane(int peer) const { return lanes_ == 1 || peer < rank_ ? 0 : 1; }
  void AbortComms() ABSL_EXCLUSIVE_LOCKS_REQUIRED(comm_mu_);
  // One exchange with every peer on every lane, so NCCL sets up its connections now.
  absl::Status ConnectAll(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(comm_mu_);
  absl::StatusOr<CUevent_st*> TakeEvent();
  void Release(GroupState* state);
  void Tighten(GroupState* state, absl::Time deadline);
  // Queues "compute_stream waits for done", bracketed by timing events when measuring.
  absl::Status StreamWait(void* compute_stream, CUevent_st* const* done);

  int device_ = 0;
  int rank_ = 0;
  int size_ = 1;
  absl::Duration watchdog_period_;
  absl::Duration default_group_timeout_;
  int lanes_ = kLanes;
  CUstream_st* comm_streams_[kLanes] = {nullptr, nullptr};
  CUevent_st* ready_event_ = nullptr;  // re-recorded by every Post (under comm_mu_)
  // MarkReady recorded ready_event_ for the Posts until ClearReadyMark.
  bool premarked_ ABSL_GUARDED_BY(comm_mu_) = false;

  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> bytes_received_{0};
  std::atomic<bool> failed_{false};
  std::vector<std::atomic<int64_t>> sent_per_peer_, received_per_peer_;  // sized in Init

  // Serialises NCCL calls that use comm_ against ncclCommAbort (which frees it).
  absl::Mutex comm_mu_;
  ncclComm* comms_[kLanes] ABSL_GUARDED_BY(comm_mu_) = {nullptr, nullptr};
  bool comm_aborted_ ABSL_GUARDED_BY(comm_mu_) = false;

  mutable absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::shared_ptr<GroupState>> outstanding_ ABSL_GUARDED_BY(mu_);
  std::vector<CUevent_st*> free_events_ ABSL_GUARDED_BY(mu_);
  bool measure_compute_idle_ = true;
  // Timing-event pairs (before, after) of queued waits, and spare timing events.
  std::vector<std::pair<CUevent_st*, CUevent_st*>> idle_pairs_ ABSL_GUARDED_BY(mu_);
  std::vector<CUevent_st*> free_timing_events_ ABSL_GUARDED_BY(mu_);
  std::thread watchdog_;
};

}  // namespace dfa
