#include "tests/fault/hostile_util.h"

#include <dirent.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "core/planner/plan_proto.h"
#include "core/planner/planner.h"
#include "core/session_capability.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"

namespace dfa::testing {

std::unique_ptr<client::LocalCluster> StartCluster(int workers,
                                                   std::vector<std::string> coordinator_args,
                                                   std::vector<std::string> worker_args) {
  client::LocalClusterOptions o;
  o.workers = workers;
  o.threads_per_worker = 1;
  o.coordinator_args = std::move(coordinator_args);
  o.worker_args = std::move(worker_args);
  o.start_timeout = absl::Seconds(30);
  auto cluster = client::LocalCluster::Start(o);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? std::move(*cluster) : nullptr;
}

int ProcThreads(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(f, line)) {
    int n = 0;
    if (std::sscanf(line.c_str(), "Threads: %d", &n) == 1) return n;
  }
  return -1;
}

int ProcFds(pid_t pid) {
  DIR* d = opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}

std::unique_ptr<grpc::ClientContext> Ctx(absl::Duration timeout, const std::string& capability) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!capability.empty()) AttachCapability(ctx.get(), capability);
  return ctx;
}

std::unique_ptr<v1::Worker::Stub> WorkerStub(const std::string& address) {
  return v1::Worker::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

std::unique_ptr<v1::Coordinator::Stub> CoordinatorStub(const std::string& address) {
  return v1::Coordinator::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

v1::AttentionSpec SmallSpec(int64_t seq_len) {
  v1::AttentionSpec s;
  s.set_batch(1);
  s.set_q_heads(2);
  s.set_kv_heads(1);
  s.set_head_dim(16);
  s.set_seq_len(seq_len);
  s.set_causal(true);
  s.set_dtype(v1::DTYPE_F32);
  return s;
}

v1::Plan ProtoPlan(int workers, int64_t seq_len, bool causal, const std::string& schedule) {
  PlanRequest r;
  r.schedule = schedule;
  r.workers = workers;
  r.seq_len = seq_len;
  r.causal = causal;
  auto plan = MakePlan(r);
  EXPECT_TRUE(plan.ok()) << plan.status();
  v1::Plan p;
  if (plan.ok()) PlanToProto(*plan, &p);
  return p;
}

v1::OpenSessionRequest OpenRequest(const std::string& session_id, const v1::AttentionSpec& spec,
                                   const v1::Plan& plan, int rank,
                                   const std::vector<std::string>& addresses,
                                   const std::string& client_id) {
  v1::OpenSessionRequest r;
  r.set_session_id(session_id);
  *r.mutable_spec() = spec;
  r.set_rank(rank);
  *r.mutable_plan() = plan;
  r.set_client_id(client_id);
  for (size_t i = 0; i < addresses.size(); ++i) {
    v1::PeerInfo* p = r.add_peers();
    p->set_rank(static_cast<int>(i));
    p->set_worker_id(absl::StrCat("worker-", i));
    p->set_address(addresses[i]);
  }
  return r;
}

double GetStatusMs(const std::string& coordinator) {
  auto stub = CoordinatorStub(coordinator);
  v1::ClusterStatus st;
  const absl::Time t0 = absl::Now();
  if (!stub->GetStatus(Ctx(absl::Seconds(30)).get(), v1::GetStatusRequest(), &st).ok()) {
    return -1;
  }
  return absl::ToDoubleMilliseconds(absl::Now() - t0);
}

}  // namespace dfa::testing
