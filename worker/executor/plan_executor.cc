#include "worker/executor/plan_executor.h"

namespace dfa {

PlanExecutor::PlanExecutor(AttentionBackend* backend, Transport* transport,
                           SessionStorage* storage, ExecutorOptions options)
    : backend_(backend), transport_(transport), storage_(storage), options_(options) {}

absl::StatusOr<PassStats> PlanExecutor::RunForward(const Plan&) {
  return absl::UnimplementedError("PlanExecutor: forward not implemented yet");
}
absl::StatusOr<PassStats> PlanExecutor::RunBackward(const Plan&) {
  return absl::UnimplementedError("PlanExecutor: backward not implemented yet");
}

}  // namespace dfa
