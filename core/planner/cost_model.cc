#include "core/planner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dfa {
namespace {

struct Message {
  int from, to;
  double post_send, post_recv;
  int64_t bytes;
  int target = 0;  // the step whose computes wait for it
};

PassCost EstimatePass(const Plan& plan, const CostParams& p, const std::vector<double>& speeds,
                      bool fwd) {
  // Ranks (plan.h "Virtual ranks"; = workers without rank_workers) run the steps; workers hold
  // the speeds and the links. Without rank_workers every worker runs one rank, share 1.
  const int P = plan.num_workers();
  const int W = plan.physical_workers();
  auto host = [&](int r) { return plan.WorkerOfRank(r); };
  const double unit = std::pow(static_cast<double>(plan.seq_len) / W, 2);
  const UnitPairs pairs_of(plan);
  // Each rank's figures at its own heads (plan.h "Head groups"; all heads without a range).
  std::vector<AttentionShape> local(P);
  for (int w = 0; w < P; ++w) local[w] = LocalShape(p.shape, plan.workers[w]);
  size_t steps = 0;
  for (const WorkerPlan& w : plan.workers) steps = std::max(steps, (fwd ? w.forward : w.backward).size());
  PassCost cost;
  cost.steps = static_cast<int>(steps);
  cost.workers.resize(W);
  double total_compute = 0, total_speed = 0, compute_bound = 0;
  for (int w = 0; w < W; ++w) total_speed += speeds[w];
  // pure[r][t]: seconds of rank r's step-t FLOPs at speed 1; extra[r][t]: its per-op and merge
  // seconds (not scaled by speed).
  std::vector<std::vector<double>> pure(P, std::vector<double>(steps, 0)), extra = pure;
  std::vector<double> worker_pure(W, 0), worker_extra(W, 0);
  for (int w = 0; w < P; ++w) {
    const auto& pass = fwd ? plan.workers[w].forward : plan.workers[w].backward;
    const AttentionShape& s = local[w];
    const double flops_per_pair = 4.0 * s.batch * s.q_heads * s.head_dim * (fwd ? 1.0 : 2.5);
    // Work units count all heads' pairs: a worker with a share of the heads does that share.
    const double head_share = static_cast<double>(s.q_heads) / p.shape.q_heads;
    // Seconds of fp32 accumulate traffic per query row and per key/value row of one op (read +
    // write); 0 without a memory bandwidth.
    double merge_per_q_row = 0, merge_per_kv_row = 0;
    if (p.memory_bandwidth_bytes_per_second > 0) {
      const double b = s.batch, hd = static_cast<double>(s.head_dim);
      // Forward: output + LSE merged; backward: dQ added (dK/dV below).
      const double q_bytes = b * s.q_heads * (fwd ? hd + 1 : hd) * 4;
      const double kv_bytes = fwd ? 0 : 2 * b * s.kv_heads * hd * 4;
      merge_per_q_row = 2 * q_bytes / p.memory_bandwidth_bytes_per_second;
      merge_per_kv_row = 2 * kv_bytes / p.memory_bandwidth_bytes_per_second;
    }
    WorkerCost& wc = cost.workers[host(w)];
    for (size_t t = 0; t < pass.size(); ++t) {
      for (const ComputeOp& c : pass[t].computes) {
        const double pairs = pairs_of(c.q_rows, c.kv_rows);
        const double seconds = pairs * flops_per_pair / p.flops_per_second;
        total_compute += seconds;
        pure[w][t] += seconds;
        extra[w][t] += p.op_overhead_seconds +
                       merge_per_q_row * static_cast<double>(c.q_rows.size()) +
                       merge_per_kv_row * static_cast<double>(c.kv_rows.size());
        wc.work_units += pairs * head_share / unit;
        ++wc.compute_ops;
      }
      worker_pure[host(w)] += pure[w][t];
      worker_extra[host(w)] += extra[w][t];
    }
  }
  // A worker runs its ranks in lock-step: its step t is the step-t computes of all its ranks,
  // one after another. compute[w][t]: seconds of worker w's step t.
  std::vector<std::vector<double>> compute(W, std::vector<double>(steps, 0));
  for (int r = 0; r < P; ++r) {
    for (size_t t = 0; t < steps; ++t) {
      compute[host(r)][t] += pure[r][t] / speeds[host(r)] + extra[r][t];
    }
  }
  for (int w = 0; w < W; ++w) {
    compute_bound = std::max(compute_bound, worker_pure[w] / speeds[w] + worker_extra[w]);
  }
  cost.ideal_seconds = total_compute / total_speed;

  // Per worker: step t-1's compute start / end, its two links, and when the partials of the
  // previous step are done (waited for before this step).
  std::vector<double> start_prev(W, 0), end_prev(W, 0);
  std::vector<double> out_free(W, 0), in_free(W, 0);
  std::vector<double> partials_done(W, 0);
  // Runs `msgs` (between ranks) over their workers' links in posting order; returns when each
  // worker's share is done, and (by_target) when each worker's messages for each step are.
  auto transmit = [&](std::vector<Message>& msgs, std::vector<std::vector<double>>* by_target) {
    std::sort(msgs.begin(), msgs.end(), [](const Message& a, const Message& b) {
      return std::max(a.post_send, a.post_recv) < std::max(b.post_send, b.post_recv);
    });
    std::vector<double> ready(W, 0);
    for (const Message& m : msgs) {
      const int from = host(m.from), to = host(m.to);
      double begin = std::max(m.post_send, m.post_recv);
      double done = begin;
      if (p.bandwidth_bytes_per_second > 0) {
        const double wire = static_cast<double>(m.bytes) / p.bandwidth_bytes_per_second;
        begin = std::max({begin, out_free[from], in_free[to]});
        done = begin + p.latency_seconds + wire;
        out_free[from] = in_free[to] = begin + wire;
      }
      ready[from] = std::max(ready[from], done);
      ready[to] = std::max(ready[to], done);
      if (by_target != nullptr) {
        (*by_target)[m.target][from] = std::max((*by_target)[m.target][from], done);
        (*by_target)[m.target][to] = std::max((*by_target)[m.target][to], done);
      }
      cost.workers[from].bytes_sent += m.bytes;
      cost.workers[to].bytes_received += m.bytes;
    }
    return ready;
  };
  // Non-partial sends by the step whose compute start posts them: bucket[p + 1] for post step
  // p = t - 1 - lead (-1: at time 0). With every lead 0 that is step t's sends at step t - 1.
  struct Posted {
    int from;
    const Transfer* x;
    int target;
  };
  std::vector<std::vector<Posted>> bucket(steps + 1);
  for (int w = 0; w < P; ++w) {
    const auto& pass = fwd ? plan.workers[w].forward : plan.workers[w].backward;
    for (size_t t = 0; t < pass.size(); ++t) {
      for (const Transfer& x : pass[t].sends) {
        if (IsPartial(x.tensor)) continue;
        const int post = std::max(-1, static_cast<int>(t) - 1 - x.lead);
        bucket[post + 1].push_back({w, &x, static_cast<int>(t)});
      }
    }
  }
  // arrive[t][w]: when worker w's non-partial messages for step t are done.
  std::vector<std::vector<double>> arrive(steps, std::vector<double>(W, 0));
  for (size_t t = 0; t < steps; ++t) {
    // Messages posted at step t-1's compute start (non-partials for step t, and for later steps
    // by their lead); partials of step t (sends and recvs, one later group) at step t-1's end;
    // step 0: at time 0. Partials of step t are waited for before step t+1, so they overlap
    // step t's compute.
    std::vector<Message> early, late;
    for (const Posted& m : bucket[t]) {
      early.push_back({m.from, m.x->peer, t == 0 ? 0 : start_prev[host(m.from)],
                       t == 0 ? 0 : start_prev[host(m.x->peer)],
                       TransferBytes(local[m.from], m.x->tensor, m.x->rows.size()), m.target});
    }
    for (int w = 0; w < P; ++w) {
      const auto& pass = fwd ? plan.workers[w].forward : plan.workers[w].backward;
      if (t >= pass.size()) continue;
      for (const Transfer& x : pass[t].sends) {
        if (!IsPartial(x.tensor)) continue;
        const int64_t bytes = TransferBytes(local[w], x.tensor, x.rows.size());
        late.push_back({w, x.peer, t == 0 ? 0 : end_prev[host(w)],
                        t == 0 ? 0 : end_prev[host(x.peer)], bytes, static_cast<int>(t)});
      }
    }
    (void)transmit(early, &arrive);
    const std::vector<double> late_done = transmit(late, nullptr);
    for (int w = 0; w < W; ++w) {
      WorkerCost& wc = cost.workers[w];
      const double start = std::max({end_prev[w], arrive[t][w], partials_done[w]});
      const double idle = start - end_prev[w];
      wc.idle_seconds += idle;
      wc.busy_seconds += compute[w][t];
      wc.step_idle_seconds.push_back(idle);
      wc.step_busy_seconds.push_back(compute[w][t]);
      start_prev[w] = start;
      end_prev[w] = start + compute[w][t];
      wc.end_seconds = end_prev[w];
    }
    partials_done = late_done;
  }
  // The last step's partials are merged at the end of the pass.
  for (int w = 0; w < W; ++w) {
    WorkerCost& wc = cost.workers[w];
    if (partials_done[w] > wc.end_seconds) {
      wc.idle_seconds += partials_done[w] - wc.end_seconds;
      if (!wc.step_idle_seconds.empty()) wc.step_idle_seconds.back() += partials_done[w] - wc.end_seconds;
      wc.end_seconds = partials_done[w];
    }
  }
  for (const WorkerCost& wc : cost.workers) {
    cost.makespan_seconds = std::max(cost.makespan_seconds, wc.end_seconds);
  }
  for (WorkerCost& wc : cost.workers) wc.idle_seconds += cost.makespan_seconds - wc.end_seconds;
  if (cost.ideal_seconds > 0) {
    cost.makespan_ratio = cost.makespan_seconds / cost.ideal_seconds;
    cost.compute_makespan_ratio = compute_bound / cost.ideal_seconds;
  } else {
    cost.makespan_ratio = cost.compute_makespan_ratio = 1;
  }
  return cost;
}

}  // namespace

