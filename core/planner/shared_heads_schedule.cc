// Shared heads (plan.h "Virtual ranks", docs/planner.md "Schedules"): whole-head groups of
// few workers hold most kv heads over all rows, and the remaining heads are split by sequence
// over the workers with work left, in shared groups; each worker runs one rank of each kind.
// A group of m workers and h heads gives each member h/m heads of work, so the split fixes
// every worker's work (within kSharedLoadSlack of its share), and in the cost model's lock-step
// worker the shared ranks' messages travel while the whole heads compute. At P = 6 and 32 heads
// each worker takes 5 whole heads (no traffic) and the last 2 go to two groups of 3 workers.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>
#include <utility>

#include "core/planner/cost_model.h"
#include "core/planner/planner.h"
#include "core/planner/rank_parts.h"

namespace dfa {
namespace {

// Steps ahead that the shared plans post each K/V piece (DirectFromOwners).
constexpr int kDirectLead = 1;
// How far over its share a worker's work may be in a split (the shared heads dealt to groups).
constexpr double kSharedLoadSlack = 0.01;

// `plan` with every K/V piece a worker receives in the forward sent by the piece's owner
// instead of forwarded along the ring, posted min(lead, t) steps early (Transfer::lead):
// no piece waits on another's arrival, so a step's latency is never on a chain. Its backward is
// derived afresh. A plan with no workers when a received piece is not within one owned range.
Plan DirectFromOwners(Plan plan, int lead) {
  const int P = plan.num_workers();
  auto owner = [&](const RowRange& rows) {
    for (int w = 0; w < P; ++w) {
      for (const RowRange& o : plan.workers[w].owned) {
        if (o.Contains(rows)) return w;
      }
    }
    return -1;
  };
  for (WorkerPlan& w : plan.workers) {
    w.backward.clear();
    for (PlanStep& s : w.forward) {  // forwarded K/V sends dropped; the owners send instead
      std::erase_if(s.sends, [&](const Transfer& x) { return x.tensor == PlanTensor::kKV; });
    }
  }
  for (int i = 0; i < P; ++i) {
    std::vector<PlanStep>& pass = plan.workers[i].forward;
    for (size_t t = 0; t < pass.size(); ++t) {
      for (Transfer& x : pass[t].recvs) {
        if (x.tensor != PlanTensor::kKV) continue;
        const int o = owner(x.rows);
        if (o < 0 || o == i) return Plan{};
        x.peer = o;
        x.lead = std::min(lead, static_cast<int>(t));
        plan.workers[o].forward[t].sends.push_back(Transfer{i, x.tensor, x.rows, x.lead});
      }
    }
  }
  for (WorkerPlan& w : plan.workers) {
    for (PlanStep& s : w.forward) {
      std::sort(s.sends.begin(), s.sends.end(), CanonicalTransferLess);
      std::sort(s.recvs.begin(), s.recvs.end(), CanonicalTransferLess);
    }
  }
  DeriveBackwardSteps(plan);
  return plan;
}

// The straddled shared groups (planner.h SharedHeadsSplits): `open` workers' work left `rest`
// laid end to end, group j taking the next total · n_j / shared_heads of it (n_j: the shared
// heads as even as possible over gs groups); a boundary closer than kMinStraddle heads of work
// to a worker's edge snaps to it. None (no shared groups) unless some worker straddles and
// every group has >= 2 members.
SharedHeadsSplit StraddledShared(const HeadGroupSplit& whole, const std::vector<double>& rest,
                                 const std::vector<int>& open, int shared_heads, int gs) {
  constexpr double kMinStraddle = 0.02;
  SharedHeadsSplit split;
  split.groups = whole;
  const size_t n = open.size();
  std::vector<double> edge(n + 1, 0);
  for (size_t k = 0; k < n; ++k) edge[k + 1] = edge[k] + rest[open[k]];
  std::vector<int> heads(gs, shared_heads / gs);
  for (int j = 0; j < shared_heads % gs; ++j) ++heads[j];
  std::vector<double> cut(gs + 1, 0);
  int before = 0;
  bool straddles = false;
  for (int j = 1; j <= gs; ++j) {
    before += heads[j - 1];
    cut[j] = j == gs ? edge[n] : edge[n] * before / shared_heads;
    if (j == gs) break;
    for (size_t k = 0; k < n; ++k) {
      if (cut[j] < edge[k] || cut[j] > edge[k + 1]) continue;
      if (cut[j] - edge[k] < kMinStraddle) {
        cut[j] = edge[k];
      } else if (edge[k + 1] - cut[j] < kMinStraddle) {
        cut[j] = edge[k + 1];
      } else {
        straddles = true;
      }
      break;
    }
  }
  if (!straddles) return SharedHeadsSplit{};
  for (int j = 0; j < gs; ++j) {
    std::vector<int> members;
    std::vector<double> work;
    for (size_t k = 0; k < n; ++k) {
      const double part = std::min(edge[k + 1], cut[j + 1]) - std::max(edge[k], cut[j]);
      if (part <= 1e-9) continue;
      members.push_back(open[k]);
      // (The group's heads over its parts: the snapped boundaries' work moves with them.)
      work.push_back(part * heads[j] / (cut[j + 1] - cut[j]));
    }
    if (members.size() < 2) return SharedHeadsSplit{};
    split.shared.members.push_back(std::move(members));
    split.shared.kv_heads.push_back(heads[j]);
    split.shared_work.push_back(std::move(work));
  }
  return split;
}

}  // namespace

std::vector<SharedHeadsSplit> SharedHeadsSplits(const PlanRequest& r) {
  std::vector<SharedHeadsSplit> out;
  const int P = r.workers, K = r.shape.kv_heads;
  if (P < 2 || K < 2) return out;
  for (double s : r.speeds) {
    if (s != r.speeds[0]) return out;  // equal speeds only
  }
  Plan mask;  // dense requests only (Plan::dense: no documents, no window)
  mask.causal = r.causal;
  mask.mask_spec = r.mask_spec;
  if (!mask.dense()) return out;
  const double share = static_cast<double>(K) / P;  // each worker's heads of work
  for (int m = 1; m <= std::min(P, 8); ++m) {
    const int h0 = static_cast<int>(static_cast<int64_t>(m) * K / P);
    for (int h = h0; h >= std::max(1, h0 - 1); --h) {
      HeadGroupSplit whole;
      std::vector<double> rest(P, share);
      int w = 0, heads = 0;
      auto add = [&](int from, int to, int n) {
        std::vector<int> members;
        for (int k = from; k < to; ++k) {
          members.push_back(k);
          rest[k] -= static_cast<double>(n) / (to - from);
        }
        whole.members.push_back(std::move(members));
        whole.kv_heads.push_back(n);
        heads += n;
      };
      for (; w + m <= P; w += m) add(w, w + m, h);
      if (w < P) {
        const int h_left = std::max(0, static_cast<int>(int64_t{P - w} * K / P) - (h < h0 ? 1 : 0));
        if (h_left > 0) add(w, P, h_left);
      }
      const int shared_heads = K - heads;
      if (shared_heads < 1 || heads < 1) continue;  // pure head groups or no groups
      std::vector<int> open;  // the workers with work left
      for (int k = 0; k < P; ++k) {
        if (rest[k] > 1e-9 * K) open.push_back(k);
      }
      // The shared heads over gs groups of consecutive open workers, heads by the groups' rest
      // (largest remainder), kept where no worker's work exceeds its share by over 1%.
      for (int gs = 1; gs <= std::min({shared_heads, static_cast<int>(open.size()), 6}); ++gs) {
        SharedHeadsSplit split;
        split.groups = whole;
        std::vector<double> sum(gs, 0);
        for (int j = 0; j < gs; ++j) {
          const size_t from = open.size() * j / gs, to = open.size() * (j + 1) / gs;
          split.shared.members.emplace_back(open.begin() + static_cast<long>(from),
                                            open.begin() + static_cast<long>(to));
          for (size_t k = from; k < to; ++k) sum[j] += rest[open[k]];
        }
        double total = 0;
        for (double x : sum) total += x;
        std::vector<int> n(gs);
        std::vector<std::pair<double, int>> remainder;
        int dealt = 0;
        for (int j = 0; j < gs; ++j) {
          const double exact = shared_heads * sum[j] / total;
          n[j] = static_cast<int>(exact);
          dealt += n[j];
          remainder.emplace_back(exact - n[j], j);
        }
        std::sort(remainder.rbegin(), remainder.rend());
        for (int k = 0; dealt < shared_heads; ++k, ++dealt) ++n[remainder[k].second];
        double worst = 0;
        bool empty = false;
        for (int j = 0; j < gs; ++j) {
          empty |= n[j] < 1;
          for (int k : split.shared.members[j]) {
            const double load = share - rest[k] + static_cast<double>(n[j]) /
                                                      split.shared.members[j].size();
            worst = std::max(worst, load / share);
          }
        }
        for (const std::vector<int>& m : split.shared.members) empty |= m.size() < 2;
        if (!empty && worst <= 1 + kSharedLoadSlack) {  // (one worker: whole heads)
          split.shared.kv_heads = std::move(n);
          out.push_back(std::move(split));
        }
        if (gs >= 2) {
          SharedHeadsSplit straddled = StraddledShared(whole, rest, open, shared_heads, gs);
          if (!straddled.shared.members.empty()) out.push_back(std::move(straddled));
        }
      }
    }
  }
  return out;
}

double SharedHeadsWireRatio(const PlanRequest& r, const SharedHeadsSplit& split,
                            double flops_per_second, double bandwidth_bytes_per_second) {
  const int P = r.workers, K = r.shape.kv_heads;
  if (bandwidth_bytes_per_second <= 0) return 0;
  const int64_t S = r.seq_len;
  // Per worker: the K/V rows of each part it receives (all but its own share of the part's
  // rows) at the part's heads, over its share of the whole compute (dense: causal and full give
  // the same ratio); the largest over workers.
  const double q_per_kv = static_cast<double>(r.shape.q_heads) / K;
  const double pairs = r.causal ? 0.5 * static_cast<double>(S) * static_cast<double>(S)
                                : static_cast<double>(S) * static_cast<double>(S);
  const double share_seconds = 4.0 * r.shape.batch * r.shape.q_heads * r.shape.head_dim * pairs /
                               flops_per_second / P;
  std::vector<double> wire(P, 0);
  for (const HeadGroupSplit* part : {&split.groups, &split.shared}) {
    for (size_t g = 0; g < part->members.size(); ++g) {
      const std::vector<int>& m = part->members[g];
      const double n = static_cast<double>(m.size());
      AttentionShape s = r.shape;
      s.kv_heads = part->kv_heads[g];
      s.q_heads = static_cast<int>(s.kv_heads * q_per_kv);
      const double bytes = static_cast<double>(TransferBytes(s, PlanTensor::kKV, S)) * (n - 1) / n;
      for (int w : m) wire[w] += bytes / bandwidth_bytes_per_second;
    }
  }
  double worst = 0;
  for (int w = 0; w < P; ++w) worst = std::max(worst, wire[w] / share_seconds);
  return worst;
}

Plan MakeSharedHeadsPlan(const PlanRequest& r, const SharedHeadsSplit& split) {
  const int P = r.workers, K = r.shape.kv_heads;
  auto speed = [&](int w) { return r.speeds.empty() ? 1.0 : r.speeds[w]; };
  // Each worker's heads of work in each part it is in (a group's heads by its members' speeds)
  // and in all; every worker in at most one group of each kind, and in one group at least.
  // (Straddled shared groups, shared_work: a worker in up to two, with the work given.)
  std::vector<double> whole_load(P, 0), shared_load(P, 0);
  std::vector<int> in_whole(P, 0), in_shared(P, 0);
  std::vector<std::vector<double>> rank_load[2];  // per kind, group and member
  const bool straddled = !split.shared_work.empty();
  if (straddled && split.shared_work.size() != split.shared.members.size()) return Plan{};
  int heads = 0;
  for (int kind = 0; kind < 2; ++kind) {
    const HeadGroupSplit& part = kind == 0 ? split.groups : split.shared;
    if (part.kv_heads.size() != part.members.size()) return Plan{};
    const int most = kind == 1 && straddled ? 2 : 1;
    for (size_t i = 0; i < part.members.size(); ++i) {
      if (part.members[i].empty() || part.kv_heads[i] < 1) return Plan{};
      heads += part.kv_heads[i];
      double sum = 0;
      for (int m : part.members[i]) {
        if (m < 0 || m >= P || (kind == 0 ? in_whole : in_shared)[m]++ >= most) return Plan{};
        sum += speed(m);
      }
      const bool given = kind == 1 && straddled;
      if (given && split.shared_work[i].size() != part.members[i].size()) return Plan{};
      std::vector<double>& load = rank_load[kind].emplace_back();
      for (size_t k = 0; k < part.members[i].size(); ++k) {
        const int m = part.members[i][k];
        load.push_back(given ? split.shared_work[i][k] : part.kv_heads[i] * speed(m) / sum);
        if (!(load.back() > 0)) return Plan{};
        (kind == 0 ? whole_load : shared_load)[m] += load.back();
      }
    }
  }
  if (heads != K || split.shared.members.empty()) return Plan{};
  for (int w = 0; w < P; ++w) {
    if (in_whole[w] + in_shared[w] == 0) return Plan{};  // a worker with no work
  }
  // A rank's share of its worker's work, times the worker's speed: what its sub-plan is planned
  // at, so that the sub-search weighs its messages against the compute they travel behind.
  auto rank_speed = [&](int w, double load) {
    return speed(w) * load / (whole_load[w] + shared_load[w]);
  };
  // The parts: each group's plan (none for a one-worker group: its rank's computes are cut
  // below), the whole-head groups' the "balanced" search's, the shared groups' the striped ring
  // with its K/V straight from the owners (DirectFromOwners).
  std::vector<planner_internal::RankPart> parts;
  std::map<std::tuple<int, int, int, std::vector<double>>, Plan> made;  // one plan per kind
  int head = 0;
  for (int kind = 0; kind < 2; ++kind) {
    const HeadGroupSplit& groups = kind == 0 ? split.groups : split.shared;
    for (size_t i = 0; i < groups.members.size(); ++i) {
      planner_internal::RankPart part;
      part.members = groups.members[i];
      part.head = head;
      part.heads = groups.kv_heads[i];
      head += part.heads;
      const int n = static_cast<int>(part.members.size());
      if (n > 1) {
        std::vector<double> speeds;
        for (int k = 0; k < n; ++k) {
          speeds.push_back(rank_speed(part.members[k], rank_load[kind][i][k]));
        }
        auto [it, added] = made.try_emplace({kind, n, part.heads, speeds});
        if (added) {
          const PlanRequest request = planner_internal::PartRequest(r, n, part.heads, speeds);
          if (kind == 0) {
            absl::StatusOr<Plan> sub = MakePlan(request);
            if (!sub.ok() || !sub->rank_workers.empty()) return Plan{};
            it->second = *std::move(sub);
          } else {
            if (request.seq_len < 2 * n) return Plan{};
            it->second = DirectFromOwners(MakeStripedRingPlan(request, std::vector<int>(n, 1)),
                                          kDirectLead);
            if (it->second.workers.empty()) return Plan{};
          }
        }
        part.plan = it->second;
      }
      parts.push_back(std::move(part));
    }
  }
  return planner_internal::PlanOfRankParts(r, std::move(parts));
}

}  // namespace dfa
