// The dfa-worker binary as a process (ready line, SIGTERM, bad flags) and its registration
// with a coordinator (a fake one here: lease, heartbeats, re-registration on NOT_FOUND).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "core/planner/plan_proto.h"
#include "core/planner/planner.h"
#include "dfa/v1/coordinator.grpc.pb.h"
#include "dfa/v1/worker.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "worker/worker_daemon.h"

namespace dfa {
namespace {

// Registers workers; answers one heartbeat with NOT_FOUND when `forget` is set, as a restarted
// coordinator would.
class FakeCoordinator final : public v1::Coordinator::Service {
 public:
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest* req,
                              v1::RegisterWorkerResponse* resp) override {
    last_id = req->worker_id();
    last_address = req->address();
    has_ucx = !req->transports().empty() && req->transports(0) == "ucx";
    ++registrations;
    resp->set_lease_ms(150);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse* resp) override {
    ++heartbeats;
    if (forget.exchange(false)) return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown worker");
    resp->set_lease_ms(150);
    return grpc::Status::OK;
  }
  std::atomic<int> registrations{0}, heartbeats{0};
  std::atomic<bool> forget{false};
  std::string last_id, last_address;
  bool has_ucx = false;
};

TEST(WorkerDaemonTest, RegistersHeartbeatsAndRegistersAgainAfterNotFound) {
  FakeCoordinator fake;
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&fake);
  auto server = b.BuildAndStart();
  ASSERT_TRUE(server && port > 0);

  WorkerOptions o;
  o.coordinator = "127.0.0.1:" + std::to_string(port);
  o.worker_id = "w-test";
  o.threads = 1;
  auto d = WorkerDaemon::Start(o);
  ASSERT_TRUE(d.ok()) << d.status();
  for (int i = 0; i < 100 && fake.heartbeats < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(fake.registrations.load(), 1);
  // A session is open when the coordinator forgets us: it is dropped (its memory freed).
  auto stub = v1::Worker::NewStub(
      grpc::CreateChannel((*d)->address(), grpc::InsecureChannelCredentials()));
  v1::OpenSessionRequest open;
  open.set_session_id("s1");
  open.mutable_spec()->set_batch(1);
  open.mutable_spec()->set_q_heads(1);
  open.mutable_spec()->set_kv_heads(1);
  open.mutable_spec()->set_head_dim(8);
  open.mutable_spec()->set_seq_len(16);
  open.mutable_spec()->set_dtype(v1::DTYPE_F32);
  open.mutable_spec()->set_causal(true);
  PlanRequest pr;
  pr.workers = 1;
  pr.seq_len = 16;
  PlanToProto(*MakePlan(pr), open.mutable_plan());
  {
    grpc::ClientContext ctx;
    v1::OpenSessionResponse resp;
    ASSERT_TRUE(stub->OpenSession(&ctx, open, &resp).ok());
  }
  fake.forget = true;
  for (int i = 0; i < 100 && fake.registrations < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  {
    grpc::ClientContext ctx;
    v1::CloseSessionRequest close;
    close.set_session_id("s1");
    v1::CloseSessionResponse resp;
    EXPECT_EQ(stub->CloseSession(&ctx, close, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  EXPECT_EQ(fake.registrations.load(), 2);
  EXPECT_GE(fake.heartbeats.load(), 3);
  EXPECT_EQ(fake.last_id, "w-test");
  EXPECT_EQ(fake.last_address, (*d)->address());
  EXPECT_TRUE(fake.has_ucx);
  (*d)->Shutdown();
  const int beats = fake.heartbeats;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(fake.heartbeats.load(), beats) << "heartbeats after Shutdown";
  server->Shutdown();
}

TEST(WorkerDaemonTest, RejectsBadOptionsNamingThem) {
  WorkerOptions o;
  o.listen = "nonsense";
  EXPECT_NE(WorkerDaemon::Start(o).status().message().find("listen"), std::string::npos);
  o = WorkerOptions{};
  o.threads = -1;
  EXPECT_NE(WorkerDaemon::Start(o).status().message().find("threads"), std::string::npos);
  o = WorkerOptions{};
  o.backend = "abacus";
  EXPECT_NE(WorkerDaemon::Start(o).status().message().find("backend"), std::string::npos);
  o = WorkerOptions{};
  o.speed = 0;
  EXPECT_NE(WorkerDaemon::Start(o).status().message().find("speed"), std::string::npos);
  // A device memory limit is for GPU workers; a cpu worker refuses it, naming it.
  o = WorkerOptions{};
  o.device_memory_limit = "0.5";
  absl::Status st = WorkerDaemon::Start(o).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("device_memory_limit"), std::string::npos) << st;
  o.device_memory_limit = "lots";
  st = WorkerDaemon::Start(o).status();
  EXPECT_NE(st.message().find("device_memory_limit = 'lots'"), std::string::npos) << st;
}

// Runs the real binary: prints its ready line, exits 0 on SIGTERM.
TEST(WorkerDaemonTest, BinaryPrintsReadyLineAndStopsOnSigterm) {
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(out[1], 1);
    close(out[0]);
    execl(DFA_WORKER_BINARY, DFA_WORKER_BINARY, "--listen=127.0.0.1:0", "--threads=1",
          "--worker_id=proc-w", "--metrics_port=0", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  FILE* f = fdopen(out[0], "r");
  char line[512] = {0};
  ASSERT_NE(fgets(line, sizeof(line), f), nullptr);
  const std::string ready(line);
  EXPECT_EQ(ready.rfind("dfa-worker proc-w listening on 127.0.0.1:", 0), 0u) << ready;
  EXPECT_NE(ready.find("metrics on :"), std::string::npos) << ready;
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  int status = 0;
  for (int i = 0; i < 200; ++i) {
    if (waitpid(pid, &status, WNOHANG) == pid) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(WIFEXITED(status)) << "still running 10 s after SIGTERM";
  if (!WIFEXITED(status)) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  EXPECT_EQ(WEXITSTATUS(status), 0);
  fclose(f);
}

TEST(WorkerDaemonTest, BinaryExitsWithUsageErrorOnBadMemoryLimit) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl(DFA_WORKER_BINARY, DFA_WORKER_BINARY, "--memory_limit=lots",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2);
}

}  // namespace
}  // namespace dfa
