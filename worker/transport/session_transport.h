// The worker-to-worker transport of one session, as the daemon sees it: created at
// OpenSession (its address goes back to the coordinator), readied for each job with the peers'
// addresses, aborted by CancelJob. One implementation per transport, chosen by a capability
// check (like NCCL's transports): "ucx" for host-memory backends (cpu), "nccl" for cuda
// backends when the worker is built with NCCL. "inproc" exists only inside one process
// (inproc_transport.h) and is never offered by the daemon.
// Threads: Abort may be called from any thread; the rest from the session's job thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"
#include "dfa/v1/worker.pb.h"
#include "core/transport.h"

namespace dfa {

class SessionTransport {
 public:
  virtual ~SessionTransport() = default;
  virtual std::string_view Name() const = 0;
  // Bytes for OpenSessionResponse.transport_address.
  virtual const std::string& address() const = 0;
  // The transport for job `job_id`, connected to `peer_addresses` (RunJobRequest, by rank).
  // INVALID_ARGUMENT for a wrong number of addresses; UNAVAILABLE naming
  // peer_transport_addresses[i] and the peer for a damaged, foreign or unreachable address
  // (peer_address.h); DEADLINE_EXCEEDED when the peers cannot be reached within `timeout`.
  virtual absl::StatusOr<Transport*> ForJob(const std::string& job_id,
                                            const std::vector<std::string>& peer_addresses,
                                            absl::Duration timeout) = 0;
  // Fails the running job's transfers with CANCELLED (thread-safe).
  virtual void Abort() = 0;
  // Per-peer byte counters since the session opened (for metrics; empty when unknown).
  virtual std::vector<int64_t> BytesSentPerPeer() const = 0;
  virtual std::vector<int64_t> BytesReceivedPerPeer() const = 0;
  // Seconds the GPU's compute stream stood waiting for this transport's data since the last
  // call, measured on the device (with no host synchronisation the executor's host clocks see
  // none of it). < 0 when the transport cannot tell: then the executor's figures are right.
  virtual double TakeDeviceIdleSeconds() { return -1; }
};

// "worker-1 at host:port" per rank from OpenSessionRequest.peers ("" where a rank is not
// listed), for errors that name a peer.
std::vector<std::string> PeerNames(const v1::OpenSessionRequest& request);

// Transports this worker can offer for `backend` ("cpu", "cuda"), best first; what the worker
// reports in RegisterWorkerRequest.transports.
std::vector<std::string> SupportedTransports(std::string_view backend);

// Creates the session's transport. `request.transport` empty picks the first supported one.
// INVALID_ARGUMENT naming `transport` when this worker cannot provide the one asked for.
absl::StatusOr<std::unique_ptr<SessionTransport>> CreateSessionTransport(
    std::string_view backend, const v1::OpenSessionRequest& request, int cuda_device);

}  // namespace dfa
