// The packed-document plan (core/planner/document_schedule.cc) on live sessions: a coordinator
// and P = 3 or 4 CPU workers on loopback, a batch row of packed documents of mixed lengths (one
// long document crossing the shards, short ones, 1-token ones), schedule "balanced".
//  - The plan the session got (CreateSessionResponse.plan) is the planner's answer for the
//    request the coordinator builds (MakeSessionPlan: profile cpu, the spec's mask), and has
//    the packed-document layout: the long document striped over >= 2 workers, each owning a
//    front range of it and that range's mirror, the short documents around it; not the
//    contiguous shards of a sequence plan (nor zigzag's mirror around the sequence's middle).
//  - Forward and backward equal single-device attention under the mask (client/verify.h, the
//    whole tensors) and the fp64 reference (kernels/reference; per document, long ones at
//    sampled query blocks).
//  - With a sliding window the document plan does not apply (DocumentPlanApplies): the session
//    gets the contiguous shards of equal visible pairs, and is exact too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/planner/plan_coalescing.h"
#include "core/planner/plan_proto.h"
#include "core/planner/planner.h"
#include "core/spec_validation.h"
#include "google/protobuf/util/message_differencer.h"
#include "kernels/reference/reference_attention.h"
#include "tests/integration/cluster_fixture.h"

