#include "tests/integration/cluster_fixture.h"

namespace dfa::testing {

std::unique_ptr<client::LocalCluster> StartClusterOrSkip(int workers,
                                                         std::vector<std::string> coordinator_args) {
  client::LocalClusterOptions o;
  o.workers = workers;
  o.threads_per_worker = 1;
  o.coordinator_args = std::move(coordinator_args);
  o.start_timeout = absl::Seconds(20);
  auto cluster = client::LocalCluster::Start(o);
  if (cluster.status().code() == absl::StatusCode::kNotFound) {
    return nullptr;  // daemons not built: caller skips
  }
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? std::move(*cluster) : nullptr;
}

v1::AttentionSpec MakeSpec(int batch, int64_t seq, int q_heads, int kv_heads, int head_dim,
                           bool causal, v1::DType dtype) {
  v1::AttentionSpec s;
  s.set_batch(batch);
  s.set_seq_len(seq);
  s.set_q_heads(q_heads);
  s.set_kv_heads(kv_heads);
  s.set_head_dim(head_dim);
  s.set_causal(causal);
  s.set_dtype(dtype);
  return s;
}

TrainingInputs RandomInputs(const v1::AttentionSpec& spec, uint64_t seed) {
  TrainingInputs in;
  in.q = *client::MakeTensor(spec, v1::TENSOR_Q);
  in.k = *client::MakeTensor(spec, v1::TENSOR_K);
  in.v = *client::MakeTensor(spec, v1::TENSOR_V);
  in.dout = *client::MakeTensor(spec, v1::TENSOR_DO);
  client::FillRandom(seed * 4 + 0, &in.q);
  client::FillRandom(seed * 4 + 1, &in.k);
  client::FillRandom(seed * 4 + 2, &in.v);
  client::FillRandom(seed * 4 + 3, &in.dout);
  return in;
}

RunResult RunTraining(client::Client* c, const v1::AttentionSpec& spec, int num_workers,
                      const std::string& schedule, const TrainingInputs& in,
                      client::TransferPath path) {
  client::AttentionJobOptions o;
  o.session.spec = spec;
  o.session.num_workers = num_workers;
  o.session.schedule = schedule;
  o.transfer.path = path;
  o.max_retries = 0;
  client::AttentionJob job(c, o);
  RunResult r;
  auto fwd = job.Forward(in.q, in.k, in.v, &r.forward);
  EXPECT_TRUE(fwd.ok()) << fwd.status();
  if (!fwd.ok()) return r;
  r.fwd = std::move(*fwd);
  r.num_workers = job.session()->num_workers();
  auto bwd = job.Backward(in.dout, &r.backward);
  EXPECT_TRUE(bwd.ok()) << bwd.status();
  if (bwd.ok()) r.bwd = std::move(*bwd);
  EXPECT_TRUE(job.Release().ok());
  return r;
}

void ExpectMatchesReference(const v1::AttentionSpec& spec, const TrainingInputs& in,
                            const RunResult& r) {
  auto ref = client::ComputeReference(spec, in.q, in.k, in.v, &in.dout, /*threads=*/1);
  ASSERT_TRUE(ref.ok()) << ref.status();
  const std::vector<client::Comparison> checks = {
      client::Compare("O", r.fwd.o, ref->o),     client::Compare("LSE", r.fwd.lse, ref->lse),
      client::Compare("dQ", r.bwd.dq, ref->dq),  client::Compare("dK", r.bwd.dk, ref->dk),
      client::Compare("dV", r.bwd.dv, ref->dv)};
  for (const auto& c : checks) EXPECT_TRUE(c.ok) << c.ToString();
}

}  // namespace dfa::testing
