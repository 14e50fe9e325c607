#include "core/planner/planner.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "core/planner/plan_builder.h"

namespace dfa {

int64_t TransferBytes(const AttentionShape& s, PlanTensor tensor, int64_t rows) {
  const int64_t es = DTypeSize(s.dtype);
  const int64_t q = int64_t{s.batch} * rows * s.q_heads * s.head_dim;
  const int64_t kv = int64_t{s.batch} * rows * s.kv_heads * s.head_dim;
  const int64_t stat = int64_t{s.batch} * s.q_heads * rows * 4;
  switch (tensor) {
    case PlanTensor::kQ: return q * es;
    case PlanTensor::kKV: return 2 * kv * es;
    case PlanTensor::kOutPartial: return q * 4 + stat;
    case PlanTensor::kGradIn: return 2 * q * es + 2 * stat;
    case PlanTensor::kDqPartial: return q * 4;
    case PlanTensor::kDkvPartial: return 2 * kv * 4;
  }
  return 0;
}

MaskSpec Plan::Mask() const {
  MaskSpec m = mask_spec;
  m.causal = causal;
  return m;
}

int Plan::physical_workers() const {
  if (rank_workers.empty()) return num_workers();
  return 1 + *std::max_element(rank_workers.begin(), rank_workers.end());
}

bool Plan::dense() const {
  for (const std::vector<int64_t>& row : mask_spec.doc_offsets) {
    if (row.size() > 2) return false;
  }
  return mask_spec.window_left < 0 && (causal || mask_spec.window_right < 0);
}

UnitPairs::UnitPairs(const Plan& plan) : UnitPairs(plan.Mask(), plan.seq_len) {}

UnitPairs::UnitPairs(const MaskSpec& mask, int64_t seq_len)
    : mask_(mask), seq_(seq_len), dense_(mask.IsDense()), kind_(mask.Kind()) {
  rows_ = std::max<int>(1, static_cast<int>(mask_.doc_offsets.size()));
}

int64_t UnitPairs::Row(int b, const RowRange& q, const RowRange& kv) const {
  if (q.size() <= 0 || kv.size() <= 0) return 0;
  if (dense_) return VisiblePairs(q.begin, q.size(), kv.begin, kv.size(), kind_);
  return VisiblePairs(mask_, b, seq_, q.begin, q.size(), kv.begin, kv.size());
}

RowRange UnitPairs::KeysSeen(const RowRange& q, const RowRange& kv) const {
  if (q.size() <= 0 || kv.size() <= 0) return {kv.begin, kv.begin};
  int64_t lo = kv.end, hi = kv.begin;
  const bool causal = kind_ == MaskKind::kCausal;
  for (int b = 0; b < rows_; ++b) {
    const PositionInterval first = dense_ ? PositionInterval{0, causal ? q.begin + 1 : seq_}
                                          : VisibleKeys(mask_, b, seq_, q.begin);
    const PositionInterval last = dense_ ? PositionInterval{0, causal ? q.end : seq_}
                                         : VisibleKeys(mask_, b, seq_, q.end - 1);
    lo = std::min(lo, std::max(kv.begin, first.lo));
    hi = std::max(hi, std::min(kv.end, last.hi));
  }
  if (hi <= lo) return {kv.begin, kv.begin};
  return {lo, hi};
}

RowRange UnitPairs::QueriesSeeing(const RowRange& q, const RowRange& kv) const {
  if (q.size() <= 0 || kv.size() <= 0) return {q.begin, q.begin};
  int64_t lo = q.end, hi = q.begin;
  const bool causal = kind_ == MaskKind::kCausal;
  for (int b = 0; b < rows_; ++b) {
    const PositionInterval first = dense_ ? PositionInterval{causal ? kv.begin : 0, seq_}
                                          : VisibleQueries(mask_, b, seq_, kv.begin);
    const PositionInterval last = dense_ ? PositionInterval{causal ? kv.end - 1 : 0, seq_}
                                         : VisibleQueries(mask_, b, seq_, kv.end - 1);
    lo = std::min(lo, std::max(q.begin, first.lo));
    hi = std::max(hi, std::min(q.end, last.hi));
  }
  if (hi <= lo) return {q.begin, q.begin};
  return {lo, hi};
}

double UnitPairs::operator()(const RowRange& q, const RowRange& kv) const {
  if (rows_ == 1) return static_cast<double>(Row(0, q, kv));
  double sum = 0;
  for (int b = 0; b < rows_; ++b) sum += static_cast<double>(Row(b, q, kv));
  return sum / rows_;
}

HeadRange WorkerKvHeads(const WorkerPlan& w, int kv_heads) {
  return w.kv_heads.empty() ? HeadRange{0, kv_heads} : w.kv_heads;
}

AttentionShape LocalShape(const AttentionShape& full, const WorkerPlan& w) {
  if (w.kv_heads.empty()) return full;
  AttentionShape s = full;
  const int group = full.kv_heads > 0 ? full.q_heads / full.kv_heads : 1;
  s.kv_heads = w.kv_heads.size();
  s.q_heads = w.kv_heads.size() * group;
  return s;
}

const char* PlanTensorName(PlanTensor t) {
  switch (t) {
    case PlanTensor::kQ: return "q";
    case PlanTensor::kKV: return "kv";
    case PlanTensor::kOutPartial: return "out_partial";
    case PlanTensor::kGradIn: return "grad_in";
    case PlanTensor::kDqPartial: return "dq_partial";
    case PlanTensor::kDkvPartial: return "dkv_partial";
  }
  return "unknown";
}

bool CanonicalTransferLess(const Transfer& a, const Transfer& b) {
  return std::make_tuple(IsPartial(a.tensor), static_cast<int>(a.tensor), a.rows.begin,
                         a.rows.end) < std::make_tuple(IsPartial(b.tensor),
                                                       static_cast<int>(b.tensor), b.rows.begin,
                                                       b.rows.end);
}

int64_t ChunkBoundary(int64_t seq_len, int64_t n, int64_t i) {
  // seq_len * i may overflow for absurd inputs only (seq_len < 2^40, n <= 2^20 is fine).
  return static_cast<int64_t>((static_cast<__int128>(seq_len) * i) / n);
}

int OwnerOf(const Plan& plan, int64_t row) {
  for (int w = 0; w < plan.num_workers(); ++w) {
    for (const RowRange& r : plan.workers[w].owned) {
      if (r.begin <= row && row < r.end) return w;
    }
  }
  return -1;
}

namespace planner_internal {
void PermuteWorkers(Plan& plan, const std::vector<int>& worker_of_slot) {
  std::vector<WorkerPlan> workers(plan.workers.size());
  for (size_t k = 0; k < worker_of_slot.size(); ++k) {
    WorkerPlan w = std::move(plan.workers[k]);
    for (auto* pass : {&w.forward, &w.backward}) {
      for (PlanStep& s : *pass) {
        for (auto* list : {&s.sends, &s.recvs}) {
          for (Transfer& x : *list) x.peer = worker_of_slot[x.peer];
        }
      }
    }
    workers[worker_of_slot[k]] = std::move(w);
  }
  plan.workers = std::move(workers);
}

std::vector<int> InterleavedRingOrder(const std::vector<double>& speeds) {
  const int P = static_cast<int>(speeds.size());
  std::vector<int> by_speed(P);
  for (int w = 0; w < P; ++w) by_speed[w] = w;
  std::stable_sort(by_speed.begin(), by_speed.end(),
                   [&](int a, int b) { return speeds[a] < speeds[b]; });
  std::vector<int> order;
  const int h = (P + 1) / 2;  // the slower half (one more for odd P)
  for (int k = 0; k < h; ++k) {
    order.push_back(by_speed[k]);
    if (h + k < P) order.push_back(by_speed[h + k]);
  }
  return order;
}

std::vector<int64_t> ProportionalCuts(int64_t total, const std::vector<double>& weights,
                                      int64_t min_part) {
  const size_t n = weights.size();
  double sum = 0;
  for (double w : weights) sum += w;
  std::vector<int64_t> b(n + 1, 0);
  double cum = 0;
  for (size_t i = 0; i + 1 < n; ++i) {
    cum += weights[i];
    const int64_t lo = b[i] + min_part;
    const int64_t hi = total - static_cast<int64_t>(n - 1 - i) * min_part;
    b[i + 1] = std::clamp<int64_t>(std::llround(total * cum / sum), std::min(lo, hi), hi);
  }
  b[n] = total;
  return b;
}

int64_t CutRowNear(const RowRange& q, const RowRange& kv, const UnitPairs& unit_pairs,
                   double need) {
  auto pairs = [&](int64_t r) { return unit_pairs(RowRange{q.begin, r}, kv); };
  int64_t lo = q.begin, hi = q.end;  // smallest r with pairs(r) >= need
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (pairs(mid) >= need) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  if (lo > q.begin && need - pairs(lo - 1) < pairs(lo) - need) --lo;
  return lo;
}

void PruneInvisible(Plan& plan) {
  if (plan.dense() || HasBackwardSteps(plan)) return;
  const UnitPairs pairs(plan);
  for (WorkerPlan& w : plan.workers) {
    for (PlanStep& s : w.forward) {
      std::erase_if(s.computes,
                    [&](const ComputeOp& c) { return pairs(c.q_rows, c.kv_rows) <= 0; });
    }
  }
  // Whether worker w needs `x` (received in step t): a compute reads rows inside it (kQ: as
  // queries, kKV: as keys), or a later send forwards rows inside it.
  auto needed = [&](int w, int t, const Transfer& x) {
    const auto& pass = plan.workers[w].forward;
    for (int u = t; u < static_cast<int>(pass.size()); ++u) {
      for (const ComputeOp& c : pass[u].computes) {
        const RowRange& r = x.tensor == PlanTensor::kQ ? c.q_rows : c.kv_rows;
        if (x.rows.Contains(r)) return true;
      }
      if (u == t) continue;
      for (const Transfer& y : pass[u].sends) {
        if (y.tensor == x.tensor && x.rows.Contains(y.rows)) return true;
      }
    }
    return false;
  };
  // Whether worker w computed a partial inside rows r before step t.
  auto computed = [&](int w, int t, const RowRange& r) {
    const auto& pass = plan.workers[w].forward;
    for (int u = 0; u < t && u < static_cast<int>(pass.size()); ++u) {
      for (const ComputeOp& c : pass[u].computes) {
        if (r.Contains(c.q_rows)) return true;
      }
    }
    return false;
  };
  auto drop_recv = [&](int to, int t, int from, const Transfer& x) {
    std::vector<Transfer>& recvs = plan.workers[to].forward[t].recvs;
    for (size_t k = 0; k < recvs.size(); ++k) {
      if (recvs[k].peer == from && recvs[k].tensor == x.tensor && recvs[k].rows == x.rows) {
        recvs.erase(recvs.begin() + static_cast<std::ptrdiff_t>(k));
        return;
      }
    }
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (int w = 0; w < plan.num_workers(); ++w) {
      for (int t = 0; t < static_cast<int>(plan.workers[w].forward.size()); ++t) {
        std::vector<Transfer>& sends = plan.workers[w].forward[t].sends;
        for (size_t k = 0; k < sends.size();) {
          const Transfer x = sends[k];
          const bool drop = x.tensor == PlanTensor::kOutPartial ? !computed(w, t, x.rows)
                                                                : !needed(x.peer, t, x);
          if (drop) {
            sends.erase(sends.begin() + static_cast<std::ptrdiff_t>(k));
            drop_recv(x.peer, t, w, x);
            changed = true;
          } else {
            ++k;
          }
        }
      }
    }
  }
}

void EqualizeSteps(Plan& plan) {
  size_t n = 0;
  for (const WorkerPlan& w : plan.workers) n = std::max(n, w.forward.size());
  for (WorkerPlan& w : plan.workers) w.forward.resize(n);
}

bool TakeBackwardFrom(Plan& plan, Plan backward_source) {
  if (backward_source.num_workers() != plan.num_workers() ||
      backward_source.seq_len != plan.seq_len || backward_source.causal != plan.causal ||
      backward_source.mask_spec.doc_offsets != plan.mask_spec.doc_offsets ||
      backward_source.mask_spec.window_left != plan.mask_spec.window_left ||
      backward_source.mask_spec.window_right != plan.mask_spec.window_right) {
    return false;
  }
  for (int w = 0; w < plan.num_workers(); ++w) {
    if (backward_source.workers[w].owned != plan.workers[w].owned) return false;
  }
  EqualizeSteps(backward_source);
  if (!HasBackwardSteps(backward_source)) DeriveBackwardSteps(backward_source);
  EqualizeSteps(plan);
  for (int w = 0; w < plan.num_workers(); ++w) {
    plan.workers[w].backward = std::move(backward_source.workers[w].backward);
  }
  return true;
}
}  // namespace planner_internal

MaskSpec RequestMask(const PlanRequest& r) {
  MaskSpec m = r.mask_spec;
  m.causal = r.causal;
  return m;
}

absl::Status ValidatePlanRequest(const PlanRequest& r) {
  if (r.workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("workers must be >= 1, got ", r.workers));
  }
  if (r.workers > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("workers must be <= 4096, got ", r.workers));
  }
  if (r.seq_len < r.workers) {
    return absl::InvalidArgumentError(absl::StrCat("seq_len (", r.seq_len,
                                                   ") must be >= workers (", r.workers, ")"));
  }
  if (r.seq_len > (int64_t{1} << 40)) {
    return absl::InvalidArgumentError(absl::StrCat("seq_len too large: ", r.seq_len));
  }
  if (!r.speeds.empty()) {
    if (static_cast<int>(r.speeds.size()) != r.workers) {
      return absl::InvalidArgumentError(absl::StrCat("speeds: ", r.speeds.size(),
                                                     " values given for ", r.workers,
                                                     " workers"));
    }
    for (size_t i = 0; i < r.speeds.size(); ++i) {
      if (!(r.speeds[i] > 0) || !std::isfinite(r.speeds[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat("speeds[", i, "] must be positive and finite, got ", r.speeds[i]));
      }
    }
  }
  if (r.profile != "cpu" && r.profile != "gpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("profile: unknown '", r.profile, "' (expected cpu or gpu)"));
  }
  if (r.shape.batch < 1 || r.shape.q_heads < 1 || r.shape.kv_heads < 1 || r.shape.head_dim < 1 ||
      r.shape.q_heads % r.shape.kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape: batch, q_heads, kv_heads, head_dim must be >= 1 and q_heads a multiple of "
        "kv_heads, got ", r.shape.batch, ", ", r.shape.q_heads, ", ", r.shape.kv_heads, ", ",
        r.shape.head_dim));
  }
  const AttentionShape& ss = r.session_shape;
  if (ss.batch != 0 && (ss.batch < 1 || ss.q_heads < 1 || ss.kv_heads < 1 || ss.head_dim < 1 ||
                        ss.q_heads % ss.kv_heads != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session_shape: batch, q_heads, kv_heads, head_dim must be >= 1 and q_heads a multiple "
        "of kv_heads (or batch 0: not given), got ", ss.batch, ", ", ss.q_heads, ", ",
        ss.kv_heads, ", ", ss.head_dim));
  }
  if (!RequestMask(r).IsDense() && r.mask_spec.causal != r.causal) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mask_spec.causal (", r.mask_spec.causal ? "true" : "false", ") differs from causal (",
        r.causal ? "true" : "false", ")"));
  }
  {
    MaskSpec mask = r.mask_spec;
    mask.causal = r.causal;
    const int batch = ss.batch > 0 ? ss.batch : r.shape.batch;
    const absl::Status s = ValidateMask(mask, batch, r.seq_len);
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("mask_spec.", s.message()));
  }
  if (r.schedule == "distflash") {
    if (r.workers % 2 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "schedule distflash (the paper's Algorithm 2) needs an even number of workers, got ",
          r.workers, "; use zigzag or balanced"));
    }
  } else if (r.schedule == "zigzag") {
    if (r.seq_len < 2 * int64_t{r.workers}) {
      return absl::InvalidArgumentError(absl::StrCat(
          "schedule zigzag needs seq_len >= 2*workers (", 2 * r.workers, "), got ", r.seq_len));
    }
  } else if (r.schedule != "ring" && r.schedule != "balanced" && r.schedule != "heads" &&
             r.schedule != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule: unknown '", r.schedule,
                     "' (expected ring, distflash, zigzag, balanced, heads or auto)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Plan> MakePlan(const PlanRequest& request) {
  RETURN_IF_ERROR(ValidatePlanRequest(request));
  Plan plan;
  if (request.schedule == "ring") plan = MakeRingPlan(request);
  if (request.schedule == "distflash") plan = MakeDistFlashPlan(request);
  if (request.schedule == "zigzag") plan = MakeZigzagPlan(request);
  if (request.schedule == "balanced") plan = MakeBalancedPlan(request);
  if (request.schedule == "heads") plan = MakeHeadsPlan(request);
  if (request.schedule == "auto") plan = MakeAutoPlan(request);
  if (plan.workers.empty()) {
    return absl::InternalError(absl::StrCat("schedule ", request.schedule, " made no plan for ",
                                            request.workers, " workers"));
  }
  planner_internal::EqualizeSteps(plan);
  if (!HasBackwardSteps(plan)) DeriveBackwardSteps(plan);
  return plan;
}

