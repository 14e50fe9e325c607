// Packed documents and sliding windows end to end on real processes: a coordinator and 1 or 3
// CPU workers on loopback. The spec's doc_offsets and window travel to the coordinator (which
// plans under the mask) and the workers (which build the interval arrays once per session and
// run every unit under them); forward and backward equal single-device attention under the
// same mask (client/verify.h), and differ from the dense mask's (the mask really applied).
// Documents of uneven lengths (1-token ones too) cross the shard boundaries of P = 3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/grpc_util.h"
#include "core/spec_validation.h"
#include "tests/integration/cluster_fixture.h"

namespace dfa::testing {
namespace {

struct Case {
  std::string name;
  int workers;
  std::string schedule;
  bool causal;
  int batch;
  std::vector<std::vector<int64_t>> docs;  // offsets, one row or one per batch row
  int64_t window_left, window_right;
  int q_heads = 4, kv_heads = 2;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

constexpr int64_t kSeq = 600;
// 1, 250, 1, 98, 250 tokens: boundaries at 1, 251, 252, 350 (shards of 3 workers cut elsewhere).
const std::vector<int64_t> kDocs = {0, 1, 251, 252, 350, 600};

v1::AttentionSpec SpecOf(const Case& c) {
  v1::AttentionSpec spec = MakeSpec(c.batch, kSeq, c.q_heads, c.kv_heads, /*head_dim=*/32,
                                    c.causal, v1::DTYPE_BF16);
  MaskSpec mask;
  mask.doc_offsets = c.docs;
  mask.window_left = c.window_left;
  mask.window_right = c.window_right;
  SetSpecMask(mask, &spec);
  return spec;
}

// Largest |a - b| over two fp32/bf16 tensors of one shape.
double MaxDiff(const client::HostTensor& a, const client::HostTensor& b) {
  double worst = 0;
  for (int64_t i = 0; i < a.elements(); ++i) {
    const double d = static_cast<double>(LoadAsFloat(a.data(), a.dtype, i)) -
                     static_cast<double>(LoadAsFloat(b.data(), b.dtype, i));
    worst = std::max(worst, std::fabs(d));
  }
  return worst;
}

class MaskedSessionTest : public ::testing::TestWithParam<Case> {};

TEST_P(MaskedSessionTest, ForwardAndBackwardEqualSingleDeviceAttentionUnderTheMask) {
  const Case& c = GetParam();
  auto cluster = StartClusterOrSkip(c.workers);
  if (!cluster) GTEST_SKIP() << "dfa-coordinator / dfa-worker not built";
  auto client = client::Client::Connect(cluster->coordinator_address());
  ASSERT_TRUE(client.ok());
  const v1::AttentionSpec spec = SpecOf(c);
  ASSERT_TRUE(ValidateSpec(spec, kNoSpecLimits).ok());
  ASSERT_EQ(MaskSpecOf(spec).Kind(), MaskKind::kIntervals);
  const TrainingInputs in = RandomInputs(spec, 31 + c.workers);
  RunResult r = RunTraining(client->get(), spec, c.workers, c.schedule, in);
  EXPECT_EQ(r.num_workers, c.workers);
  EXPECT_EQ(r.forward.state(), v1::JOB_SUCCEEDED);
  EXPECT_EQ(r.backward.state(), v1::JOB_SUCCEEDED);
  ExpectMatchesReference(spec, in, r);

  // The dense mask's output is far from the service's: the documents / window were applied.
  v1::AttentionSpec dense = spec;
  SetSpecMask(MaskSpec{}, &dense);
  auto ref = client::ComputeReference(dense, in.q, in.k, in.v, nullptr, 1);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_GT(MaxDiff(r.fwd.o, ref->o), 0.05);
  EXPECT_TRUE(cluster->Stop().ok());
}

INSTANTIATE_TEST_SUITE_P(
    Cluster, MaskedSessionTest,
    ::testing::Values(
        Case{"P1_docs_causal", 1, "balanced", true, 1, {kDocs}, -1, -1},
        Case{"P3_docs_causal", 3, "balanced", true, 1, {kDocs}, -1, -1},
        Case{"P3_docs_window_causal", 3, "balanced", true, 1, {kDocs}, 64, -1},
        Case{"P3_docs_window_full", 3, "balanced", false, 1, {kDocs}, 32, 16},
        Case{"P3_window_only_ring", 3, "ring", true, 1, {}, 100, -1},
        Case{"P3_per_row_docs_gqa", 3, "balanced", true, 2, {kDocs, {0, 300, 301, 600}}, -1, -1,
             8, 2}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// A bad mask never reaches a worker: CreateSession answers INVALID_ARGUMENT naming the field,
// through the library and straight to the coordinator (the rpc without the library): offsets
// not increasing, past seq_len (an inner one, the last one), more documents than the
// coordinator's --max_documents, negative windows.
TEST(MaskSpecRejected, CreateSessionNamesTheField) {
  auto cluster = StartClusterOrSkip(1, {"--max_documents=8"});
  if (!cluster) GTEST_SKIP() << "dfa-coordinator / dfa-worker not built";
  auto client = client::Client::Connect(cluster->coordinator_address());
  ASSERT_TRUE(client.ok());
  auto raw_create = [&](const v1::AttentionSpec& spec) {
    grpc::ClientContext ctx;
    client::SetDeadline(&ctx, absl::Seconds(10));
    v1::CreateSessionRequest req;
    *req.mutable_spec() = spec;
    req.set_client_id((*client)->client_id());
    v1::CreateSessionResponse resp;
    return client::FromGrpc((*client)->coordinator()->CreateSession(&ctx, req, &resp), "raw");
  };
  struct Bad {
    std::vector<int64_t> offsets;
    int64_t window_left, window_right;
    std::string message;
  };
  const std::vector<Bad> bad = {
      {{0, 80, 70, 600}, -1, -1,
       "spec.doc_offsets[0][2]: must be greater than doc_offsets[0][1] = 80, got 70"},
      {{0, 300, 700, 800}, -1, -1,
       "spec.doc_offsets[0][2]: must be less than seq_len = 600, got 700"},
      {{0, 300, 700}, -1, -1, "spec.doc_offsets[0][2]: must be seq_len = 600, got 700"},
      {{0, 60, 120, 180, 240, 300, 360, 420, 480, 600}, -1, -1,
       "spec.doc_offsets: must hold <= 8 documents in all (max_documents), got 9"},
      {{}, -3, -1, "spec.window_left: must be >= 0 (or -1: unbounded), got -3"},
      {{0, 100, 600}, 16, -7, "spec.window_right: must be >= 0 (or -1: unbounded), got -7"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.message);
    v1::AttentionSpec spec = MakeSpec(1, kSeq, 4, 2, 32, true, v1::DTYPE_BF16);
    if (!b.offsets.empty()) {
      v1::DocOffsets* row = spec.add_doc_offsets();
      for (int64_t o : b.offsets) row->add_offsets(o);
    }
    if (b.window_left != -1) spec.set_window_left(b.window_left);
    if (b.window_right != -1) spec.set_window_right(b.window_right);
    client::SessionOptions so;
    so.spec = spec;
    so.num_workers = 1;
    for (const absl::Status& s : {(*client)->CreateSession(so).status(), raw_create(spec)}) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_NE(s.message().find(b.message), std::string::npos) << s;
    }
  }
  // The worker holds no session: nothing was placed.
  auto status = (*client)->GetStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->sessions(), 0) << status->ShortDebugString();
  EXPECT_TRUE(cluster->Stop().ok());
}

}  // namespace
}  // namespace dfa::testing