namespace dfa::testing {
namespace {

using Layout = std::vector<std::vector<RowRange>>;  // owned ranges per worker, merged

struct Case {
  std::string name;
  int workers;
  std::vector<int64_t> lengths;  // document lengths, summing to the sequence
  int64_t window_left = -1;
  bool document_plan = true;  // whether "balanced" must pick the packed-document plan
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<int64_t> Offsets(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> off = {0};
  for (int64_t l : lengths) off.push_back(off.back() + l);
  return off;
}

v1::AttentionSpec SpecOf(const Case& c) {
  const std::vector<int64_t> off = Offsets(c.lengths);
  v1::AttentionSpec spec = MakeSpec(/*batch=*/1, off.back(), /*q_heads=*/2, /*kv_heads=*/1,
                                    /*head_dim=*/16, /*causal=*/true, v1::DTYPE_F32);
  MaskSpec mask;
  mask.doc_offsets = {off};
  mask.window_left = c.window_left;
  SetSpecMask(mask, &spec);
  return spec;
}

// The request MakeSessionPlan (coordinator/session_plan.cc) builds for cpu workers of speed 1.
PlanRequest SessionRequest(const v1::AttentionSpec& spec, int workers) {
  PlanRequest r;
  r.schedule = "balanced";
  r.workers = workers;
  r.seq_len = spec.seq_len();
  r.causal = spec.causal();
  r.speeds.assign(workers, 1.0);
  r.mask_spec = MaskSpecOf(spec);
  return r;
}

std::vector<RowRange> Merged(std::vector<RowRange> ranges) {
  std::sort(ranges.begin(), ranges.end(),
            [](const RowRange& a, const RowRange& b) { return a.begin < b.begin; });
  std::vector<RowRange> out;
  for (const RowRange& r : ranges) {
    if (r.size() <= 0) continue;
    if (!out.empty() && out.back().end == r.begin) {
      out.back().end = r.end;
    } else {
      out.push_back(r);
    }
  }
  return out;
}

Layout LayoutOf(const Plan& plan) {
  Layout out;
  for (const WorkerPlan& w : plan.workers) out.push_back(Merged(w.owned));
  return out;
}

Layout LayoutOf(const v1::Plan& plan) {
  Layout out;
  for (const v1::WorkerPlan& w : plan.workers()) {
    std::vector<RowRange> owned;
    for (const v1::RowRange& r : w.owned()) owned.push_back(RowRange{r.begin(), r.end()});
    out.push_back(Merged(owned));
  }
  return out;
}

// The workers holding rows of `doc` when every one of them holds a front range of it and that
// range's mirror (front and back meet in the middle one: a single range centred in `doc`), at
// least one of them both ranges: the striped ring inside the document. 0 when not so.
int StripedWorkers(const Layout& layout, const RowRange& doc) {
  int holders = 0;
  bool two_ranges = false;
  for (const std::vector<RowRange>& owned : layout) {
    std::vector<RowRange> in;
    for (const RowRange& r : owned) {
      const RowRange cut{std::max(r.begin, doc.begin), std::min(r.end, doc.end)};
      if (cut.size() > 0) in.push_back(cut);
    }
    if (in.empty()) continue;
    ++holders;
    const RowRange front = in.front(), back = in.back();
    if (in.size() > 2 || front.begin - doc.begin != doc.end - back.end) return 0;
    if (in.size() == 2) {
      if (front.end - doc.begin != doc.end - back.begin) return 0;
      two_ranges = true;
    }
  }
  return two_ranges ? holders : 0;
}

std::string Format(const Layout& layout) {
  std::string s;
  for (size_t w = 0; w < layout.size(); ++w) {
    absl::StrAppend(&s, " w", w, ":");
    for (const RowRange& r : layout[w]) absl::StrAppend(&s, " [", r.begin, ",", r.end, ")");
  }
  return s;
}

// Max |got - want| / (atol + rtol |want|) of one element, folded into `worst`.
void Fold(double got, double want, double atol, double rtol, double* worst) {
  if (std::isinf(want) && got == want) return;
  *worst = std::max(*worst, std::fabs(got - want) / (atol + rtol * std::fabs(want)));
}

// Forward and backward against the fp64 reference (kernels/reference), one document at a time
// (attention never crosses a document: each is a problem of its own, causal, the window at its
// local positions). Documents up to kWholeRows tokens whole; in longer ones (the reference's
// O(n^2) loops would take tens of seconds) O, LSE and dQ of query blocks at its start, middle
// and end (other workers' rows each), against all of its keys; their dK and dV are left to
// ExpectMatchesReference. Tolerances as the simulator's (tests/worker/executor/
// simulation_test_util.h): O and LSE 1e-5 + 1e-4 relative, gradients 1e-4 + 1e-3.
void ExpectMatchesFp64(const v1::AttentionSpec& spec, const std::vector<int64_t>& off,
                       const TrainingInputs& in, const RunResult& r) {
  constexpr int64_t kWholeRows = 2048, kBlockRows = 64;
  const int hq = spec.q_heads(), hkv = spec.kv_heads(), d = spec.head_dim();
  const int64_t seq = spec.seq_len();
  auto f32 = [](const client::HostTensor& t) {
    return reinterpret_cast<const float*>(t.data());
  };
  ASSERT_EQ(r.fwd.o.elements(), seq * hq * d);
  ASSERT_EQ(r.bwd.dk.elements(), seq * hkv * d);
  double o = 0, lse = 0, dq = 0, dk = 0, dv = 0;
  int64_t rows_checked = 0;
  for (size_t doc = 0; doc + 1 < off.size(); ++doc) {
    const int64_t b = off[doc], n = off[doc + 1] - b;
    const bool whole = n <= kWholeRows;
    std::vector<int64_t> starts = {0};  // query blocks: [start, start + m) of the document
    if (!whole) starts = {0, n / 2 - kBlockRows / 2, n - kBlockRows};
    const int64_t m = whole ? n : kBlockRows;
    MaskSpec local;
    local.causal = spec.causal();
    local.window_left = spec.has_window_left() ? spec.window_left() : -1;
    for (const int64_t q0 : starts) {
      reference::Problem pr;
      pr.q = in.q.View().Slice(b + q0, m);
      pr.k = in.k.View().Slice(b, n);
      pr.v = in.v.View().Slice(b, n);
      pr.q_row0 = q0;
      pr.mask = local.Kind();
      pr.spec = &local;
      pr.seq = n;
      pr.scale = 1.0 / std::sqrt(static_cast<double>(d));
      absl::StatusOr<reference::ForwardResult> fwd = reference::Forward(pr);
      ASSERT_TRUE(fwd.ok()) << fwd.status();
      absl::StatusOr<reference::Gradients> g =
          reference::Backward(pr, in.dout.View().Slice(b + q0, m));
      ASSERT_TRUE(g.ok()) << g.status();
      for (int64_t i = 0; i < m; ++i) {
        const int64_t row = b + q0 + i;
        for (int h = 0; h < hq; ++h) {
          Fold(f32(r.fwd.lse)[h * seq + row], fwd->lse[h * m + i], 1e-5, 1e-4, &lse);
          for (int e = 0; e < d; ++e) {
            const int64_t at = (row * hq + h) * d + e, local_at = (i * hq + h) * d + e;
            Fold(f32(r.fwd.o)[at], fwd->out[local_at], 1e-5, 1e-4, &o);
            Fold(f32(r.bwd.dq)[at], g->dq[local_at], 1e-4, 1e-3, &dq);
          }
        }
      }
      rows_checked += m;
      if (!whole) continue;
      for (int64_t i = 0; i < n; ++i) {
        for (int h = 0; h < hkv; ++h) {
          for (int e = 0; e < d; ++e) {
            const int64_t at = ((b + i) * hkv + h) * d + e, local_at = (i * hkv + h) * d + e;
            Fold(f32(r.bwd.dk)[at], g->dk[local_at], 1e-4, 1e-3, &dk);
            Fold(f32(r.bwd.dv)[at], g->dv[local_at], 1e-4, 1e-3, &dv);
          }
        }
      }
    }
  }
  EXPECT_GT(rows_checked, 0);
  EXPECT_LE(o, 1.0) << "O";
  EXPECT_LE(lse, 1.0) << "LSE";
  EXPECT_LE(dq, 1.0) << "dQ";
  EXPECT_LE(dk, 1.0) << "dK";
  EXPECT_LE(dv, 1.0) << "dV";
}

// Forward + backward through AttentionJob, keeping the session's CreateSessionResponse.
struct SessionRun {
  RunResult result;
  v1::CreateSessionResponse info;
};

SessionRun RunSession(client::Client* c, const v1::AttentionSpec& spec, int workers,
               const TrainingInputs& in) {
  client::AttentionJobOptions o;
  o.session.spec = spec;
  o.session.num_workers = workers;
  o.session.schedule = "balanced";
  o.max_retries = 0;
  client::AttentionJob job(c, o);
  SessionRun run;
  auto fwd = job.Forward(in.q, in.k, in.v, &run.result.forward);
  EXPECT_TRUE(fwd.ok()) << fwd.status();
  if (!fwd.ok()) return run;
  run.result.fwd = std::move(*fwd);
  run.result.num_workers = job.session()->num_workers();
  run.info = job.session()->info();
  auto bwd = job.Backward(in.dout, &run.result.backward);
  EXPECT_TRUE(bwd.ok()) << bwd.status();
  if (bwd.ok()) run.result.bwd = std::move(*bwd);
  EXPECT_TRUE(job.Release().ok());
  return run;
}

class DocumentPlanSessionTest : public ::testing::TestWithParam<Case> {};

TEST_P(DocumentPlanSessionTest, SessionRunsThePlanTheMaskCallsFor) {
  const Case& c = GetParam();
  const v1::AttentionSpec spec = SpecOf(c);
  ASSERT_TRUE(ValidateSpec(spec, kNoSpecLimits).ok());
  const std::vector<int64_t> off = Offsets(c.lengths);
  const auto longest = std::max_element(c.lengths.begin(), c.lengths.end()) - c.lengths.begin();
  const RowRange long_doc{off[longest], off[longest + 1]};
  const PlanRequest request = SessionRequest(spec, c.workers);
  ASSERT_EQ(DocumentPlanApplies(request), c.window_left < 0);

  auto cluster = StartClusterOrSkip(c.workers);
  if (!cluster) GTEST_SKIP() << "dfa-coordinator / dfa-worker not built";
  auto client = client::Client::Connect(cluster->coordinator_address());
  ASSERT_TRUE(client.ok()) << client.status();
  const TrainingInputs in = RandomInputs(spec, 5 + c.workers);
  const SessionRun run = RunSession(client->get(), spec, c.workers, in);
  const v1::Plan& got = run.info.plan();
  ASSERT_EQ(got.workers_size(), c.workers);
  EXPECT_EQ(got.schedule(), "balanced");
  for (const v1::WorkerPlan& w : got.workers()) EXPECT_FALSE(w.has_kv_heads());  // no head groups

  // The session's plan is the planner's for the coordinator's request, coalesced as it does.
  absl::StatusOr<Plan> planned = MakePlan(request);
  ASSERT_TRUE(planned.ok()) << planned.status();
  v1::Plan want;
  PlanToProto(CoalesceTransfers(*planned, ShapeOf(spec)), &want);
  std::string diff;
  google::protobuf::util::MessageDifferencer differ;
  differ.ReportDifferencesToString(&diff);
  EXPECT_TRUE(differ.Compare(want, got)) << diff;

  const Layout layout = LayoutOf(got);
  const Layout contiguous = LayoutOf(MakeSpeedProportionalPlan(request));
  if (c.document_plan) {
    // The packed-document layout: the long document striped over >= 2 workers of its own ring
    // (mirrored around the document's middle, not the sequence's as zigzag's); the contiguous
    // shards of a sequence plan are not.
    EXPECT_GE(StripedWorkers(layout, long_doc), 2) << Format(layout);
    EXPECT_EQ(StripedWorkers(contiguous, long_doc), 0) << Format(contiguous);
    EXPECT_NE(layout, contiguous) << Format(layout);
  } else {
    // Windowed: the contiguous shards of equal visible pairs, one range per worker.
    EXPECT_EQ(layout, contiguous) << Format(layout) << " vs" << Format(contiguous);
    EXPECT_EQ(StripedWorkers(layout, long_doc), 0) << Format(layout);
  }

  EXPECT_EQ(run.result.num_workers, c.workers);
  EXPECT_EQ(run.result.forward.state(), v1::JOB_SUCCEEDED);
  EXPECT_EQ(run.result.backward.state(), v1::JOB_SUCCEEDED);
  EXPECT_DOUBLE_EQ(run.result.forward.flops(), SpecForwardFlops(spec));
  ExpectMatchesReference(spec, in, run.result);
  ExpectMatchesFp64(spec, off, in, run.result);
  EXPECT_TRUE(cluster->Stop().ok());
}

// Causal, one long document (10240 of 12288 tokens; 12000 of 16384) crossing the shards, short
// ones around it and two 1-token ones. Profile cpu picks the packed-document plan for these
// mixes; the first one scaled down to S = 9216 (P = 3), or on P = 4, gets a sequence plan
// instead (the cost model's 20 us per message outweighs the long document's compute at the
// reference shape): docs/planner.md, "What sessions get".
INSTANTIATE_TEST_SUITE_P(
    Cluster, DocumentPlanSessionTest,
    ::testing::Values(Case{"P3_documents", 3, {37, 1, 10240, 500, 1, 1200, 309}},
                      Case{"P4_documents", 4, {300, 1, 12000, 2000, 1, 1796, 286}},
                      Case{"P3_documents_window", 3, {37, 1, 10240, 500, 1, 1200, 309}, 2048,
                           /*document_plan=*/false}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace dfa::testing