bool HasBackwardSteps(const Plan& plan) {
  for (const WorkerPlan& w : plan.workers) {
    if (!w.backward.empty()) return true;
  }
  return false;
}

void DeriveBackwardSteps(Plan& plan) {
  using planner_internal::StepAt;
  for (WorkerPlan& w : plan.workers) {
    w.backward = w.forward;
    for (PlanStep& s : w.backward) {
      for (auto* list : {&s.sends, &s.recvs}) {
        for (Transfer& x : *list) {
          if (x.tensor == PlanTensor::kQ) x.tensor = PlanTensor::kGradIn;
          if (x.tensor == PlanTensor::kOutPartial) x.tensor = PlanTensor::kDqPartial;
        }
      }
    }
  }
  // dK/dV partials: after the last compute that uses a received K/V buffer, send it to the owner.
  struct Pending {
    int from, to, step;
    RowRange rows;
  };
  std::vector<Pending> pending;
  for (int w = 0; w < plan.num_workers(); ++w) {
    const auto& pass = plan.workers[w].forward;
    // Computes by the first row of their kv range: (kv begin, kv end, step), sorted.
    std::vector<std::tuple<int64_t, int64_t, int>> uses;
    for (int u = 0; u < static_cast<int>(pass.size()); ++u) {
      for (const ComputeOp& c : pass[u].computes) uses.emplace_back(c.kv_rows.begin, c.kv_rows.end, u);
    }
    std::sort(uses.begin(), uses.end());
    for (int t = 0; t < static_cast<int>(pass.size()); ++t) {
      for (const Transfer& r : pass[t].recvs) {
        if (r.tensor != PlanTensor::kKV) continue;
        int last = -1;
        auto it = std::lower_bound(uses.begin(), uses.end(),
                                   std::make_tuple(r.rows.begin, int64_t{0}, 0));
        for (; it != uses.end() && std::get<0>(*it) < r.rows.end; ++it) {
          if (std::get<1>(*it) <= r.rows.end && std::get<2>(*it) >= t) {
            last = std::max(last, std::get<2>(*it));
          }
        }
        if (last >= 0) pending.push_back({w, OwnerOf(plan, r.rows.begin), last + 1, r.rows});
      }
    }
  }
  for (const Pending& p : pending) {
    StepAt(plan.workers[p.from].backward, p.step)
        .sends.push_back(Transfer{p.to, PlanTensor::kDkvPartial, p.rows});
    StepAt(plan.workers[p.to].backward, p.step)
        .recvs.push_back(Transfer{p.from, PlanTensor::kDkvPartial, p.rows});
  }
  size_t n = 0;
  for (const WorkerPlan& w : plan.workers) n = std::max(n, w.backward.size());
  for (WorkerPlan& w : plan.workers) w.backward.resize(n);
}

}  // namespace dfa
