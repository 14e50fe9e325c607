// Rematerialisation-aware backward (the paper's third idea), proven from the outside: the
// backward job receives ONLY dO from the client, and no forward kernel runs during it. Counted
// twice: by the client (bytes it sent) and by the workers' own Prometheus counters
// (dfa_worker_client_bytes_total, dfa_worker_kernel_launches_total; docs/metrics.md).
#include <gtest/gtest.h>

#include "tests/integration/cluster_fixture.h"
#include "tests/integration/metrics_scrape.h"

namespace dfa::testing {
namespace {

struct Counters {
  double upload_bytes = 0;
  double forward_launches = 0;
  double backward_launches = 0;
};

Counters Scrape(client::LocalCluster* cluster) {
  Counters c;
  for (const auto& w : cluster->workers()) {
    auto body = ScrapeMetrics(w.metrics_port);
    EXPECT_TRUE(body.ok()) << body.status();
    if (!body.ok()) continue;
    EXPECT_NE(body->find("dfa_worker_client_bytes_total"), std::string::npos) << *body;
    EXPECT_NE(body->find("dfa_worker_kernel_launches_total"), std::string::npos) << *body;
    c.upload_bytes += SumMetric(*body, "dfa_worker_client_bytes_total", {{"direction", "upload"}});
    c.forward_launches +=
        SumMetric(*body, "dfa_worker_kernel_launches_total", {{"op", "forward"}});
    c.backward_launches +=
        SumMetric(*body, "dfa_worker_kernel_launches_total", {{"op", "backward"}});
  }
  return c;
}

TEST(RematerialisationTest, BackwardReceivesOnlyDoAndNeverRecomputesForward) {
  auto cluster = StartClusterOrSkip(2);
  if (!cluster) GTEST_SKIP() << "dfa-coordinator / dfa-worker not built";
  auto c = client::Client::Connect(cluster->coordinator_address());
  ASSERT_TRUE(c.ok());
  const auto spec = MakeSpec(1, 256, 4, 2, 32, /*causal=*/true);
  const TrainingInputs in = RandomInputs(spec, 9);
  const Counters before = Scrape(cluster.get());

  client::AttentionJobOptions o;
  o.session.spec = spec;
  o.session.num_workers = 2;
  o.transfer.path = client::TransferPath::kGrpc;
  o.max_retries = 0;
  client::AttentionJob job(c->get(), o);
  v1::Job fwd_job, bwd_job;
  auto fwd = job.Forward(in.q, in.k, in.v, &fwd_job);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  const int64_t sent_forward = job.bytes_uploaded();
  const Counters after_forward = Scrape(cluster.get());

  auto bwd = job.Backward(in.dout, &bwd_job);
  ASSERT_TRUE(bwd.ok()) << bwd.status();
  const int64_t sent_backward = job.bytes_uploaded() - sent_forward;
  const Counters after_backward = Scrape(cluster.get());

  // The client sent Q, K, V for the forward, and dO alone for the backward.
  EXPECT_EQ(sent_forward, in.q.size_bytes() + in.k.size_bytes() + in.v.size_bytes());
  EXPECT_EQ(sent_backward, in.dout.size_bytes());
  // The workers agree on what they received from the client.
  EXPECT_EQ(after_forward.upload_bytes - before.upload_bytes, static_cast<double>(sent_forward));
  EXPECT_EQ(after_backward.upload_bytes - after_forward.upload_bytes,
            static_cast<double>(in.dout.size_bytes()));
  // The forward ran forward kernels; the backward ran backward kernels and no forward one.
  EXPECT_GT(after_forward.forward_launches, before.forward_launches);
  EXPECT_GT(after_backward.backward_launches, after_forward.backward_launches);
  EXPECT_EQ(after_backward.forward_launches, after_forward.forward_launches)
      << "the backward job re-ran forward units";
  // The job's own stats count kernel launches too.
  int64_t bwd_launches = 0;
  for (const auto& w : bwd_job.workers()) bwd_launches += w.kernel_launches();
  EXPECT_GT(bwd_launches, 0);
  // (It may also count delta and merge launches, so it is at least the backward ones.)
  EXPECT_GE(static_cast<double>(bwd_launches),
            after_backward.backward_launches - after_forward.backward_launches);

  // And the gradients are right.
  RunResult r;
  r.fwd = std::move(*fwd);
  r.bwd = std::move(*bwd);
  ExpectMatchesReference(spec, in, r);
}

}  // namespace
}  // namespace dfa::testing