absl::StatusOr<PlanCost> EstimateCost(const Plan& plan, const CostParams& params) {
  std::vector<double> speeds = params.speeds;
  if (speeds.empty()) speeds.assign(plan.physical_workers(), 1.0);
  if (static_cast<int>(speeds.size()) != plan.physical_workers()) {
    return absl::InvalidArgumentError(absl::StrCat("speeds: ", speeds.size(), " values for ",
                                                   plan.physical_workers(), " workers"));
  }
  for (size_t i = 0; i < speeds.size(); ++i) {
    if (!(speeds[i] > 0) || !std::isfinite(speeds[i])) {
      return absl::InvalidArgumentError(absl::StrCat("speeds[", i, "] must be positive"));
    }
  }
  if (!(params.flops_per_second > 0)) {
    return absl::InvalidArgumentError("flops_per_second must be positive");
  }
  if (params.bandwidth_bytes_per_second < 0 || params.latency_seconds < 0) {
    return absl::InvalidArgumentError("bandwidth and latency must be >= 0");
  }
  if (!(params.op_overhead_seconds >= 0) || !std::isfinite(params.op_overhead_seconds)) {
    return absl::InvalidArgumentError("op_overhead_seconds must be >= 0 and finite");
  }
  if (!(params.memory_bandwidth_bytes_per_second >= 0) ||
      !std::isfinite(params.memory_bandwidth_bytes_per_second)) {
    return absl::InvalidArgumentError("memory_bandwidth_bytes_per_second must be >= 0 and finite");
  }
  PlanCost cost;
  cost.forward = EstimatePass(plan, params, speeds, true);
  cost.backward = EstimatePass(plan, params, speeds, false);
  return cost;
}

CostParams CpuCostParams(const AttentionShape& shape, std::vector<double> speeds) {
  CostParams p;
  p.shape = shape;
  p.speeds = std::move(speeds);
  return p;
}

CostParams GpuCostParams(const AttentionShape& shape, std::vector<double> speeds) {
  CostParams p;
  p.shape = shape;
  p.speeds = std::move(speeds);
  p.flops_per_second = 600e12;
  p.bandwidth_bytes_per_second = 300e9;
  p.latency_seconds = 100e-6;
  p.op_overhead_seconds = 60e-6;
  p.memory_bandwidth_bytes_per_second = 3e12;
  return p;
}

absl::StatusOr<CostParams> CostParamsForProfile(const std::string& profile,
                                                const AttentionShape& shape,
                                                std::vector<double> speeds) {
  if (profile == "cpu") return CpuCostParams(shape, std::move(speeds));
  if (profile == "gpu") return GpuCostParams(shape, std::move(speeds));
  return absl::InvalidArgumentError(
      absl::StrCat("profile: unknown '", profile, "' (expected cpu or gpu)"));
}

}  // namespace dfa
