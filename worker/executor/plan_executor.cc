// The pass loop: checks that the plan fits this worker, then runs its steps in the order
// plan_executor.h describes, with the parts of a pass each in its own file: buffer lifetimes
// (pass_buffers.h), group scheduling (step_groups.h), accumulators (pass_accumulators.h) and
// step compute (step_compute.h), sharing one PassContext (pass_context.h).
#include "worker/executor/plan_executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/executor/output_finality.h"
#include "worker/executor/pass_accumulators.h"
#include "worker/executor/pass_buffers.h"
#include "worker/executor/pass_context.h"
#include "worker/executor/step_compute.h"
#include "worker/executor/step_groups.h"

namespace dfa {
namespace {

using executor_internal::Buffer;
using executor_internal::FinalRowsByStep;
using executor_internal::GlobalRows;
using executor_internal::OutputFinality;
using executor_internal::PassAccumulators;
using executor_internal::PassBuffers;
using executor_internal::PassContext;
using executor_internal::StepCompute;
using executor_internal::StepGroups;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class PassRunner {
 public:
  PassRunner(AttentionBackend* backend, Transport* transport, SessionStorage* storage,
             const ExecutorOptions& options, const Plan& plan, bool fwd)
      : run_(CutTransfers(plan, options.transfer_cut)),
        ctx_(backend, transport, storage, options, run_, fwd),
        buffers_(&ctx_),
        groups_(&ctx_, &buffers_),
        acc_(&ctx_),
        compute_(&ctx_, &buffers_, &acc_) {
    ctx_.acc = &acc_;
  }

  absl::StatusOr<PassStats> Run();

 private:
  // INVALID_ARGUMENT when the plan does not fit this worker's transport and storage.
  absl::Status CheckFits() const;
  // One step: wait for its data, post later steps' groups, queue its computes.
  absl::Status RunStep(int t);
  // Waits for step t's late group and merges what it brought; the partials it sent are free.
  absl::Status FinishLate(int t) {
    RETURN_IF_ERROR(
        groups_.FinishLate(t, [this](const Buffer& a) { return compute_.Merge(a); }));
    buffers_.ReleaseSent(t);
    return absl::OkStatus();
  }
  // Outputs streaming (ExecutorOptions::outputs): the rows step t finished, converted, then
  // announced once the stream has them.
  absl::Status PublishFinal(int t);

  const Plan run_;  // the plan as it runs (CutTransfers)
  PassContext ctx_;
  PassBuffers buffers_;
  StepGroups groups_;
  PassAccumulators acc_;
  StepCompute compute_;
  OutputFinality finality_;  // set when the pass announces its outputs
};

absl::Status PassRunner::PublishFinal(int t) {
  OutputGate* gate = ctx_.options.outputs;
  const int T = static_cast<int>(ctx_.steps().size());
  if (gate == nullptr || t + 1 >= T) return absl::OkStatus();  // the last step's: the job's end
  const std::vector<RowRange>& queries = finality_.queries[static_cast<size_t>(t)];
  static const std::vector<RowRange> kNone;
  const std::vector<RowRange>& keys =
      acc_.chunked() ? kNone : finality_.keys[static_cast<size_t>(t)];
  if (queries.empty() && keys.empty()) return absl::OkStatus();
  for (const RowRange& r : queries) RETURN_IF_ERROR(acc_.ConvertFinal(OutputSide::kQueries, r));
  for (const RowRange& r : keys) RETURN_IF_ERROR(acc_.ConvertFinal(OutputSide::kKeys, r));
  RETURN_IF_ERROR(ctx_.backend->Synchronize(ctx_.stream));
  const std::vector<RowRange>& owned = ctx_.storage->owned();
  for (const RowRange& r : queries) gate->RowsFinal(OutputSide::kQueries, GlobalRows(owned, r));
  for (const RowRange& r : keys) gate->RowsFinal(OutputSide::kKeys, GlobalRows(owned, r));
  return absl::OkStatus();
}

absl::Status PassRunner::CheckFits() const {
  const Plan& plan = ctx_.plan;
  const int rank = ctx_.rank;
  if (plan.num_workers() != ctx_.transport->size()) {
    return absl::InvalidArgumentError(absl::StrCat("plan has ", plan.num_workers(),
                                                   " workers, the transport ",
                                                   ctx_.transport->size()));
  }
  if (rank < 0 || rank >= plan.num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " outside the plan"));
  }
  if (plan.workers[rank].owned != ctx_.storage->owned()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", rank, ": the session's owned rows differ from the plan's"));
  }
  // A head-split worker (plan.h "Head groups") runs at its local heads: its storage must hold
  // exactly its range's kv heads (buffers and messages are sized from the storage's shape).
  const HeadRange& heads = plan.workers[rank].kv_heads;
  if (!heads.empty() && heads.size() != ctx_.shape.kv_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", rank, ": the plan's kv_heads [", heads.begin, ", ", heads.end, ") are ",
        heads.size(), " heads, the session's storage holds ", ctx_.shape.kv_heads));
  }
  return absl::OkStatus();
}

