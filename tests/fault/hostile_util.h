// Helpers of the hostile-network fault tests (hostile_peer_test, shm_race_test, flood_test,
// fd_limit_test, fuzz_test): a LocalCluster of real daemons from this build (or $DFA_BIN_DIR),
// what /proc says about a daemon (threads, descriptors), direct Worker calls with a session's
// capability, and small specs and plans.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/local_cluster.h"
#include "dfa/v1/coordinator.grpc.pb.h"
#include "dfa/v1/worker.grpc.pb.h"
#include "grpcpp/client_context.h"

namespace dfa::testing {

// Starts a cluster of `workers` cpu workers (1 thread each); ADD_FAILURE and null on error.
std::unique_ptr<client::LocalCluster> StartCluster(int workers,
                                                   std::vector<std::string> coordinator_args = {},
                                                   std::vector<std::string> worker_args = {});

// /proc/<pid>/status Threads, and entries of /proc/<pid>/fd; -1 when the process is gone.
int ProcThreads(pid_t pid);
int ProcFds(pid_t pid);

// A context with a deadline and, when set, the session capability's metadata.
std::unique_ptr<grpc::ClientContext> Ctx(absl::Duration timeout = absl::Seconds(10),
                                         const std::string& capability = "");

std::unique_ptr<v1::Worker::Stub> WorkerStub(const std::string& address);
std::unique_ptr<v1::Coordinator::Stub> CoordinatorStub(const std::string& address);

// batch 1, 2 q heads, 1 kv head, head_dim 16, f32, causal.
v1::AttentionSpec SmallSpec(int64_t seq_len);
// The planner's plan for `workers` workers, as the coordinator sends it.
v1::Plan ProtoPlan(int workers, int64_t seq_len, bool causal, const std::string& schedule);

// An OpenSessionRequest for rank `rank` of a session on the workers at `addresses` (peers
// named worker-<i>).
v1::OpenSessionRequest OpenRequest(const std::string& session_id, const v1::AttentionSpec& spec,
                                   const v1::Plan& plan, int rank,
                                   const std::vector<std::string>& addresses,
                                   const std::string& client_id);

// Milliseconds of one GetStatus call from a fresh channel (or -1 on error).
double GetStatusMs(const std::string& coordinator);

}  // namespace dfa::testing
