// Coordinator.JoinClientGroup on a real coordinator over loopback gRPC with fake cuda workers
// (real gRPC servers, no GPU): the group it names, what each worker receives (its session rank,
// the group's size, id, secret and the client's NCCL id, the session's capability), refusals of
// a worker naming the worker, cpu sessions, other clients, missing capabilities.
#include <set>
#include <string>
#include <vector>

#include "coordinator_test_util.h"

namespace dfa::testing {
namespace {

class ClientGroupServiceTest : public CoordinatorFixture {
 protected:
  void AddCudaWorkers(int n, grpc::StatusCode join_code = grpc::StatusCode::OK) {
    for (int i = 0; i < n; ++i) {
      FakeWorkerOptions o;
      o.id = "gpu" + std::to_string(workers_.size());
      o.backend = "cuda";
      o.join_client_group_code = join_code;
      AddWorker(o);
    }
  }
  v1::CreateSessionResponse CudaSession(int workers) {
    v1::AttentionSpec spec = GoodSpec();
    spec.set_head_dim(128);
    v1::CreateSessionResponse created;
    EXPECT_TRUE(CreateWithSpec(spec, &created, workers).ok());
    return created;
  }
  grpc::Status Join(const std::string& session, v1::JoinClientGroupResponse* resp,
                    const std::string& client = "alice", bool with_capability = true) {
    v1::JoinClientGroupRequest req;
    req.set_session_id(session);
    req.set_client_id(client);
    req.set_nccl_unique_id(std::string(128, 'n'));
    req.set_init_timeout_ms(3000);
    auto ctx = with_capability ? SessionCtx(session) : Ctx();
    return stub_->JoinClientGroup(ctx.get(), req, resp);
  }
};

TEST_F(ClientGroupServiceTest, EveryWorkerIsAskedWithItsSessionRank) {
  StartCoordinator();
  AddCudaWorkers(2);
  const v1::CreateSessionResponse created = CudaSession(2);
  ASSERT_EQ(created.shards_size(), 2);
  v1::JoinClientGroupResponse group;
  const grpc::Status st = Join(created.session_id(), &group);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(group.client_rank(), 2);
  EXPECT_EQ(group.size(), 3);
  ASSERT_EQ(group.workers_size(), 2);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(group.workers(r).rank(), r);
    EXPECT_EQ(group.workers(r).worker_id(), created.shards(r).worker_id());
    EXPECT_EQ(group.workers(r).address(), created.shards(r).address());
  }
  std::set<int> ranks;
  for (int i = 0; i < 2; ++i) {
    const std::vector<v1::WorkerJoinClientGroupRequest> joins = workers_[i]->client_group_joins();
    ASSERT_EQ(joins.size(), 1u) << workers_[i]->id();
    const v1::WorkerJoinClientGroupRequest& j = joins[0];
    EXPECT_EQ(j.group_id(), group.group_id());
    EXPECT_EQ(j.group_secret(), group.group_secret());
    EXPECT_EQ(j.size(), 3);
    EXPECT_EQ(j.nccl_unique_id(), std::string(128, 'n'));
    EXPECT_EQ(j.init_timeout_ms(), 3000);
    EXPECT_EQ(j.session_id(), created.session_id());
    EXPECT_EQ(j.client_id(), "alice");
    EXPECT_EQ(j.expires_unix_ms(), group.expires_unix_ms());
    // The worker's rank in the group is its rank in the session.
    EXPECT_EQ(created.shards(j.rank()).worker_id(), workers_[i]->id());
    ranks.insert(j.rank());
    EXPECT_EQ(workers_[i]->last_join_capability(), created.session_capability());
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1}));
}

TEST_F(ClientGroupServiceTest, AWorkersRefusalIsReturnedNamingTheWorker) {
  StartCoordinator();
  AddCudaWorkers(1, grpc::StatusCode::FAILED_PRECONDITION);
  const v1::CreateSessionResponse created = CudaSession(1);
  v1::JoinClientGroupResponse group;
  const grpc::Status st = Join(created.session_id(), &group);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_NE(st.error_message().find("worker gpu0 (rank 0"), std::string::npos)
      << st.error_message();
  EXPECT_NE(st.error_message().find("fake worker refuses the group"), std::string::npos)
      << st.error_message();
}

TEST_F(ClientGroupServiceTest, OtherClientsAndMissingCapabilitiesAreRefused) {
  StartCoordinator();
  AddCudaWorkers(1);
  const v1::CreateSessionResponse cuda = CudaSession(1);
  v1::JoinClientGroupResponse group;
  EXPECT_EQ(Join(cuda.session_id(), &group, "mallory").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Join(cuda.session_id(), &group, "alice", /*with_capability=*/false).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(workers_[0]->client_group_joins().empty());
}

TEST_F(ClientGroupServiceTest, CpuSessionsAreRefusedNamingTheSession) {
  StartCoordinator();
  AddCpuWorkers(2);
  v1::CreateSessionResponse cpu;
  ASSERT_TRUE(CreateWithSpec(GoodSpec(), &cpu, 2).ok());
  v1::JoinClientGroupResponse group;
  const grpc::Status st = Join(cpu.session_id(), &group);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_NE(st.error_message().find("session_id = " + cpu.session_id()), std::string::npos)
      << st.error_message();
  EXPECT_NE(st.error_message().find("not NCCL"), std::string::npos) << st.error_message();
  for (auto& w : workers_) EXPECT_TRUE(w->client_group_joins().empty());
}

}  // namespace
}  // namespace dfa::testing
