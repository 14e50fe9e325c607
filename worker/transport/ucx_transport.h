// UcxTransport: the Transport (transport.h) for host memory, over UCX's tagged messages.
// UCX picks the wire per peer: shared memory (sm) within a host, TCP (or RDMA) between hosts,
// self for a rank talking to itself. Use with the cpu backend (buffers are host memory).
//
// Life cycle (one object per session on each worker):
//   auto t = UcxTransport::Create(rank, size, names); // UCX worker + progress thread
//   t->address();                                   // bytes for OpenSessionResponse (sealed)
//   t->BeginJob(job_id, peer_addresses);            // RunJobRequest.peer_transport_addresses
//   t->Post(...)->Wait(...) ... ;                   // the executor's steps
//   t->Abort();                                     // CancelJob: pending groups end CANCELLED
//   t->BeginJob(next_job_id, ...);                  // clears the abort, reconnects if needed
//
// Matching: a message's tag is (hash of job id, sender rank, per-(sender, receiver) sequence
// number), so messages between two ranks match in posting order and a late message of an
// earlier (cancelled) job never matches a receive of a later one.
//
// Threads: every UCX call runs on the transport's own progress thread, which sleeps on UCX's
// wakeup file descriptor when idle (no busy polling that would steal the kernels' cores).
// Post, Wait, Abort, BeginJob and the counters may be called from any thread; Post/BeginJob
// of one transport must not race each other (the executor posts from one thread).
// Buffers: a group's buffers must stay valid until its Wait returns; Wait returns only after
// UCX has released every buffer of the group, also on error, timeout or abort.
// Errors: a peer that disappears fails its groups with UNAVAILABLE; Wait's timeout gives
// DEADLINE_EXCEEDED (and aborts the transport, since the group's buffers must be released).
// Addresses: address() is this worker's UCX address sealed in the envelope of peer_address.h;
// BeginJob opens and checks every peer's envelope (magic, version, kind, length, CRC32C, the
// UCX format version) before UCX parses a byte of it, so a damaged or foreign address fails the
// job with UNAVAILABLE naming the peer and never reaches ucp_address_unpack (which has no
// length and aborts the process on what it cannot parse).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/transport.h"

namespace dfa {

class UcxTransport : public Transport {
 public:
  // INTERNAL (naming the UCX call) when UCX cannot start; INVALID_ARGUMENT on bad rank/size.
  // `peer_names[r]` (optional, e.g. "worker-1 at host:port") names rank r in errors.
  static absl::StatusOr<std::unique_ptr<UcxTransport>> Create(
      int rank, int size, std::vector<std::string> peer_names = {});
  ~UcxTransport() override;

  // This rank's UCX worker address, sealed (peer_address.h): the bytes peers connect to.
  const std::string& address() const;

  // Prepares for a job: clears a previous Abort, resets the sequence numbers, and connects to
  // the peers (reusing endpoints whose address is unchanged). `peer_addresses` is indexed by
  // rank and has size() entries (this rank's own entry is ignored: it uses its own address).
  // INVALID_ARGUMENT when the count is wrong; UNAVAILABLE naming peer_transport_addresses[i]
  // and the peer when an address is missing, damaged, foreign or cannot be connected to.
  absl::Status BeginJob(const std::string& job_id, const std::vector<std::string>& peer_addresses);

  std::string_view Name() const override { return "ucx"; }
  int rank() const override;
  int size() const override;
  absl::StatusOr<std::unique_ptr<PendingGroup>> Post(std::span<const TransportMessage> sends,
                                                    std::span<const TransportMessage> recvs,
                                                    void* ready_stream) override;
  void Abort() override;
  int64_t bytes_sent() const override;
  int64_t bytes_received() const override;
  // Per-peer byte counters (for the dfa_transport_* metrics' `peer` label).
  std::vector<int64_t> bytes_sent_per_peer() const;
  std::vector<int64_t> bytes_received_per_peer() const;

  class Impl;

 private:
  explicit UcxTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dfa
