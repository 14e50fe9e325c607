#include "core/planner/worker_memory.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dfa {
namespace {

bool OwnsRange(const WorkerPlan& w, const RowRange& r) {
  for (const RowRange& o : w.owned) {
    if (o.Contains(r)) return true;
  }
  return false;
}

}  // namespace

bool SingleWriterForward(const Plan& plan, int rank) {
  const WorkerPlan& w = plan.workers[rank];
  std::vector<RowRange> written;
  for (const PlanStep& step : w.forward) {
    for (const Transfer& x : step.recvs) {
      if (x.tensor == PlanTensor::kOutPartial) return false;
    }
    for (const ComputeOp& op : step.computes) {
      if (OwnsRange(w, op.q_rows)) written.push_back(op.q_rows);
    }
  }
  std::sort(written.begin(), written.end(),
            [](const RowRange& a, const RowRange& b) { return a.begin < b.begin; });
  int64_t covered = 0, total = 0;
  for (size_t i = 0; i < written.size(); ++i) {
    if (i > 0 && written[i].begin < written[i - 1].end) return false;  // a row written twice
    covered += written[i].size();
  }
  for (const RowRange& r : w.owned) total += r.size();
  return covered == total;
}

bool ChunkedBackward(const Plan& plan, int rank) {
  const WorkerPlan& w = plan.workers[rank];
  int step_with_owned_keys = -1;
  for (size_t t = 0; t < w.backward.size(); ++t) {
    const PlanStep& step = w.backward[t];
    for (const Transfer& x : step.recvs) {
      if (x.tensor == PlanTensor::kDkvPartial) return false;
    }
    for (const Transfer& x : step.sends) {
      if (x.tensor == PlanTensor::kKV) return false;
    }
    for (const ComputeOp& op : step.computes) {
      if (!OwnsRange(w, op.kv_rows)) continue;
      if (step_with_owned_keys >= 0 && step_with_owned_keys != static_cast<int>(t)) return false;
      step_with_owned_keys = static_cast<int>(t);
    }
  }
  return true;
}

absl::StatusOr<WorkerMemory> PlanWorkerMemory(const Plan& plan, int rank,
                                              const AttentionShape& local,
                                              const CheckReport& report, int64_t step_tokens) {
  if (rank < 0 || rank >= plan.num_workers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: ", rank, " is outside the plan's ", plan.num_workers(), " workers"));
  }
  if (step_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("step_tokens: must be >= 1, got ", step_tokens));
  }
  int64_t rows = 0;
  for (const RowRange& r : plan.workers[rank].owned) rows += r.size();
  WorkerMemory m;
  m.step_tokens = step_tokens;
  m.layout.forward_accumulator = !SingleWriterForward(plan, rank);
  m.layout.kv_accumulators = !ChunkedBackward(plan, rank);
  m.storage = SessionStorageLayout(local, rows, m.layout);
  if (!m.layout.kv_accumulators && rows > 0) {
    m.key_chunk = KeyChunkBytes(local, std::min(rows, step_tokens));
  }
  (void)report;
  m.forward_buffers = ExecutorPassScratch(plan, rank, local, true, 0);
  m.backward_buffers = ExecutorPassScratch(plan, rank, local, false, m.key_chunk) - m.key_chunk;
  return m;
}

}  // namespace dfa
