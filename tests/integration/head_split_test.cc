// Head-split sessions (schedule "heads", Ulysses-style: each worker holds ALL rows of a range of
// the heads) end to end on real processes: a coordinator and 2 or 3 CPU workers on loopback.
// The client scatters and gathers by (rows, heads) over gRPC streams and shared memory; forward
// and backward equal single-device attention; workers' seeded synthetic inputs are the same
// global tensors as a sequence-split session's.
#include <gtest/gtest.h>

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/shard_io.h"
#include "tests/integration/cluster_fixture.h"
#include "worker/synthetic_inputs.h"

namespace dfa::testing {
namespace {

constexpr auto kGrpc = client::TransferPath::kGrpc;
constexpr auto kShm = client::TransferPath::kSharedMemory;

// Opens a "heads" session and checks the coordinator really split the heads: more than one kv
// head range, the ranges of all shards covering every kv head (ValidatePlacement in
// CreateSession checks exactly-once coverage of every (token, head)).
void ExpectHeadSplitPlacement(client::Client* c, const v1::AttentionSpec& spec, int workers) {
  client::SessionOptions so;
  so.spec = spec;
  so.num_workers = workers;
  so.schedule = "heads";
  auto session = c->CreateSession(so);
  ASSERT_TRUE(session.ok()) << session.status();
  std::set<std::pair<int, int>> ranges;
  for (const v1::ShardPlacement& s : (*session)->info().shards()) {
    ranges.insert({s.kv_heads().begin(), s.kv_heads().end()});
    EXPECT_EQ(s.q_heads().end() - s.q_heads().begin(),
              (s.kv_heads().end() - s.kv_heads().begin()) * (spec.q_heads() / spec.kv_heads()));
  }
  EXPECT_GT(ranges.size(), 1u) << "schedule heads did not split the heads";
  EXPECT_TRUE((*session)->Release().ok());
}

struct Case {
  int workers;
  int q_heads, kv_heads;
  bool causal;
};

class HeadSplitTest : public ::testing::TestWithParam<Case> {};

TEST_P(HeadSplitTest, ForwardAndBackwardOverGrpcAndShmEqualSingleDeviceAttention) {
  const Case& c = GetParam();
  auto cluster = StartClusterOrSkip(c.workers);
  if (!cluster) GTEST_SKIP() << "dfa-coordinator / dfa-worker not built";
  auto client = client::Client::Connect(cluster->coordinator_address());
  ASSERT_TRUE(client.ok());
  const auto spec =
      MakeSpec(/*batch=*/2, /*seq=*/192, c.q_heads, c.kv_heads, /*head_dim=*/32, c.causal);
  ExpectHeadSplitPlacement(client->get(), spec, c.workers);
  const TrainingInputs in = RandomInputs(spec, 17 + c.workers);
  for (client::TransferPath path : {kGrpc, kShm}) {
    SCOPED_TRACE(path == kGrpc ? "grpc" : "shm");
    RunResult r = RunTraining(client->get(), spec, c.workers, "heads", in, path);
    EXPECT_EQ(r.num_workers, c.workers);
    EXPECT_EQ(r.forward.state(), v1::JOB_SUCCEEDED);
    EXPECT_EQ(r.backward.state(), v1::JOB_SUCCEEDED);
    ExpectMatchesReference(spec, in, r);
  }
  EXPECT_TRUE(cluster->Stop().ok());
}

std::string Name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return absl::StrCat("P", c.workers, "_Hq", c.q_heads, "_Hkv", c.kv_heads, "_",
                      c.causal ? "causal" : "full");
}

INSTANTIATE_TEST_SUITE_P(Cluster, HeadSplitTest,
                         ::testing::Values(Case{2, 4, 2, true},    // GQA, one kv head each
                                           Case{3, 6, 3, true},    // odd P
                                           Case{2, 6, 3, false}),  // unequal groups (2 + 1)
                         Name);

// Q, K, V, dO a session's workers generated from `seed`, gathered back through the data plane.
TrainingInputs Generated(client::Client* c, const v1::AttentionSpec& spec, int workers,
                         const std::string& schedule, uint64_t seed,
                         v1::CreateSessionResponse* info) {
  TrainingInputs out;
  client::SessionOptions so;
  so.spec = spec;
  so.num_workers = workers;
  so.schedule = schedule;
  auto session = c->CreateSession(so);
  EXPECT_TRUE(session.ok()) << session.status();
  if (!session.ok()) return out;
  EXPECT_TRUE((*session)->GenerateInputs(seed, /*with_grad_output=*/true).ok());
  client::TransferOptions grpc;
  grpc.path = kGrpc;
  for (auto [kind, t] : {std::pair{v1::TENSOR_Q, &out.q}, std::pair{v1::TENSOR_K, &out.k},
                         std::pair{v1::TENSOR_V, &out.v}, std::pair{v1::TENSOR_DO, &out.dout}}) {
    auto st = (*session)->Download(kind, t, grpc);
    EXPECT_TRUE(st.ok()) << st.status();
  }
  *info = (*session)->info();
  EXPECT_TRUE((*session)->Release().ok());
  return out;
}

TEST(HeadSplitInputsTest, SyntheticInputsAreTheGlobalTensorsOfASequenceSplitSession) {
  auto cluster = StartClusterOrSkip(2);
  if (!cluster) GTEST_SKIP() << "dfa-coordinator / dfa-worker not built";
  auto client = client::Client::Connect(cluster->coordinator_address());
  ASSERT_TRUE(client.ok());
  const auto spec = MakeSpec(/*batch=*/2, /*seq=*/64, 6, 2, 16, /*causal=*/true);
  v1::CreateSessionResponse heads_info, rows_info;
  const TrainingInputs heads = Generated(client->get(), spec, 2, "heads", 99, &heads_info);
  const TrainingInputs rows = Generated(client->get(), spec, 2, "balanced", 99, &rows_info);
  ASSERT_EQ(heads_info.shards_size(), 2);
  EXPECT_NE(heads_info.shards(0).kv_heads().begin(), heads_info.shards(1).kv_heads().begin());
  EXPECT_NE(rows_info.shards(0).owned(0).begin(), rows_info.shards(1).owned(0).begin());
  EXPECT_EQ(heads.q.bytes, rows.q.bytes);
  EXPECT_EQ(heads.k.bytes, rows.k.bytes);
  EXPECT_EQ(heads.v.bytes, rows.v.bytes);
  EXPECT_EQ(heads.dout.bytes, rows.dout.bytes);
  // And both are SyntheticValue of the global (row, head): here for K (kv heads) and Q.
  for (auto [kind, t] : {std::pair{v1::TENSOR_K, &heads.k}, std::pair{v1::TENSOR_Q, &heads.q}}) {
    client::HostTensor want = *client::MakeTensor(spec, kind);
    FillSynthetic(99, kind, spec.batch(), 0, spec.seq_len(), want.heads, spec.head_dim(),
                  want.dtype, want.data());
    EXPECT_EQ(t->bytes, want.bytes) << client::TensorKindName(kind);
  }
  // A forward on the generated inputs (what `dfa bench --schedule heads` runs) is attention.
  client::SessionOptions so;
  so.spec = spec;
  so.num_workers = 2;
  so.schedule = "heads";
  auto session = (*client)->CreateSession(so);
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE((*session)->GenerateInputs(99, false).ok());
  ASSERT_TRUE((*session)->Run(v1::JOB_FORWARD).ok());
  client::HostTensor o;
  ASSERT_TRUE((*session)->Download(v1::TENSOR_O, &o).ok());
  auto ref = client::ComputeReference(spec, heads.q, heads.k, heads.v, nullptr, 1);
  ASSERT_TRUE(ref.ok()) << ref.status();
  const client::Comparison cmp = client::Compare("O", o, ref->o);
  EXPECT_TRUE(cmp.ok) << cmp.ToString();
  EXPECT_TRUE((*session)->Release().ok());
  EXPECT_TRUE(cluster->Stop().ok());
}

}  // namespace
}  // namespace dfa::testing