absl::Status PassRunner::RunStep(int t) {
  StepStats& s = ctx_.stats.steps[t];
  const int T = static_cast<int>(ctx_.steps().size());
  double t0 = Now();
  ctx_.input_wait = 0;
  RETURN_IF_ERROR(groups_.WaitEarly(t));
  double t1 = Now();
  s.idle_seconds = t1 - t0;
  // Step t+1's early group travels during step t's computes. A GPU transport takes a mark
  // of what its sends wait for (the packing just queued), so the computes are queued first
  // and the group's host-side launch (~0.1-0.4 ms for NCCL) does not delay them.
  // Transfers with a lead (plan.h) for later steps are posted here too, in step order.
  const std::vector<std::pair<int, int>> posted = groups_.PostedAt(t);
  bool launch_after = false;
  if (!posted.empty()) {
    bool any = false;
    for (const auto& [u, lead] : posted) {
      RETURN_IF_ERROR(groups_.PrepareEarly(u, lead));
      any = any || groups_.HasMessages(u, lead);
    }
    launch_after = any && ctx_.transport->MarkReady(ctx_.stream);
    if (!launch_after) {
      for (const auto& [u, lead] : posted) RETURN_IF_ERROR(groups_.LaunchEarly(u, lead));
    }
  }
  ctx_.stats.peak_scratch_bytes = std::max(ctx_.stats.peak_scratch_bytes, buffers_.LiveBytes());
  RETURN_IF_ERROR(compute_.RunStep(t));
  if (launch_after) {
    for (const auto& [u, lead] : posted) RETURN_IF_ERROR(groups_.LaunchEarly(u, lead));
    ctx_.transport->ClearReadyMark();
  }
  ctx_.stats.peak_scratch_bytes = std::max(ctx_.stats.peak_scratch_bytes, buffers_.LiveBytes());
  // Step t's partials were posted after step t-1's computes and travelled during step t's:
  // waited for and merged now, before step t+1's are posted (see the header), so that the
  // buffers of one late group are alive at a time.
  const double t2 = Now();
  RETURN_IF_ERROR(FinishLate(t));
  const double t3 = Now();
  s.idle_seconds += t3 - t2;
  if (t + 1 < T) RETURN_IF_ERROR(groups_.PostLate(t + 1));
  RETURN_IF_ERROR(PublishFinal(t));
  s.busy_seconds = Now() - t1 - (t3 - t2) - ctx_.input_wait;
  // Release what this step was the last to use (sends of step t completed in the Wait above).
  buffers_.ReleaseAfterStep(t);
  return absl::OkStatus();
}

absl::StatusOr<PassStats> PassRunner::Run() {
  ctx_.rank = ctx_.transport->rank();
  RETURN_IF_ERROR(CheckFits());
  const ExecutorOptions& opt = ctx_.options;
  ctx_.scale = opt.softmax_scale > 0
                   ? opt.softmax_scale
                   : 1.0f / std::sqrt(static_cast<float>(ctx_.shape.head_dim));
  ctx_.stream = opt.compute_stream;
  ctx_.transport->ClearReadyMark();  // nothing an earlier (failed) pass marked applies here
  const int T = static_cast<int>(ctx_.steps().size());
  ctx_.stats.steps.assign(T, StepStats{});
  if (opt.outputs != nullptr) finality_ = FinalRowsByStep(ctx_.plan, ctx_.rank, ctx_.fwd);
  // The pass's own work outside its steps (the backward's D = rowsum(dO * O), zeroed fp32
  // accumulators, the final conversions into the session dtype and the wait for the queued
  // device work) counts as busy: it is the worker's, not the control plane's.
  const double setup_start = Now();
  RETURN_IF_ERROR(groups_.Init());
  RETURN_IF_ERROR(acc_.Begin());
  const double setup_seconds = Now() - setup_start;
  if (T > 0) {
    for (const auto& [u, lead] : groups_.PostedAt(-1)) {  // step 0's, and steps u's with lead u
      RETURN_IF_ERROR(groups_.PrepareEarly(u, lead));
      RETURN_IF_ERROR(groups_.LaunchEarly(u, lead));
    }
    RETURN_IF_ERROR(groups_.PostLate(0));
  }
  for (int t = 0; t < T; ++t) {
    ctx_.cur = &ctx_.stats.steps[t];
    if (opt.cancel != nullptr && opt.cancel->load()) {
      ctx_.transport->Abort();
      return absl::CancelledError(absl::StrCat("cancelled before step ", t));
    }
    RETURN_IF_ERROR(RunStep(t));
  }
  const double finish_start = Now();
  RETURN_IF_ERROR(acc_.Finish());
  const double finish_seconds = Now() - finish_start;
  // GPU transports: a failure after the last Wait() surfaces here (NcclTransport).
  RETURN_IF_ERROR(ctx_.transport->Finish(opt.step_timeout));
  const double sync_start = Now();
  RETURN_IF_ERROR(ctx_.backend->Synchronize(ctx_.stream));
  PassStats& stats = ctx_.stats;
  stats.busy_seconds = setup_seconds + finish_seconds + (Now() - sync_start);
  for (const StepStats& s : stats.steps) {
    stats.busy_seconds += s.busy_seconds;
    stats.idle_seconds += s.idle_seconds;
    stats.bytes_sent += s.bytes_sent;
    stats.bytes_received += s.bytes_received;
    stats.flops += s.flops;
  }
  return stats;
}

}  // namespace

PlanExecutor::PlanExecutor(AttentionBackend* backend, Transport* transport,
                           SessionStorage* storage, ExecutorOptions options)
    : backend_(backend), transport_(transport), storage_(storage), options_(options) {}

absl::StatusOr<PassStats> PlanExecutor::RunForward(const Plan& plan) {
  PassRunner runner(backend_, transport_, storage_, options_, plan, true);
  return runner.Run();
}

absl::StatusOr<PassStats> PlanExecutor::RunBackward(const Plan& plan) {
  PassRunner runner(backend_, transport_, storage_, options_, plan, false);
  return runner.Run();
}

}  // namespace dfa
