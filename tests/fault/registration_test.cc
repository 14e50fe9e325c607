// Registration under attack and misconfiguration: without (or with a wrong) worker token no
// process registers or heartbeats; a live worker's id cannot be taken over and its sessions and
// jobs keep working; an address the coordinator cannot reach is never registered, so sessions
// are placed on the reachable workers; a worker that restarts elsewhere gets its id back at
// once. Real processes on loopback (tests/fault/daemons.h); raw RegisterWorker calls play the
// rogue.
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/local_cluster.h"
#include "gtest/gtest.h"
#include "tests/fault/daemons.h"

namespace dfa::testing {
namespace {

constexpr int kLeaseMs = 900;
const std::string kLeaseFlag = absl::StrCat("--lease_ms=", kLeaseMs);
constexpr char kClientToken[] = "client-secret-1";
constexpr char kWorkerToken[] = "worker-secret-2";

// What a rogue sends: a well-formed registration of `id` at `address`.
v1::RegisterWorkerRequest Registration(const std::string& id, const std::string& address,
                                       const std::string& boot_id) {
  v1::RegisterWorkerRequest r;
  r.set_worker_id(id);
  r.set_address(address);
  r.set_host("localhost");
  r.set_backend("cpu");
  r.set_device("cpu");
  r.set_memory_limit_bytes(int64_t{1} << 30);
  r.set_speed(1.0);
  r.add_transports("ucx");
  r.set_boot_id(boot_id);
  return r;
}

grpc::Status Register(Daemons& d, const v1::RegisterWorkerRequest& r,
                      const std::string& token = "") {
  v1::RegisterWorkerResponse resp;
  return d.stub()->RegisterWorker(Context(token).get(), r, &resp);
}

// The listed entry of `id`, or an empty one.
v1::WorkerInfo Listed(Daemons& d, const std::string& id, const std::string& token = "") {
  auto list = d.ListWorkers(token);
  EXPECT_TRUE(list.ok()) << list.status();
  if (list.ok()) {
    for (const auto& w : list->workers()) {
      if (w.worker_id() == id) return w;
    }
  }
  return v1::WorkerInfo();
}

std::string WriteFile(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(dir, "/", name);
  std::ofstream(path) << text;
  return path;
}

TEST(RegistrationTest, OnlyTheWorkerTokenRegistersAndHeartbeats) {
  auto d = Daemons::Create();
  ASSERT_TRUE(d.ok()) << d.status();
  Daemons& daemons = **d;
  // Both daemons read the token from a file (with the trailing newline an editor leaves).
  const std::string token_file =
      WriteFile(daemons.log_dir(), "worker.token", absl::StrCat(kWorkerToken, "\n"));
  ASSERT_TRUE(daemons
                  .StartCoordinator({kLeaseFlag, absl::StrCat("--auth_token=", kClientToken),
                                     absl::StrCat("--worker_token_file=", token_file)},
                                    kClientToken)
                  .ok());
  ASSERT_TRUE(daemons.StartWorker(0, {absl::StrCat("--worker_token_file=", token_file)}).ok());
  // Worker 1 has the clients' token, worker 2 none: neither may join.
  ASSERT_TRUE(daemons.StartWorker(1, {absl::StrCat("--worker_token=", kClientToken)}).ok());
  ASSERT_TRUE(daemons.StartWorker(2).ok());
  ASSERT_TRUE(daemons.WaitForWorkers(1, absl::Seconds(20), kClientToken).ok());
  EXPECT_TRUE(daemons.WaitForWorkerLog(1, "worker token", absl::Seconds(10)))
      << daemons.worker(1)->LogTail(5);
  EXPECT_TRUE(daemons.WaitForWorkerLog(2, "worker token", absl::Seconds(10)))
      << daemons.worker(2)->LogTail(5);

  // A rogue registration at a reachable worker address (worker 1's server): refused without a
  // token, with the clients' token and with a wrong one.
  const v1::RegisterWorkerRequest rogue =
      Registration("rogue", daemons.worker_address(1), "0123456789abcdef0123456789abcdef");
  for (const std::string& token : {std::string(), std::string(kClientToken),
                                  std::string("worker-secret-3")}) {
    grpc::Status s = Register(daemons, rogue, token);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << "token '" << token << "'";
    EXPECT_TRUE(absl::StrContains(s.error_message(), "worker token")) << s.error_message();
  }
  // Heartbeats too: a stranger cannot keep worker-0's lease alive (or learn it is listed).
  v1::HeartbeatRequest hb;
  hb.set_worker_id("worker-0");
  v1::HeartbeatResponse hb_resp;
  EXPECT_EQ(daemons.stub()->Heartbeat(Context(kClientToken).get(), hb, &hb_resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  // The worker token is no client credential; the clients' token works.
  v1::ClusterStatus status;
  EXPECT_EQ(daemons.stub()
                ->GetStatus(Context(kWorkerToken).get(), v1::GetStatusRequest(), &status)
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(
      daemons.stub()->GetStatus(Context().get(), v1::GetStatusRequest(), &status).error_code(),
      grpc::StatusCode::UNAUTHENTICATED);
  ASSERT_TRUE(
      daemons.stub()->GetStatus(Context(kClientToken).get(), v1::GetStatusRequest(), &status).ok());
  EXPECT_EQ(status.live_workers(), 1);  // only worker-0: no rogue, no tokenless worker
  EXPECT_EQ(Listed(daemons, "worker-0", kClientToken).worker_id(), "worker-0");

  // A job runs on the one authenticated worker (num_workers 0: all live workers).
  auto c = ConnectClient(daemons, kClientToken);
  ASSERT_NE(c, nullptr);
  auto session = SessionWithForward(c.get(), 0, 5);
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ((*session)->num_workers(), 1);
}

TEST(RegistrationTest, CoordinatorRefusesAWorkerTokenEqualToTheClientToken) {
  auto d = Daemons::Create();
  ASSERT_TRUE(d.ok()) << d.status();
  absl::Status s = (*d)->StartCoordinator(
      {absl::StrCat("--auth_token=", kClientToken), absl::StrCat("--worker_token=", kClientToken)});
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), "--worker_token: must differ from --auth_token"))
      << s;
}

TEST(RegistrationTest, LiveWorkerIdCannotBeTakenOver) {
  auto d = Daemons::Create();
  ASSERT_TRUE(d.ok()) << d.status();
  Daemons& daemons = **d;
  ASSERT_TRUE(daemons.StartCoordinator({kLeaseFlag}).ok());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(daemons.StartWorker(i).ok());
  ASSERT_TRUE(daemons.WaitForWorkers(2, absl::Seconds(20)).ok());
  auto c = ConnectClient(daemons);
  ASSERT_NE(c, nullptr);
  auto session = SessionWithForward(c.get(), 2, 5);
  ASSERT_TRUE(session.ok()) << session.status();
  const v1::WorkerInfo before = Listed(daemons, "worker-1");
  ASSERT_EQ(before.address(), daemons.worker_address(1));

  // worker-1's id from another address, and from its own address with another boot id (the
  // real worker still answers for its own): both refused, naming the id.
  const std::string elsewhere = absl::StrCat("127.0.0.1:", *client::LocalCluster::FreePort());
  for (const std::string& address : {elsewhere, daemons.worker_address(1)}) {
    grpc::Status s =
        Register(daemons, Registration("worker-1", address, "feedfacefeedfacefeedfacefeedface"));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS) << address << ": "
                                                                 << s.error_message();
    EXPECT_TRUE(absl::StrContains(s.error_message(), "worker-1")) << s.error_message();
  }

