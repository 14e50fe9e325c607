// dfa-coordinator --max_documents (SpecLimits::max_documents) on real daemons: a spec with more
// packed documents than the flag allows (all batch rows together) is INVALID_ARGUMENT naming
// spec.doc_offsets and the flag, through the library and straight to the coordinator; one at
// the limit runs a forward+backward that matches single-device attention; a bad flag value
// stops the coordinator at start naming the flag.
#include <gtest/gtest.h>

#include "client/grpc_util.h"
#include "core/spec_validation.h"
#include "tests/integration/cluster_fixture.h"

namespace dfa::testing {
namespace {

// `docs` documents per batch row of 16 tokens each, per-row offsets.
v1::AttentionSpec PackedSpec(int batch, int docs) {
  v1::AttentionSpec spec = MakeSpec(batch, 16 * docs, 2, 2, 16, true);
  for (int b = 0; b < batch; ++b) {
    v1::DocOffsets* row = spec.add_doc_offsets();
    for (int d = 0; d <= docs; ++d) row->add_offsets(16 * d);
  }
  return spec;
}

absl::Status RawCreate(client::Client* c, const v1::AttentionSpec& spec) {
  grpc::ClientContext ctx;
  client::SetDeadline(&ctx, absl::Seconds(10));
  v1::CreateSessionRequest req;
  *req.mutable_spec() = spec;
  req.set_client_id(c->client_id());
  v1::CreateSessionResponse resp;
  return client::FromGrpc(c->coordinator()->CreateSession(&ctx, req, &resp), "raw");
}

TEST(DocumentLimitTest, OverTheFlagIsInvalidArgumentNamingFieldAndFlag) {
  auto cluster = StartClusterOrSkip(2, {"--max_documents=6"});
  if (!cluster) GTEST_SKIP() << "dfa-coordinator / dfa-worker not built";
  auto c = client::Client::Connect(cluster->coordinator_address());
  ASSERT_TRUE(c.ok()) << c.status();

  // 2 rows x 4 documents = 8 > 6: refused by the coordinator (the library applies no limits).
  const v1::AttentionSpec over = PackedSpec(2, 4);
  ASSERT_TRUE(ValidateSpec(over, kNoSpecLimits).ok());
  client::SessionOptions o;
  o.spec = over;
  o.num_workers = 2;
  for (const absl::Status& s : {(*c)->CreateSession(o).status(), RawCreate(c->get(), over)}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("spec.doc_offsets"), std::string::npos) << s;
    EXPECT_NE(s.message().find("max_documents"), std::string::npos) << s;
    EXPECT_NE(s.message().find("<= 6"), std::string::npos) << s;
    EXPECT_NE(s.message().find("got 8"), std::string::npos) << s;
  }

  // 2 rows x 3 documents = 6: at the limit, accepted and computed under the mask.
  const v1::AttentionSpec at = PackedSpec(2, 3);
  const TrainingInputs in = RandomInputs(at, 7);
  RunResult r = RunTraining(c->get(), at, 2, "balanced", in);
  ExpectMatchesReference(at, in, r);
  EXPECT_DOUBLE_EQ(r.forward.flops(), SpecForwardFlops(at)) << r.forward.ShortDebugString();
  EXPECT_TRUE(cluster->Stop().ok());
}

TEST(DocumentLimitTest, DefaultAllowsAMillionDocuments) {
  SpecLimits defaults;
  EXPECT_EQ(defaults.max_documents, int64_t{1} << 20);
  auto cluster = StartClusterOrSkip(1);
  if (!cluster) GTEST_SKIP() << "dfa-coordinator / dfa-worker not built";
  auto c = client::Client::Connect(cluster->coordinator_address());
  ASSERT_TRUE(c.ok()) << c.status();
  // 8 documents: far below the default; the same spec the flag above refuses is fine here.
  client::SessionOptions o;
  o.spec = PackedSpec(2, 4);
  o.num_workers = 1;
  auto s = (*c)->CreateSession(o);
  EXPECT_TRUE(s.ok()) << s.status();
}

TEST(DocumentLimitTest, BadFlagStopsTheCoordinatorNamingIt) {
  for (const char* bad : {"--max_documents=0", "--max_documents=-3"}) {
    SCOPED_TRACE(bad);
    client::LocalClusterOptions o;
    o.workers = 1;
    o.coordinator_args = {bad};
    o.start_timeout = absl::Seconds(20);
    auto cluster = client::LocalCluster::Start(o);
    if (cluster.status().code() == absl::StatusCode::kNotFound) {
      GTEST_SKIP() << "dfa-coordinator / dfa-worker not built";
    }
    ASSERT_FALSE(cluster.ok());
    EXPECT_NE(cluster.status().message().find("--max_documents: must be >= 1"), std::string::npos)
        << cluster.status();
  }
}

}  // namespace
}  // namespace dfa::testing
