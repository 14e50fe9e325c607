// Coordinator.HoldLease as gRPC callback reactors: a client's lease stream costs a small object,
// not a thread (dfa/v1/coordinator.proto; the bookkeeping is coordinator/client_lease.h).
//
// Each stream reads one LeaseBeat at a time and answers it with a LeaseState: the first beat
// opens or re-attaches a lease (ClientLeases::Attach), later ones renew it (Beat), one with
// `close` ends it cleanly and the stream finishes OK. A stream that breaks (the client process
// died: TCP reset or FIN; the client cancelled it; a write failed) detaches its lease uncleanly,
// which starts the lease's grace; ClientLeases::Expire (the service's Tick) then releases its
// sessions. The reactors never release anything themselves and never block.
//
// Limits: at most `max_streams` streams at once (RESOURCE_EXHAUSTED beyond, naming
// --max_client_leases). Threads: the reactions run on gRPC's threads; Shutdown may be called
// from any thread. Lock order: the hub, then one stream, then ClientLeases. The hub must
// outlive the gRPC server's callbacks (CoordinatorServer shuts the server down before
// destroying the service).
#pragma once

#include <functional>
#include <mutex>
#include <set>

#include "coordinator/client_lease.h"
#include "dfa/v1/coordinator.pb.h"
#include "grpcpp/support/server_callback.h"

namespace dfa {

class LeaseStreamHub {
 public:
  // `reply` converts a stream's final absl::Status into the grpc::Status it finishes with (and
  // counts it), as the service's other handlers do.
  LeaseStreamHub(ClientLeases* leases, int max_streams,
                 std::function<grpc::Status(const absl::Status&)> reply);
  ~LeaseStreamHub();  // Shutdown()

  // The reactor of one HoldLease call; `admitted` not OK finishes it with that at once.
  grpc::ServerBidiReactor<v1::LeaseBeat, v1::LeaseState>* Start(const absl::Status& admitted);

  // Ends every open stream with UNAVAILABLE (leases are left as they are) and refuses new ones.
  void Shutdown();
  int streams() const;

  class Stream;

 private:
  void Remove(Stream* s);

  ClientLeases* const leases_;
  const int max_streams_;
  const std::function<grpc::Status(const absl::Status&)> reply_;
  mutable std::mutex mu_;
  std::set<Stream*> streams_;
  bool shut_down_ = false;
};

}  // namespace dfa
