// Hostile and broken peers, on real daemons over loopback: transport addresses that are damaged,
// foreign or junk never reach UCX (worker/transport/peer_address.h). A worker handed them in
// RunJob answers UNAVAILABLE naming the field and the peer and keeps serving; a fake worker whose
// OpenSession reply carries a junk address fails the session's job with UNAVAILABLE naming it,
// and the real workers it shared the session with survive and run the next job.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "fake_worker.h"
#include "tests/fault/hostile_util.h"

namespace dfa::testing {
namespace {

constexpr char kClient[] = "hostile-test";

// Opens session `id` directly on both workers (as the coordinator would) and fills its inputs;
// returns the two sealed transport addresses.
std::vector<std::string> OpenTwoRanks(client::LocalCluster* cluster,
                                      std::vector<std::unique_ptr<v1::Worker::Stub>>& stubs,
                                      const std::string& id, const v1::AttentionSpec& spec) {
  const v1::Plan plan = ProtoPlan(2, spec.seq_len(), true, "ring");
  const std::vector<std::string> addresses = {cluster->workers()[0].address,
                                              cluster->workers()[1].address};
  std::vector<std::string> transport(2);
  for (int r = 0; r < 2; ++r) {
    v1::OpenSessionResponse resp;
    grpc::Status s = stubs[r]->OpenSession(
        Ctx().get(), OpenRequest(id, spec, plan, r, addresses, kClient), &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    transport[r] = resp.transport_address();
    v1::GenerateInputsRequest gen;
    gen.set_session_id(id);
    gen.set_client_id(kClient);
    gen.set_seed(3);
    v1::GenerateInputsResponse gen_resp;
    s = stubs[r]->GenerateInputs(Ctx().get(), gen, &gen_resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  return transport;
}

grpc::Status RunJob(v1::Worker::Stub* stub, const std::string& session, const std::string& job,
                    const std::vector<std::string>& addresses) {
  v1::RunJobRequest req;
  req.set_session_id(session);
  req.set_job_id(job);
  req.set_kind(v1::JOB_FORWARD);
  for (const std::string& a : addresses) req.add_peer_transport_addresses(a);
  v1::WorkerJobStats stats;
  return stub->RunJob(Ctx(absl::Seconds(60)).get(), req, &stats);
}

TEST(HostilePeerTest, DamagedPeerAddressesAnswerUnavailableAndTheWorkerSurvives) {
  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  std::vector<std::unique_ptr<v1::Worker::Stub>> stubs;
  for (int r = 0; r < 2; ++r) stubs.push_back(WorkerStub(cluster->workers()[r].address));
  const std::vector<std::string> good = OpenTwoRanks(cluster.get(), stubs, "hp", SmallSpec(64));
  ASSERT_FALSE(good[0].empty());
  ASSERT_FALSE(good[1].empty());

  std::mt19937_64 rng(18);
  std::string junk(300, '\0');
  for (char& c : junk) c = static_cast<char>(rng());
  std::vector<std::pair<std::string, std::string>> damaged = {
      {"empty", ""},
      {"truncated", good[1].substr(0, good[1].size() / 2)},
      {"one byte", good[1].substr(0, 1)},
      {"extended", good[1] + std::string(40, 'x')},
      {"random junk", junk},
      {"64 KiB of 0xff", std::string(64 << 10, '\xff')},
      {"raw UCX bytes (no envelope)", good[1].substr(16)},
  };
  for (size_t pos : {size_t{0}, size_t{5}, size_t{9}, size_t{14}, size_t{16}, size_t{17},
                     good[1].size() / 2, good[1].size() - 1}) {
    std::string d = good[1];
    d[pos] = static_cast<char>(d[pos] ^ 0x41);
    damaged.emplace_back(absl::StrCat("byte ", pos, " flipped"), d);
  }
  int n = 0;
  for (const auto& [what, bad] : damaged) {
    // Rank 0 given a damaged rank-1 address, and rank 1 given a damaged rank-0 one.
    for (int r = 0; r < 2; ++r) {
      std::vector<std::string> addrs = good;
      addrs[1 - r] = bad;
      const grpc::Status s = RunJob(stubs[r].get(), "hp", absl::StrCat("bad-", n++), addrs);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << what << ": " << s.error_message();
      EXPECT_TRUE(absl::StrContains(s.error_message(),
                                    absl::StrCat("peer_transport_addresses[", 1 - r, "]")))
          << what << ": " << s.error_message();
      EXPECT_TRUE(absl::StrContains(s.error_message(), absl::StrCat("worker-", 1 - r)))
          << what << ": " << s.error_message();
      ASSERT_TRUE(cluster->worker_process(r)->Running())
          << "worker " << r << " died on a RunJob with a " << what << " peer address; log:\n"
          << cluster->worker_process(r)->LogTail(20);
    }
  }
  // A malformed request (the wrong number of addresses) stays INVALID_ARGUMENT.
  EXPECT_EQ(RunJob(stubs[0].get(), "hp", "count", {good[0], good[1], good[1]}).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // Both workers still serve: the real job runs on the real addresses.
  grpc::Status results[2];
  std::thread t0([&] { results[0] = RunJob(stubs[0].get(), "hp", "good", good); });
  std::thread t1([&] { results[1] = RunJob(stubs[1].get(), "hp", "good", good); });
  t0.join();
  t1.join();
  EXPECT_TRUE(results[0].ok()) << results[0].error_message();
  EXPECT_TRUE(results[1].ok()) << results[1].error_message();
  EXPECT_TRUE(cluster->Stop().ok()) << "logs in " << cluster->log_dir();
}

TEST(HostilePeerTest, AFakeWorkerWithAJunkAddressFailsTheJobWithUnavailableNamingIt) {
  auto cluster = StartCluster(2, {"--lease_ms=1000"});
  ASSERT_NE(cluster, nullptr);
  // Registers like a worker, answers OpenSession with junk (no envelope; its first byte is no
  // UCX address version, on which ucp_address_unpack aborts the process should it ever see it)
  // and holds RunJob until cancelled. Its memory makes placement pick it first.
  FakeWorkerOptions fo;
  fo.id = "fake-worker";
  fo.transport_address = std::string("\x05\x00\xff junk from a fake worker", 26);
  fo.memory_limit_bytes = int64_t{1} << 50;
  fo.block_runs = true;
  auto fake = std::make_unique<FakeWorker>(fo);
  fake->Start(cluster->coordinator_address());
  auto c = client::Client::Connect(cluster->client_options());
  ASSERT_TRUE(c.ok()) << c.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    auto list = (*c)->ListWorkers();
    if (list.ok() && list->workers_size() == 3) break;
    absl::SleepFor(absl::Milliseconds(20));
  }

  client::SessionOptions so;
  so.spec = SmallSpec(96);
  so.num_workers = 3;
  auto session = (*c)->CreateSession(so);
  ASSERT_TRUE(session.ok()) << session.status();
  bool placed_on_fake = false;
  for (const v1::ShardPlacement& shard : (*session)->info().shards()) {
    if (shard.worker_id() == "fake-worker") {
      placed_on_fake = true;
      continue;
    }
    v1::GenerateInputsRequest gen;
    gen.set_session_id((*session)->id());
    gen.set_client_id((*c)->client_id());
    gen.set_seed(5);
    v1::GenerateInputsResponse resp;
    grpc::Status s = WorkerStub(shard.address())
                         ->GenerateInputs(Ctx(absl::Seconds(10), (*session)->capability()).get(),
                                          gen, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  ASSERT_TRUE(placed_on_fake);
  auto job = (*session)->Submit(v1::JOB_FORWARD);
  ASSERT_TRUE(job.ok()) << job.status();
  // The client library answers a failed job with its status.
  auto done = (*session)->Watch(job->job_id(), nullptr);
  ASSERT_FALSE(done.ok()) << "the job succeeded with a junk peer address";
  EXPECT_EQ(done.status().code(), absl::StatusCode::kUnavailable) << done.status();
  EXPECT_TRUE(absl::StrContains(done.status().message(), "fake-worker")) << done.status();
  auto final_state = (*c)->GetJob(job->job_id());
  ASSERT_TRUE(final_state.ok()) << final_state.status();
  EXPECT_EQ(final_state->state(), v1::JOB_FAILED);
  EXPECT_EQ(final_state->error_code(), static_cast<int>(grpc::StatusCode::UNAVAILABLE));
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(cluster->worker_process(i)->Running())
        << "worker " << i << " died on the fake worker's address; log:\n"
        << cluster->worker_process(i)->LogTail(20);
  }
  (void)(*session)->Release();

  // The fake leaves (its lease runs out); the real workers run a job.
  fake.reset();
  const absl::Time gone = absl::Now() + absl::Seconds(10);
  while (absl::Now() < gone) {
    auto list = (*c)->ListWorkers();
    if (list.ok() && list->workers_size() == 2) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  so.num_workers = 2;
  auto real = (*c)->CreateSession(so);
  ASSERT_TRUE(real.ok()) << real.status();
  ASSERT_TRUE((*real)->GenerateInputs(7, false).ok());
  auto ok = (*real)->Run(v1::JOB_FORWARD);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->state(), v1::JOB_SUCCEEDED) << ok->error_message();
  EXPECT_TRUE(cluster->Stop().ok()) << "logs in " << cluster->log_dir();
}

}  // namespace
}  // namespace dfa::testing
