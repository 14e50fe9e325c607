// Daemons one by one, for the fault tests that kill, stop and restart them: a dfa-coordinator
// on a loopback port fixed at its first start (so that it can be killed and started again on
// the same address) and dfa-worker daemons by index (worker-<i>, each on its own port, which a
// restart keeps). Each process of a worker logs to its own file (<log_dir>/worker-<i>.<n>.log),
// so a test can wait for what one process printed.
//
// Binaries: $DFA_BIN_DIR when set, else this build tree (client::LocalCluster::FindBinary).
// Calls to the coordinator carry "authorization: Bearer <token>" when a token is given.
// Thread safety: none (one owner, the test). Destruction stops every process.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/child_process.h"
#include "client/client.h"
#include "core/status.h"
#include "dfa/v1/coordinator.grpc.pb.h"
#include "grpcpp/client_context.h"

namespace dfa::testing {

class Daemons {
 public:
  static absl::StatusOr<std::unique_ptr<Daemons>> Create();
  ~Daemons();

  // Starts dfa-coordinator --listen=127.0.0.1:<port> <args> and returns once it answers
  // GetStatus. listening_at() is when its port first accepted a TCP connection.
  absl::Status StartCoordinator(std::vector<std::string> args, const std::string& token = "");
  void KillCoordinator();  // SIGKILL, reaped
  client::ChildProcess* coordinator() { return coordinator_.get(); }
  const std::string& coordinator_address() const { return coordinator_address_; }
  absl::Time listening_at() const { return listening_at_; }

  // Starts worker `index`: --listen/--advertise 127.0.0.1:<its port> --coordinator=...
  // --worker_id=worker-<index> --backend=cpu --threads=1 <args>. Does not wait.
  absl::Status StartWorker(int index, std::vector<std::string> args = {});
  void KillWorker(int index);  // SIGKILL, reaped
  // The next start of worker `index` takes a new port (a worker that moved).
  absl::Status MoveWorker(int index);
  client::ChildProcess* worker(int index) { return workers_.at(index).get(); }
  std::string worker_address(int index) const;
  // True once the running process of worker `index` printed `needle`, polled until `timeout`.
  bool WaitForWorkerLog(int index, const std::string& needle, absl::Duration timeout);

  // ListWorkers through a channel made at the coordinator's last start.
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers(const std::string& token = "");
  // Polls ListWorkers every 10 ms until `n` workers are listed alive.
  absl::Status WaitForWorkers(int n, absl::Duration timeout, const std::string& token = "");
  v1::Coordinator::Stub* stub() { return stub_.get(); }
  const std::string& log_dir() const { return log_dir_; }

 private:
  Daemons() = default;

  std::string coordinator_bin_, worker_bin_, log_dir_;
  int coordinator_port_ = 0;
  std::string coordinator_address_;
  absl::Time listening_at_ = absl::InfinitePast();
  std::unique_ptr<client::ChildProcess> coordinator_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::map<int, std::unique_ptr<client::ChildProcess>> workers_;
  std::map<int, int> worker_ports_;
  std::map<int, int> worker_starts_;
};

// A client context with a deadline `timeout` from now and, when `token` is set, the metadata
// "authorization: Bearer <token>".
std::unique_ptr<grpc::ClientContext> Context(const std::string& token = "",
                                             absl::Duration timeout = absl::Seconds(10));

// The small causal fp32 spec the registration and recovery tests run (S = 256, 2/1 heads).
v1::AttentionSpec SmallSpec();

// A client of `d`'s coordinator (with `token` as its bearer token when set); nullptr, with a
// test failure recorded, when it cannot connect.
std::unique_ptr<client::Client> ConnectClient(const Daemons& d, const std::string& token = "");

// A session of SmallSpec() on `n` workers (0: all) whose inputs the workers generate from
// `seed`, with one forward job run.
absl::StatusOr<std::unique_ptr<client::Session>> SessionWithForward(client::Client* c, int n,
                                                                    uint64_t seed);

}  // namespace dfa::testing
