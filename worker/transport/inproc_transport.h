// InprocTransport: P endpoints in one process that share an InprocHub; for tests and the
// simulator (a thread per worker). Messages between a pair of endpoints are matched in posting
// order (across groups too, as NCCL does); a send whose receive is not posted yet waits in the
// hub (the sender's buffer must stay valid until its group completes, as for every transport).
// A size mismatch between a matched send and receive fails both groups with INTERNAL.
// Thread-safe: endpoints may be used from different threads concurrently.
#pragma once

#include <memory>

#include "core/transport.h"

namespace dfa {

class InprocHub;

// Creates the hub for `size` endpoints (size >= 1).
absl::StatusOr<std::shared_ptr<InprocHub>> CreateInprocHub(int size);
// Endpoint `rank` of the hub (0 <= rank < size); the hub is kept alive by its endpoints.
absl::StatusOr<std::unique_ptr<Transport>> CreateInprocTransport(std::shared_ptr<InprocHub> hub,
                                                                 int rank);
// Aborts every endpoint of the hub (what a lost peer looks like to the others).
void AbortInprocHub(InprocHub& hub);

}  // namespace dfa