  // Nothing of the real worker changed: for two leases it stays listed at its address under
  // the same registration (its heartbeats keep working), and its session runs another job.
  absl::SleepFor(absl::Milliseconds(2 * kLeaseMs));
  const v1::WorkerInfo after = Listed(daemons, "worker-1");
  EXPECT_TRUE(after.alive());
  EXPECT_EQ(after.address(), before.address());
  EXPECT_EQ(after.incarnation(), before.incarnation());
  auto job = (*session)->Run(v1::JOB_FORWARD);
  EXPECT_TRUE(job.ok()) << job.status();
  EXPECT_FALSE(absl::StrContains(daemons.worker(1)->LogTail(50), "does not know us"))
      << daemons.worker(1)->LogTail(10);
}

TEST(RegistrationTest, UnreachableAddressIsNotRegisteredAndSessionsUseTheLiveWorkers) {
  auto d = Daemons::Create();
  ASSERT_TRUE(d.ok()) << d.status();
  Daemons& daemons = **d;
  ASSERT_TRUE(daemons.StartCoordinator({kLeaseFlag}).ok());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(daemons.StartWorker(i).ok());
  ASSERT_TRUE(daemons.WaitForWorkers(2, absl::Seconds(20)).ok());

  // Nobody listens there: refused with a retryable code naming the address.
  const std::string nowhere = absl::StrCat("127.0.0.1:", *client::LocalCluster::FreePort());
  grpc::Status s = Register(daemons, Registration("ghost", nowhere, "00112233445566778899aabb"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), nowhere)) << s.error_message();
  // A gRPC server answers there, but it is not this worker (the coordinator's own port).
  s = Register(daemons,
               Registration("ghost", daemons.coordinator_address(), "00112233445566778899aabb"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "is not worker ghost")) << s.error_message();

  // Sessions over all live workers are placed on the two real ones and run.
  auto list = daemons.ListWorkers();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->workers_size(), 2);
  auto c = ConnectClient(daemons);
  ASSERT_NE(c, nullptr);
  auto session = SessionWithForward(c.get(), 0, 5);
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ((*session)->num_workers(), 2);
}

TEST(RegistrationTest, WorkerRestartedAtANewAddressGetsItsIdBackAtOnce) {
  auto d = Daemons::Create();
  ASSERT_TRUE(d.ok()) << d.status();
  Daemons& daemons = **d;
  // The default lease (3 s): the old entry is live when the worker comes back elsewhere (a
  // rescheduled pod with a stable name and a new address).
  ASSERT_TRUE(daemons.StartCoordinator({}).ok());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(daemons.StartWorker(i).ok());
  ASSERT_TRUE(daemons.WaitForWorkers(2, absl::Seconds(20)).ok());
  const v1::WorkerInfo before = Listed(daemons, "worker-1");

  daemons.KillWorker(1);
  ASSERT_TRUE(daemons.MoveWorker(1).ok());
  const absl::Time restarted = absl::Now();
  ASSERT_TRUE(daemons.StartWorker(1).ok());
  ASSERT_TRUE(daemons.WaitForWorkerLog(1, "registered with", absl::Seconds(20)))
      << daemons.worker(1)->LogTail(10);
  // Well before the old lease could run out: its old address no longer answers for it.
  EXPECT_LT(absl::Now() - restarted, absl::Milliseconds(2500));
  const v1::WorkerInfo after = Listed(daemons, "worker-1");
  EXPECT_EQ(after.address(), daemons.worker_address(1));
  EXPECT_NE(after.address(), before.address());
  EXPECT_GT(after.incarnation(), before.incarnation());
  auto c = ConnectClient(daemons);
  ASSERT_NE(c, nullptr);
  auto session = SessionWithForward(c.get(), 2, 5);
  EXPECT_TRUE(session.ok()) << session.status();
}

}  // namespace
}  // namespace dfa::testing
