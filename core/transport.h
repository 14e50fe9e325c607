// Worker-to-worker data movement behind one interface: one implementation per file
// (inproc_transport for tests and the simulator, ucx_transport for host memory, nccl_transport
// for GPUs), each chosen by a capability check.
//
// Model: the PlanExecutor posts all sends and receives of one plan step as one *group*
// (NCCL: one ncclGroupStart/End), so no order of posting can deadlock. Within a group, the
// messages between one pair of workers are matched in posting order; the executor posts them
// in the plan's canonical order (sorted by tensor, then rows), which both sides share.
// Buffers are in the address space of the worker's backend (host memory for cpu, device memory
// for cuda) and must stay valid until the group completes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "absl/time/time.h"
#include "core/status.h"

namespace dfa {

struct TransportMessage {
  int peer = 0;
  void* data = nullptr;  // send: read from; recv: written to
  size_t bytes = 0;
};

// A posted group of sends and receives.
class PendingGroup {
 public:
  virtual ~PendingGroup() = default;
  // Orders the completion of the group before work later queued on `compute_stream`.
  // Host transports (inproc, ucx) block until every message is done; GPU transports (nccl) make
  // the stream wait on an event and return at once (no host synchronisation).
  // DEADLINE_EXCEEDED after `timeout`; UNAVAILABLE when a peer is lost; CANCELLED on Abort.
  virtual absl::Status Wait(void* compute_stream, absl::Duration timeout) = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string_view Name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Posts one step's messages. `ready_stream`: for GPU transports, sends wait for work already
  // queued on it (the computes that produced the data); ignored by host transports.
  // Returns at once; completion is observed through the returned group.
  virtual absl::StatusOr<std::unique_ptr<PendingGroup>> Post(
      std::span<const TransportMessage> sends, std::span<const TransportMessage> recvs,
      void* ready_stream) = 0;

  // Optional, GPU transports: records NOW, on `ready_stream`, the point the following Post()s'
  // messages wait for (instead of the stream's tail at Post time), until ClearReadyMark(). Lets
  // the executor queue a step's computes before paying the host cost of the next groups'
  // launch while those groups still wait only for the work queued before the mark. Returns
  // false (and records nothing) where posting later would not overlap (host transports: their
  // computes block the caller).
  virtual bool MarkReady(void* ready_stream) {
    (void)ready_stream;
    return false;
  }
  // Back to waiting for the stream's tail at each Post().
  virtual void ClearReadyMark() {}

  // Fails every pending and future group with CANCELLED (used to cancel a job). Thread-safe.
  virtual void Abort() = 0;

  // Called once after a pass's last step: blocks until every posted group is complete and
  // returns the first error of any of them (DEADLINE_EXCEEDED after `timeout`). GPU transports
  // need it because Wait() returns before the data moved: a peer lost after the last Wait()
  // would otherwise go unnoticed. Host transports complete groups in Wait() (default: OK).
  virtual absl::Status Finish(absl::Duration timeout) { return absl::OkStatus(); }

  // Bytes moved so far, for metrics.
  virtual int64_t bytes_sent() const = 0;
  virtual int64_t bytes_received() const = 0;
};

}  // namespace dfa
